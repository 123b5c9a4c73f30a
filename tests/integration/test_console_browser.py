"""Issue 26: the console in a real browser (Debian's chromium driven by Playwright) on the real broker.

An operator's drill: failing jobs in two code paths land in quarantine; the page shows the
group, the message's evidence; the fix is deployed; the operator replays the group at a rate
with a canary, watches the progress reach done, parks the rest, and the queues say so. A job
whose payload and error carry ``<script>`` opens no dialog and logs nothing in the console.

Without chromium or Playwright the test is skipped, except in CI (``CI=true``), where it
fails. ``AMQPJOBS_SCREENSHOTS=DIR`` (``make screenshots``) saves the overview, a group and a
message as PNGs there.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.jobs.replay_plan import replay_window
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import SCRIPT, Handler, failing_app, quarantine_jobs, serve_console
from tests.integration.helpers import depth
from tests.integration.worker_env import running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: Where the browser is: $AMQPJOBS_CHROMIUM, else Debian's chromium on the PATH.
CHROMIUM_ENV = "AMQPJOBS_CHROMIUM"


@pytest.fixture
def chromium() -> str:
    """The system chromium's path; a skip (a failure in CI) without it or without Playwright."""
    path = os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or shutil.which("chromium-browser")
    reason = ""
    if path is None:
        reason = "chromium not installed (Debian: apt-get install -y chromium, as root; `make browser-deps`)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright not installed (it is in the dev extra: make install)"
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the console's browser test: {reason}")
        pytest.skip(reason)
    assert path is not None
    return path


@pytest.fixture
def console(broker: BrokerSettings, tmp_path: Path) -> Iterator[str]:
    """``amqpjobs console`` as an operator starts it, on 127.0.0.1 and a free port: its base URL."""
    with serve_console(broker, tmp_path) as base:
        yield base


def drill(browser_path: str, base: str, shots: Path | None) -> dict[str, Any]:
    """The operator's clicks (Playwright's sync API: run in a thread of its own). What was seen, and the timing."""
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, Any] = {"dialogs": [], "console": [], "actions": 0}
    expect.set_options(timeout=20_000)  # a loaded CI machine: the assertions wait, the drill's timing is measured
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        watcher = browser.new_page()  # an overview left open: it must follow the drill without a reload
        watcher.goto(base + "/")
        expect(watcher.locator('tr[data-job-queue="work"] td.quarantine')).to_have_text("10")
        page = browser.new_page(viewport={"width": 1400, "height": 900})

        def on_dialog(dialog: Any) -> None:
            seen["dialogs"].append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: seen["console"].append(f"pageerror: {e}"))
        started = time.monotonic()

        def act() -> None:
            seen["actions"] += 1

        page.goto(base + "/")
        act()
        row = page.locator('tr[data-job-queue="work"]')
        expect(row.locator(".health")).to_have_text("UNHEALTHY")
        seen["overview_quarantine"] = row.locator("td.quarantine").inner_text()
        if shots:
            page.screenshot(path=str(shots / "console-overview.png"), full_page=True)
        row.locator("td.quarantine a").click()
        act()
        group = page.locator("tr.group", has_text="ValueError @")
        seen["group_count"] = group.locator("td.count").inner_text()
        group.locator("a.group-link").click()
        act()
        expect(page.locator("#matched")).to_have_text("5")
        if shots:
            page.screenshot(path=str(shots / "console-group.png"), full_page=True)
        page.locator("a.message-link").first.click()
        act()
        seen["evidence_error"] = page.locator("#error").inner_text()
        seen["traceback_has_send"] = "in send" in page.locator("#traceback").inner_text()
        page.go_back()
        act()
        page.fill('input[name="rate"]', "20")
        page.fill('input[name="canary"]', "2")
        before_enter = page.url
        page.press('input[name="rate"]', "Enter")  # implicit submission: must not "Replay all"
        page.wait_for_timeout(500)
        seen["url_after_enter"] = (before_enter, page.url)
        act()
        page.click("#replay-all")
        act()
        expect(page.locator("#state")).to_have_text("done", timeout=60_000)
        seen["bar"] = page.eval_on_selector("#bar", "b => [b.value, b.max]")
        seen["stop_buttons"] = page.locator("#stop").count()
        seen["phase"] = page.locator("#phase").inner_text()
        seen["moved"] = page.locator("#moved").inner_text()
        seen["summary"] = page.locator("#summary").inner_text()
        page.locator("main a").first.click()  # back to the queue
        act()
        page.click("#park-all")
        act()
        expect(page.locator("#state")).to_have_text("done", timeout=60_000)
        seen["parked_summary"] = page.locator("#summary").inner_text()
        seen["drill_seconds"] = time.monotonic() - started
        live = watcher.locator('tr[data-job-queue="work"]')
        expect(live.locator("td.quarantine")).to_have_text("0", timeout=15_000)
        expect(live.locator("td.parked")).to_have_text("5")
        seen["live_health"] = live.locator(".health").inner_text()
        # the escaping check: the parked job whose payload and error carry <script>
        page.goto(base + "/quarantine?queue=work.parked")
        page.locator("a.message-link").first.click()
        seen["script_error_text"] = page.locator("#error").inner_text()
        seen["script_payload_text"] = page.locator("#payload").inner_text()
        if shots:
            page.screenshot(path=str(shots / "console-message.png"), full_page=True)
        page.goto(base + "/audit")
        seen["audit_rows"] = page.locator("tr.entry").count()
        page.wait_for_timeout(300)  # a late script would have run by now
        browser.close()
    return seen


async def test_the_operators_drill_in_a_real_browser(
    broker: BrokerSettings, tmp_path: Path, chromium: str, console: str
):
    handler = Handler()
    app = await failing_app(broker, tmp_path, handler)
    await quarantine_jobs(broker, app, 10)
    handler.broken = False  # the fix for send() is deployed; render() jobs are parked, not replayed
    shots = Path(os.environ["AMQPJOBS_SCREENSHOTS"]) if os.environ.get("AMQPJOBS_SCREENSHOTS") else None
    async with running_worker(app, broker):
        seen = await asyncio.to_thread(drill, chromium, console, shots)
    await app.close()
    assert seen["overview_quarantine"] == "10"
    assert seen["group_count"] == "5"
    assert seen["evidence_error"] == "ValueError: bad address for mail 0"
    assert seen["traceback_has_send"]
    assert seen["phase"] == "rest"  # the canary passed
    assert seen["bar"] == [10, 10]  # full: all 10 looked at (5 moved, 5 skipped), not moved / (moved + left)
    assert seen["stop_buttons"] == 0  # gone once it ended
    assert seen["moved"] == "5"
    assert seen["summary"].startswith("replayed 5, skipped 5, left 5 in work.quarantine (")
    assert sorted(handler.succeeded) == ["m-0", "m-2", "m-4", "m-6", "m-8"]
    parked = "parked 5 message(s) from work.quarantine in work.parked; 0 left in work.quarantine"
    assert seen["parked_summary"] == parked
    assert await depth(broker, "work.quarantine") == 0
    assert await depth(broker, "work.parked") == 5
    assert await depth(broker, "work") == 0
    assert SCRIPT in seen["script_error_text"]  # shown as text ...
    assert SCRIPT in seen["script_payload_text"]
    assert seen["dialogs"] == []  # ... and never run
    assert seen["console"] == []
    assert seen["actions"] <= 10
    assert seen["drill_seconds"] < 120, seen["drill_seconds"]
    assert seen["audit_rows"] == 2
    before_enter, after_enter = seen["url_after_enter"]
    assert after_enter == before_enter  # Enter in the rate box submitted nothing
    assert seen["live_health"] == "healthy"  # the open overview refreshed itself: parked jobs are not unhealthy
    print(f"drill: {seen['actions']} actions, {seen['drill_seconds']:.1f} s")


def watch_outage(browser_path: str, base: str) -> dict[str, str]:
    """An overview left open while its refreshes fail (answered 503, as when the broker is down), then recover."""
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, str] = {}
    expect.set_options(timeout=20_000)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(base + "/")
        live = page.locator("#live")
        seen["before"] = live.inner_text()
        page.route("**/fragments/overview", lambda route: route.fulfill(status=503, body="broker down"))
        expect(live).to_contain_text("unreachable since")
        seen["down"] = live.inner_text()
        seen["down_class"] = page.locator("#overview").get_attribute("class") or ""
        page.unroute("**/fragments/overview")
        expect(live).not_to_contain_text("unreachable")
        seen["after"] = live.inner_text()
        seen["after_class"] = page.locator("#overview").get_attribute("class") or ""
        browser.close()
    return seen


async def test_an_open_overview_says_stale_when_its_refreshes_fail(
    broker: BrokerSettings, tmp_path: Path, chromium: str, console: str
):
    seen = await asyncio.to_thread(watch_outage, chromium, console)
    assert seen["before"].startswith(("live", "polling")), seen
    assert "the figures below are stale" in seen["down"], seen
    assert "stale" in seen["down_class"].split()
    assert seen["after"] == "polling (no outcome events exchange)", seen  # the test's vhost has no events exchange
    assert "stale" not in seen["after_class"].split()


def stop_a_replay(browser_path: str, base: str) -> dict[str, Any]:
    """Replay the whole quarantine at 1 per second, press Stop after the first move: what the page says then."""
    from playwright.sync_api import expect, sync_playwright

    seen: dict[str, Any] = {}
    expect.set_options(timeout=20_000)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(base + "/quarantine?queue=work.quarantine")
        page.fill('input[name="rate"]', "1")
        page.fill('input[name="canary"]', "")
        page.click("#replay-all")
        expect(page.locator("#moved")).not_to_have_text("0")
        page.click("#stop")
        expect(page.locator("#state")).to_have_text("stopped")
        for key in ("moved", "left", "summary"):
            seen[key] = page.locator(f"#{key}").inner_text()
        seen["stop_buttons"] = page.locator("#stop").count()
        browser.close()
    return seen


async def test_stop_a_replay_from_its_page(broker: BrokerSettings, tmp_path: Path, chromium: str, console: str):
    app = await failing_app(broker, tmp_path, Handler())
    await quarantine_jobs(broker, app, 6)
    await app.close()
    seen = await asyncio.to_thread(stop_a_replay, chromium, console)
    moved = int(seen["moved"])
    assert 1 <= moved < 6, seen
    assert int(seen["left"]) == 6 - moved
    assert seen["summary"].startswith(f"stopped by {getpass.getuser()} (local): moved {moved}, skipped 0, "), seen
    assert seen["stop_buttons"] == 0
    assert await depth(broker, "work.quarantine") == 6 - moved
    # a Stop cuts the moves under way short: a job in flight may now be in both places, at most the
    # --rate window of them (README "Console": duplicates, never losses); CI run 13 saw one
    assert moved <= await depth(broker, "work") <= moved + replay_window(1)
