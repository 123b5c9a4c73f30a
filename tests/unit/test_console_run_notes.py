"""What a finished console action says: checked jobs it did not find, a replay's rate line, a failure's text."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpjobs.console import actions as actions_module
from amqpjobs.console.actions import Actions, not_found_note
from amqpjobs.console.audit import AuditLog
from amqpjobs.errors import BrokerError
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import ReplayReport
from amqpjobs.wire.settings import broker_settings


def test_a_replay_of_one_message_states_no_rate() -> None:
    report = ReplayReport(queue="work.quarantine", replayed=1, left=3, elapsed=0.0)
    assert report.summary(canary=False) == "replayed 1, skipped 0, left 3 in work.quarantine (0.0s)"


def test_a_replay_of_several_messages_states_its_rate() -> None:
    report = ReplayReport(queue="work.quarantine", replayed=21, left=0, elapsed=2.0)
    assert report.summary(canary=False) == "replayed 21, skipped 0, left 0 in work.quarantine (2.0s, 10.0/s)"


def test_checked_jobs_gone_from_the_queue_are_named() -> None:
    chosen = Selection(job_ids=frozenset({"f-331", "f-332", "f-400"}))
    assert not_found_note(chosen, moved=1, queue="work.quarantine") == [
        "2 of the 3 checked job(s) were no longer in work.quarantine (replayed, parked or purged since the page "
        "was shown?): nothing was done to them"
    ]


def test_no_note_when_every_checked_job_was_found_or_nothing_was_checked() -> None:
    assert not_found_note(Selection(job_ids=frozenset({"a", "b"})), moved=2, queue="q") == []
    assert not_found_note(Selection(job_ids=frozenset({"a"})), moved=3, queue="q") == []  # one id, several copies
    assert not_found_note(Selection(), moved=0, queue="q") == []


@pytest.mark.parametrize("error", [RuntimeError, BrokerError])
async def test_a_failed_action_shows_no_password_and_no_control_character(
    tmp_path: Path, error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An action's failure text is shown on its page and written to the audit log: a URL in it is redacted."""
    monkeypatch.setattr(actions_module, "LEFT_TIMEOUT", 0.2)  # what is left is asked of a broker not there
    audit = AuditLog(tmp_path / "audit.jsonl")
    actions = Actions(broker_settings("amqp://guest:guest@127.0.0.1:1/"), audit)  # nothing listens on port 1
    run = actions._new("purge", "work.quarantine", {}, "op", "127.0.0.1")

    async def body() -> str:
        raise error("could not reach amqp://ops:hunter2@node-a:5672/\nerror: forged")

    actions._launch(run, body)
    await asyncio.wait_for(asyncio.gather(*actions._tasks), 10)
    assert run.state == "failed"
    assert "hunter2" not in run.summary
    assert "amqp://ops:***@node-a:5672/" in run.summary
    assert "\n" not in run.summary
    logged = (tmp_path / "audit.jsonl").read_text()
    assert "hunter2" not in logged


async def test_a_failed_action_reads_failed_at_once_and_settled_once_its_left_count_and_audit_are_in(
    tmp_path: Path,
) -> None:
    """helper-230: the JSON read ``running`` for seconds after the failure, while the queue's depth was asked.

    The broker here is silent (a socket that takes connections and never answers): the depth
    read waits out :data:`LEFT_TIMEOUT`; the state says ``failed`` all that while.
    """
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    audit = AuditLog(tmp_path / "audit.jsonl")
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    actions = Actions(broker_settings(url, management_url="http://guest:guest@127.0.0.1:1/"), audit)
    run = actions._new("purge", "work.quarantine", {}, "op", "127.0.0.1")

    async def body() -> str:
        raise BrokerError("the queue went away")

    try:
        actions._launch(run, body)
        await asyncio.sleep(0.3)
        early = run.progress()
        assert (early["state"], early["settled"], early["left"]) == ("failed", False, None), early
        assert early["summary"] == "the queue went away"
        assert not (tmp_path / "audit.jsonl").exists() or not (tmp_path / "audit.jsonl").read_text()
        await asyncio.wait_for(asyncio.gather(*actions._tasks), actions_module.LEFT_TIMEOUT + 5)
    finally:
        silent.close()
    late = run.progress()
    assert (late["state"], late["settled"]) == ("failed", True), late
    assert '"result": "error"' in (tmp_path / "audit.jsonl").read_text()
