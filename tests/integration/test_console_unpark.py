"""The console's unpark: parked jobs back to quarantine, unrun, with the CLI's safety (``quarantine unpark``).

Before, a parked queue's pages offered replay and purge only: a park that took the wrong jobs
could be undone from a shell alone (``POST /actions/unpark``: 404 ``no action 'unpark'``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import SqliteResults, StateRecord
from amqpjobs.runtime.parking import park
from amqpjobs.runtime.quarantine import mover_lock, session
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import CSRF, Handler, client, failing_app, quarantine_jobs, wait_done
from tests.integration.helpers import depth
from tests.integration.test_job_status import app_module

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def audit_lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


async def test_unpark_from_the_console_moves_parked_jobs_back_with_the_clis_safety(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    app = await failing_app(broker, tmp_path, Handler())
    app.results = SqliteResults(tmp_path / "results.db")
    await quarantine_jobs(broker, app, 6)
    assert (await park(broker, "work.quarantine", results=app.results)).taken == 6
    await app.close()
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'results.db'}", monkeypatch,
                     "@app.job('mail', queue='work')\ndef mail(payload: dict, ctx: object) -> None: ...\n")  # fmt: skip
    base = {"queue": "work.parked", "csrf_token": CSRF}
    with client(broker, tmp_path, app_ref=ref) as c:
        page = await asyncio.to_thread(c.get, "/quarantine", params={"queue": "work.parked"})
        message = await asyncio.to_thread(c.get, "/message", params={"queue": "work.parked", "id": "m-1"})
        quarantine_page = await asyncio.to_thread(c.get, "/quarantine", params={"queue": "work.quarantine"})
        no_token = await asyncio.to_thread(c.post, "/actions/unpark", data={"queue": "work.parked", "scope": "all"})
        no_scope = await asyncio.to_thread(c.post, "/actions/unpark", data=base)
        # the one checked, then a group by filter: both keep the parked queue's order
        one = await asyncio.to_thread(c.post, "/actions/unpark", data={**base, "scope": "selected", "job_id": "m-1"})
        first = await asyncio.to_thread(wait_done, c, one.headers["location"])
        group = await asyncio.to_thread(c.post, "/actions/unpark",
                                        data={**base, "scope": "all", "error_type": "ValueError"})  # fmt: skip
        second = await asyncio.to_thread(wait_done, c, group.headers["location"])
        done_page = await asyncio.to_thread(c.get, group.headers["location"])
        lookup = await asyncio.to_thread(c.get, "/job", params={"id": "m-1"})
        # from a quarantine queue: refused by the CLI's own rule, nothing moved
        wrong = await asyncio.to_thread(c.post, "/actions/unpark", data={**base, "queue": "work.quarantine",
                                                                         "scope": "all"})  # fmt: skip
        refused = await asyncio.to_thread(wait_done, c, wrong.headers["location"])
        # while another mover holds the quarantine queue's lock (unpark moves into it): refused, named
        async with session(broker) as connection, mover_lock(connection, broker, "work.quarantine", "replay"):
            busy = await asyncio.to_thread(c.post, "/actions/unpark", data={**base, "scope": "all"})
            blocked = await asyncio.to_thread(wait_done, c, busy.headers["location"])
    act = page.text[page.text.index('<form id="act"') :]
    assert 'formaction="/actions/unpark" id="unpark-all">Unpark all 6 matching</button>' in act, act
    assert 'id="unpark-selected">Unpark checked</button>' in act
    assert 'id="park-all"' not in act
    assert 'formaction="/actions/unpark" id="unpark-one">Unpark this job</button>' in message.text
    assert 'id="park-one"' not in message.text
    assert "/actions/unpark" not in quarantine_page.text  # a quarantine queue's pages offer park, not unpark
    assert no_token.status_code == 403
    assert no_scope.status_code == 400
    assert "scope: " in no_scope.text
    assert (first["state"], first["moved"], first["target"]) == ("done", 1, "work.quarantine")
    assert first["summary"] == "unparked 1 message(s) from work.parked in work.quarantine; 5 left in work.parked"
    assert (second["state"], second["moved"], second["left"]) == ("done", 3, 2)
    assert "unparked 3 message(s) from work.parked in work.quarantine; 2 left in work.parked" in done_page.text
    assert "job m-1: quarantined" in lookup.text  # recorded in the app's results store, as unpark --app does
    assert refused["state"] == "failed"
    assert refused["summary"].startswith("'work.quarantine' is a quarantine queue: unpark takes from a parked queue")
    assert blocked["state"] == "failed"
    assert blocked["summary"].startswith("quarantine queue 'work.quarantine' is busy: replay (pid "), blocked
    assert await depth(broker, "work.parked") == 2
    assert await depth(broker, "work.quarantine") == 4
    entries = audit_lines(tmp_path)
    assert [(e["action"], e["result"], sorted(e["job_ids"])) for e in entries] == [
        ("unpark", "ok", ["m-1"]),
        ("unpark", "ok", ["m-0", "m-2", "m-4"]),
        ("unpark", "error", []),
        ("unpark", "error", []),
    ]
    assert re.search(r"m-1", entries[0]["summary"]) is None  # the summary counts, the job ids are their own field


async def test_the_job_lookup_reads_the_id_as_given_as_job_show_does(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An id with spaces around it is a job id ``enqueue`` takes and ``job show`` finds. Before, the console's
    lookup stripped it and showed another job's record (``job pad: succeeded`` for `` pad ``)."""
    await (await failing_app(broker, tmp_path, Handler())).close()  # the topology applied
    store = SqliteResults(tmp_path / "results.db")
    await store.write([StateRecord("pad", "mail", "succeeded", 1, time.time(), value='"other"'),
                       StateRecord(" pad ", "mail", "quarantined", 1, time.time(), detail="rejected",
                                   where="work.quarantine")])  # fmt: skip
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'results.db'}", monkeypatch)
    with client(broker, tmp_path, app_ref=ref) as c:
        padded = await asyncio.to_thread(c.get, "/job", params={"id": " pad "})
        blank = await asyncio.to_thread(c.get, "/job", params={"id": "   "})
    assert padded.status_code == 200
    assert "job  pad : quarantined" in padded.text, padded.text
    assert "job pad: succeeded" not in padded.text
    assert blank.status_code == 400
    assert "job_id is empty or blank" in blank.text
