"""Issue 26 review: the console's actions end as they should: Stop, progress figures, audit job ids.

A replay started on the page is stopped from its page the way Ctrl-C stops ``amqpjobs replay``
(its task is cancelled: the moves under way settle, the held messages return); the progress
shows what was looked at of what was there, and an action that failed says what is left in
the queue, read from the broker.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.runtime.quarantine import mover_lock, session
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import BASE, CSRF, Handler, client, quarantine_six, wait_done
from tests.integration.helpers import depth, depth_at_least, drain, wait_until_async

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture
def quarantined(broker: BrokerSettings, tmp_path: Path) -> Handler:
    """6 real failures in work.quarantine (:func:`~tests.integration.console_env.quarantine_six`)."""
    return quarantine_six(broker, tmp_path)


def audit_lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_a_running_replay_is_stopped_from_its_page(broker: BrokerSettings, tmp_path: Path, quarantined):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "1", "canary": ""}
    with client(broker, tmp_path) as c:
        started = c.post("/actions/replay", data=form)
        assert started.status_code == 303, started.text
        run = started.headers["location"].replace(BASE, "")
        for _ in range(200):  # 1 per second: the first move is at once, the next a second later
            running = c.get(run + ".json").json()
            if running["moved"] >= 1:
                break
            asyncio.run(asyncio.sleep(0.02))
        page = c.get(run)
        stop_form = re.search(r'<form[^>]*action="([^"]*)"[^>]*id="stop-form"', page.text)
        assert stop_form is not None, page.text
        assert f'name="csrf_token" value="{CSRF}"' in page.text
        stopped = c.post(stop_form.group(1), data={"csrf_token": CSRF})
        progress = wait_done(c, run)
        again = c.post(stop_form.group(1), data={"csrf_token": CSRF})
        ended_page = c.get(run)
    assert running["state"] == "running"
    assert stopped.status_code == 303
    assert stopped.headers["location"].replace(BASE, "").endswith(run)
    assert progress["state"] == "stopped", progress
    moved = progress["moved"]
    assert 1 <= moved < 6
    assert progress["left"] == 6 - moved
    assert progress["summary"].startswith(f"stopped by {progress['stopped_by']}: moved {moved}, "), progress
    assert asyncio.run(depth(broker, "work.quarantine")) == 6 - moved  # the held messages are back
    assert asyncio.run(depth(broker, "work")) == moved
    assert again.status_code == 409
    assert "already ended" in again.text
    assert 'id="stop-form"' not in ended_page.text
    (entry,) = audit_lines(tmp_path)
    assert (entry["action"], entry["result"]) == ("replay", "stopped")
    assert len(entry["job_ids"]) == moved


def test_a_finished_replay_of_a_group_shows_what_was_looked_at(broker: BrokerSettings, tmp_path: Path, quarantined):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "50", "canary": "",
            "error_type": "ValueError"}  # fmt: skip
    with client(broker, tmp_path) as c:
        started = c.post("/actions/replay", data=form)
        run = started.headers["location"].replace(BASE, "")
        progress = wait_done(c, run)
        page = c.get(run)
    assert progress["state"] == "done", progress
    assert (progress["moved"], progress["skipped"], progress["left"]) == (3, 3, 3)
    assert (progress["looked"], progress["total"]) == (6, 6)  # the bar is full: every message was looked at
    assert '<progress id="bar" max="6" value="6">' in page.text
    assert 'id="stop-form"' not in page.text
    asked = page.text.split("<h2>Asked</h2>", 1)[1]
    assert "<tr><th>canary</th><td>no canary</td></tr>" in asked  # the canary field left empty
    assert "None" not in asked


def test_park_and_purge_audit_the_job_ids_they_took(broker: BrokerSettings, tmp_path: Path, quarantined):
    base = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF}
    with client(broker, tmp_path) as c:
        parked = c.post("/actions/park", data={**base, "error_type": "ValueError"})
        park = wait_done(c, parked.headers["location"].replace(BASE, ""))
        some = c.post("/actions/purge", data={**base, "confirm": "work.quarantine", "search": "m-3"})
        purge_some = wait_done(c, some.headers["location"].replace(BASE, ""))
        every = c.post("/actions/purge", data={**base, "confirm": "work.quarantine"})
        purge_all = wait_done(c, every.headers["location"].replace(BASE, ""))
    assert [p["state"] for p in (park, purge_some, purge_all)] == ["done", "done", "done"]
    assert (park["moved"], park["left"], purge_some["moved"], purge_all["moved"], purge_all["left"]) == (3, 3, 1, 2, 0)
    entries = audit_lines(tmp_path)
    assert [(e["action"], sorted(e["job_ids"])) for e in entries] == [
        ("park", ["m-0", "m-2", "m-4"]),
        ("purge", ["m-3"]),
        ("purge", ["m-1", "m-5"]),
    ]
    assert asyncio.run(depth(broker, "work.quarantine")) == 0


def test_a_failed_park_says_what_is_left_in_the_queue(broker: BrokerSettings, tmp_path: Path, quarantined):
    async def held() -> dict[str, Any]:
        async with session(broker) as connection, mover_lock(connection, broker, "work.quarantine", "replay"):
            with client(broker, tmp_path) as c:
                started = await asyncio.to_thread(
                    c.post, "/actions/park", data={"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF}
                )
                return await asyncio.to_thread(wait_done, c, started.headers["location"].replace(BASE, ""))

    progress = asyncio.run(held())
    assert progress["state"] == "failed", progress
    assert (progress["moved"], progress["left"]) == (0, 6)  # read from the broker, not the 0 of a run never begun


@pytest.mark.parametrize("rate", ["nan", "NaN", "inf", "-Infinity", "1e999", "0", "-5"])
def test_a_rate_that_is_not_a_positive_finite_number_is_refused(broker, tmp_path: Path, quarantined, rate: str):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": rate, "canary": ""}
    with client(broker, tmp_path) as c:
        answer = c.post("/actions/replay", data=form)
    assert answer.status_code == 400, answer.text
    assert "rate: give a positive, finite number of messages per second" in answer.text
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
    assert (tmp_path / "audit.jsonl").read_text() == ""  # nothing started, nothing audited


FORM_ERRORS = [
    pytest.param("replay", {"canary": "abc"}, "canary: give a whole number of jobs, at least 1, or leave it empty "
                 "(got &#39;abc&#39;)", 'name="canary" value="abc"', id="canary-not-a-number"),
    pytest.param("replay", {"canary": "0"}, "canary: give a whole number of jobs, at least 1, or leave it empty "
                 "(got &#39;0&#39;)", 'name="canary" value="0"', id="canary-zero"),
    pytest.param("replay", {"canary_timeout": "soon"}, "canary_timeout: give a duration such as 30s, 2m or 1m30s "
                 "(got &#39;soon&#39;)", 'name="canary_timeout" value="soon"', id="timeout-not-a-duration"),
    pytest.param("replay", {"scope": "selected"}, "job_id: no message checked: check some, or use the "
                 "&#39;all matching&#39; button", 'name="rate" value="20"', id="none-checked"),
    pytest.param("park", {"scope": "everything"}, "scope: give all (every message matching the filter) or "
                 "selected (the checked ones) (got &#39;everything&#39;)", 'name="rate" value="20"', id="bad-scope"),
    pytest.param("replay", {"rate": "1e308"}, "rate: at most 10000 messages per second (got &#39;1e308&#39;)",
                 'name="rate" value="1e308"', id="rate-too-high"),
    pytest.param("replay", {"canary": "100000000000000000000000"}, "canary: at most 10000 jobs "
                 "(got &#39;100000000000000000000000&#39;)", 'name="canary" value="100000000000000000000000"',
                 id="canary-too-many"),
    # more digits than Python's int() takes (4300): refused as too many, not a 500 from int()'s ValueError
    pytest.param("replay", {"canary": "9" * 4301}, f"canary: at most 10000 jobs (got &#39;{'9' * 4301}&#39;)",
                 f'name="canary" value="{"9" * 4301}"', id="canary-past-int-digits"),
    pytest.param("replay", {"canary_timeout": "100000000000000000000h"}, "canary_timeout: at most 1h "
                 "(got &#39;100000000000000000000h&#39;)",
                 'name="canary_timeout" value="100000000000000000000h"', id="timeout-too-long"),
    pytest.param("purge", {"confirm": "work"}, "confirm: type the queue&#39;s name, work.quarantine, to purge it "
                 "(got &#39;work&#39;)", 'name="confirm" value="work"', id="purge-not-confirmed"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "bad", "message", "kept"), FORM_ERRORS)
def test_a_bad_form_value_is_named_with_its_fix_and_the_form_keeps_its_values(
    broker: BrokerSettings, tmp_path: Path, quarantined, kind: str, bad: dict[str, str], message: str, kept: str
):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "20", "canary": "2",
            "canary_timeout": "45s", "error_type": "ValueError", **bad}  # fmt: skip
    with client(broker, tmp_path) as c:
        answer = c.post(f"/actions/{kind}", data=form)
    assert answer.status_code == 400, answer.text
    error = re.search(r'<p class="error" id="form-error">(.*?)</p>', answer.text, re.S)
    assert error is not None, answer.text
    assert error.group(1) == message
    assert "invalid literal" not in answer.text
    assert "Traceback" not in answer.text
    assert kept in answer.text  # the form is shown again with what was typed
    assert 'name="rate" value=' in answer.text
    assert 'min="0.001"' in answer.text  # the rate field's floor is the server's (helper-230: it was 0.1)
    assert '<input type="hidden" name="error_type" value="ValueError">' in answer.text  # the filter too
    assert '<span id="matched">3</span>' in answer.text
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
    assert (tmp_path / "audit.jsonl").read_text() == ""


def publish_bare(broker: BrokerSettings, queue: str, body: str) -> None:
    """Publish ``body`` to ``queue`` through the management API, which fills in no property (aiormq sets a
    message_id on every publish)."""
    doc = {"properties": {}, "routing_key": queue, "payload": body, "payload_encoding": "string"}
    with ManagementClient(broker) as mgmt:
        answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/amq.default/publish", json=doc)
    assert answer == {"routed": True}


def test_messages_without_a_job_id_are_addressed_by_their_content_hash(broker, tmp_path: Path, quarantined):
    for body in ("first stray", "second stray"):  # as from the management UI: no message_id, no header
        publish_bare(broker, "work.quarantine", body)
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        keys = re.findall(r'href="/message\?queue=work.quarantine&amp;id=(sha256%3A\w+)"', page.text)
        boxes = re.findall(r'name="job_id" value="(sha256:\w+)"', page.text)
        assert len(keys) == len(boxes) == 2, page.text
        first, second = boxes
        one = c.get("/message", params={"queue": "work.quarantine", "id": first})
        again = c.get("/quarantine", params={"queue": "work.quarantine"})  # the same message, the same key
        form = {"queue": "work.quarantine", "scope": "selected", "csrf_token": CSRF}
        purged = c.post("/actions/purge", data={**form, "job_id": first, "confirm": "work.quarantine"})
        purge = wait_done(c, purged.headers["location"].replace(BASE, ""))
        parked = c.post("/actions/park", data={**form, "job_id": second})
        park = wait_done(c, parked.headers["location"].replace(BASE, ""))
    assert one.status_code == 200
    assert '<pre class="payload" id="payload">first stray</pre>' in one.text
    assert re.findall(r'name="job_id" value="(sha256:\w+)"', again.text) == [first, second]
    assert (purge["state"], purge["moved"], park["state"], park["moved"]) == ("done", 1, "done", 1)
    assert asyncio.run(depth(broker, "work.quarantine")) == 6  # the six jobs with ids were not touched
    assert asyncio.run(depth(broker, "work.parked")) == 1
    assert [e["job_ids"] for e in audit_lines(tmp_path)] == [[first], [second]]


@pytest.mark.parametrize(("kind", "missing"), [("replay", "scope"), ("park", "scope"), ("purge", "scope"),
                                                ("replay", "rate")])  # fmt: skip
def test_a_missing_required_field_is_named_not_defaulted(broker, tmp_path: Path, quarantined, kind: str, missing: str):
    """No scope is not "the whole queue" (an Enter in a field must not act on everything); no rate is not 10/s."""
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "20", "canary": "",
            "confirm": "work.quarantine", "error_type": "ValueError"}  # fmt: skip
    del form[missing]
    with client(broker, tmp_path) as c:
        answer = c.post(f"/actions/{kind}", data=form)
    assert answer.status_code == 400, answer.text
    error = re.search(r'<p class="error" id="form-error">(.*?)</p>', answer.text, re.S)
    assert error is not None, answer.text
    assert error.group(1).startswith(f"{missing}: "), error.group(1)
    assert '<input type="hidden" name="error_type" value="ValueError">' in answer.text  # the form kept
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
    assert (tmp_path / "audit.jsonl").read_text() == ""


def test_enter_in_a_field_of_the_action_form_submits_nothing(broker, tmp_path: Path, quarantined):
    """The form's default button (the first submit button, HTML "implicit submission") is disabled: Enter is a no-op."""
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"}).text
    act = page[page.index('<form id="act"') : page.index("</form>", page.index('<form id="act"'))]
    first = re.search(r"<button[^>]*>", act)
    assert first is not None
    assert 'type="submit"' in first.group(0)
    assert " disabled" in first.group(0), first.group(0)
    assert "name=" not in first.group(0)


def test_a_replay_cut_off_by_a_deleted_quarantine_queue_names_every_job_it_moved(
    broker: BrokerSettings, tmp_path: Path, quarantined
):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "2", "canary": ""}
    with client(broker, tmp_path) as c:
        started = c.post("/actions/replay", data=form)
        assert started.status_code == 303, started.text
        # at 2 per second, once the replay is under way (its start is the load's: no fixed 1.6 s): 3 moved, the
        # 4th maybe not yet acked
        asyncio.run(wait_until_async(lambda: depth_at_least(broker, "work", 3), 30, "3 moves"))
        with ManagementClient(broker) as mgmt:
            mgmt.request("DELETE", f"/queues/{quote(broker.vhost, safe='')}/work.quarantine")
        progress = wait_done(c, started.headers["location"].replace(BASE, ""))
    arrived = sorted(m.message_id or "" for m in asyncio.run(drain(broker, "work")))
    assert progress["state"] == "failed", progress
    assert progress["moved"] == len(arrived) >= 3, (progress, arrived)
    assert f"interrupted after {len(arrived)} moved" in progress["summary"]
    (entry,) = audit_lines(tmp_path)
    assert (entry["result"], sorted(entry["job_ids"])) == ("error", arrived)
