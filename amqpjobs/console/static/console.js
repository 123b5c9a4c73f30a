// amqpjobs console: live refresh and action progress. No framework, no build step, no CDN.
// Everything from the server is either our own escaped HTML fragment (innerHTML of the overview table)
// or JSON set with textContent: no text of a job ever becomes markup here.
"use strict";

function setLive(text) {
  const live = document.getElementById("live");
  if (live) live.textContent = text;
}

// A failed refresh keeps the last table but says since when it is stale (the page retries).
function refreshOverview(box) {
  fetch(box.dataset.refresh, {credentials: "same-origin"})
    .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
    .then((html) => {
      box.innerHTML = html;
      box.classList.remove("stale");
      delete box.dataset.downSince;
      setLive(box.dataset.mode || "live");
    })
    .catch((status) => {
      if (!box.dataset.downSince) box.dataset.downSince = new Date().toLocaleTimeString();
      box.classList.add("stale");
      const why = status === 503 ? "broker or management API down" : "console not answering";
      setLive(`unreachable since ${box.dataset.downSince} (${why}): the figures below are stale`);
    });
}

function followOverview() {
  const box = document.getElementById("overview");
  if (!box) return;
  let pending = null;
  const soon = () => { if (!pending) pending = setTimeout(() => { pending = null; refreshOverview(box); }, 300); };
  setInterval(() => refreshOverview(box), 5000);  // the broker's figures (rates, consumers) change without events
  if (window.EventSource) {
    const mode = (text) => { box.dataset.mode = text; if (!box.dataset.downSince) setLive(text); };
    const events = new EventSource((document.body.dataset.root || "") + "/events");  // under --root-path too
    events.onmessage = soon;  // a job ended somewhere: counts changed
    events.addEventListener("unavailable", () => { mode("polling (no outcome events exchange)"); events.close(); });
    events.onerror = () => mode("polling");
  }
}

function followAction() {
  const box = document.getElementById("progress");
  if (!box) return;
  const set = (id, value) => { const el = document.getElementById(id); if (el && value !== undefined && value !== null) el.textContent = String(value); };
  const poll = () => {
    fetch(box.dataset.poll, {credentials: "same-origin"})
      .then((r) => r.json())
      .then((p) => {
        const known = (n) => (n === null || n === undefined ? "?" : n);  // a figure not read is "?", never 0
        set("state", p.state); set("moved", p.moved); set("left", known(p.left)); set("skipped", p.skipped);
        set("looked", p.looked); set("total", known(p.total));
        set("phase", p.phase || (p.state === "running" ? "starting" : "")); set("summary", p.summary);
        const state = document.getElementById("state");
        if (state) state.className = "state-" + p.state.replace(/ /g, "-");
        const bar = document.getElementById("bar");
        if (bar && p.bar) { bar.max = p.bar[1]; bar.value = p.bar[0]; }  // the server's: full once done
        const stop = document.getElementById("stop-form");
        if (stop && p.state !== "running") stop.remove();
        const details = document.getElementById("details");
        if (details && p.details) {
          details.replaceChildren(...p.details.map((d) => { const li = document.createElement("li"); li.textContent = d; return li; }));
        }
        if (p.state === "running" || !p.settled) setTimeout(poll, 250);
      })
      .catch(() => setTimeout(poll, 1000));
  };
  poll();
}

document.addEventListener("DOMContentLoaded", () => { followOverview(); followAction(); });
