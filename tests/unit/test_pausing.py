"""An operator's pause and the worker's own pauses of its sources (holding, suspects turns) never undo each other."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from amqpjobs.errors import UnroutableError
from amqpjobs.runtime.app import App
from amqpjobs.runtime.holding import BrokerObject
from amqpjobs.runtime.worker import Worker
from amqpjobs.topology.models import ExchangeSpec, JobQueueSpec, Topology
from amqpjobs.topology.orphans import orphan_queues
from amqpjobs.wire.flags import PauseFlag, parse_signal
from amqpjobs.wire.settings import broker_settings

pytestmark = pytest.mark.version_independent


class FakeSource:
    """A work queue's consumer that only remembers whether it is paused."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.paused = False
        self.consuming = True

    async def pause(self) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False


def _worker() -> tuple[Worker, FakeSource]:
    topology = Topology(
        exchanges=(ExchangeSpec(name="jobs"),), job_queues=(JobQueueSpec(name="work", exchange="jobs"),)
    )
    worker = Worker(App("t", topology=topology), broker_settings("amqp://127.0.0.1:1/"))
    worker._check()
    source = FakeSource("work")
    worker._consumers = [source]  # type: ignore[list-item]
    worker._pauses._work = {"work": "work"}
    return worker, source


async def _settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


FLAG = PauseFlag("work", "deploy", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))


async def test_a_hold_ending_does_not_resume_an_operator_paused_queue():
    worker, source = _worker()
    worker._pauses._set("work", FLAG)
    await _settled()
    assert source.paused
    assert worker._pauses.holds_back("work")
    await worker._holding._enter("work", {BrokerObject("queue", "work.retry.1s")}, UnroutableError("x"))
    await worker._holding._leave("work")  # the hold's end asks to resume: the operator's pause wins
    assert source.paused
    worker._pauses._set("work", None)
    await _settled()
    assert not source.paused
    assert not worker._pauses.holds_back("work")


async def test_an_operator_resume_does_not_resume_a_queue_a_hold_keeps_stopped():
    worker, source = _worker()
    await worker._holding._enter("work", {BrokerObject("queue", "work.retry.1s")}, UnroutableError("x"))
    assert source.paused
    worker._pauses._set("work", FLAG)
    await _settled()
    worker._pauses._set("work", None)  # resumed by the operator while a delivery is still held
    await _settled()
    assert source.paused
    await worker._holding._leave("work")  # the hold's end resumes it now
    assert not source.paused
    await worker._holding.close()


async def test_signal_channel_down_stops_everything_until_the_flags_are_read_again(monkeypatch):
    worker, source = _worker()
    pauses = worker._pauses
    assert not pauses.holds_back("work")
    pauses._lost()  # the connection dropped: a pause may come unheard
    await _settled()
    assert pauses.holds_back("work")
    assert source.paused  # consumers restored by the reconnect take nothing
    await worker._resume_queue("work")  # nor does a hold's end resume it meanwhile
    assert source.paused

    async def no_flags(*_: object) -> dict[str, PauseFlag]:
        return {}

    monkeypatch.setattr("amqpjobs.runtime.pausing.look_for_flags", no_flags)
    pauses._connection = object()  # type: ignore[assignment]
    await pauses._read()  # not paused after all
    await _settled()
    assert not pauses.holds_back("work")
    assert not source.paused


def test_signals_round_trip_and_junk_is_ignored():
    from amqpjobs.wire.flags import _signal

    assert parse_signal(_signal("work", FLAG)) == ("work", FLAG)
    assert parse_signal(_signal("work", None)) == ("work", None)
    assert parse_signal(b"not json") is None
    assert parse_signal(b'{"paused": true}') is None
    assert PauseFlag.from_arguments("work", FLAG.arguments()) == FLAG


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "yesterday"])
def test_a_pause_flag_whose_since_no_datetime_holds_in_utc_reads_since_unknown(since: str) -> None:
    """A flag queue declared with a time whose UTC is out of range: since unknown (the epoch), not an OverflowError."""
    flag = PauseFlag.from_arguments("work", {**FLAG.arguments(), "amqpjobs-paused-since": since})
    assert (flag.reason, flag.since) == (FLAG.reason, datetime.fromtimestamp(0, UTC))


def test_a_pause_flag_is_no_orphan_and_collides_with_a_job_queue_of_its_name(tmp_path):
    from amqpjobs.errors import TopologyValidationError
    from amqpjobs.topology.loader import load_topology

    layouts = Topology(job_queues=(JobQueueSpec(name="work", exchange="jobs"),)).layouts()
    assert orphan_queues(layouts, ["work", "work.paused"]) == []
    path = tmp_path / "t.toml"
    path.write_text('[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "a"\nexchange = "jobs"\n\n'
                    '[[job_queue]]\nname = "a.paused"\nexchange = "jobs"\n')  # fmt: skip
    with pytest.raises(TopologyValidationError, match=r"a\.paused"):
        load_topology(path)


async def test_a_second_pause_with_a_new_reason_is_logged_by_the_worker(caplog: pytest.LogCaptureFixture):
    worker, source = _worker()
    worker._pauses._set("work", FLAG)
    await _settled()
    again = PauseFlag("work", "provider still down", datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC))
    caplog.clear()
    worker._pauses._set("work", again)
    worker._pauses._set("work", again)  # the same pause read again: nothing new to say
    await _settled()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "job queue work paused again by an operator (reason: provider still down; since 2026-01-02T04:00:00Z)"
    ]
    assert source.paused


async def test_a_flag_read_without_reason_keeps_the_known_one_and_is_not_a_new_pause(
    caplog: pytest.LogCaptureFixture,
):
    worker, _ = _worker()
    worker._pauses._set("work", FLAG)
    caplog.clear()
    worker._pauses._set("work", PauseFlag("work", "", datetime.fromtimestamp(0, UTC)))  # passive declares found it
    assert worker._pauses.flags["work"] == FLAG
    assert caplog.records == []


def test_a_reason_over_500_characters_is_refused_before_the_broker_is_asked():
    """``pause --reason`` of 70,000 characters was cut to 500 without a word (helper-172); now it is refused, the
    broker not asked (this settings' port answers nothing), and 500 are taken."""
    import asyncio

    from amqpjobs.errors import ConfigurationError
    from amqpjobs.runtime.pausing import pause
    from amqpjobs.wire.settings import broker_settings

    nowhere = broker_settings("amqp://guest:guest@127.0.0.1:1/", "http://127.0.0.1:1/")
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(pause(nowhere, "work", "x" * 70_000))
    assert str(caught.value) == (
        "the pause reason is 70000 characters; at most 500 are kept: shorten it (nothing was paused)"
    )
    from amqpjobs.errors import BrokerUnavailableError

    with pytest.raises(BrokerUnavailableError, match="unreachable"):  # 500 pass the check: the broker is asked
        asyncio.run(pause(nowhere, "work", "x" * 500))


@pytest.mark.parametrize(("flags_read", "paused_after"), [("found", True), ("gone", False), ("unreadable", False)])
async def test_a_resume_signal_counts_once_a_read_finds_the_flag_gone(
    monkeypatch: pytest.MonkeyPatch, flags_read: str, paused_after: bool
) -> None:
    """The flag is the truth (another operator may have paused again); the signal is taken when it can't be read."""
    from amqpjobs.errors import BrokerError

    worker, source = _worker()
    pauses = worker._pauses
    pauses._set("work", FLAG)
    await _settled()

    async def read(*_: object) -> dict[str, PauseFlag]:
        if flags_read == "unreadable":
            raise BrokerError("not connected")
        return {"work": FLAG} if flags_read == "found" else {}

    monkeypatch.setattr("amqpjobs.runtime.pausing.look_for_flags", read)
    pauses._connection = object()  # type: ignore[assignment]
    pauses._heard_signal("work", None)
    assert pauses.holds_back("work")  # not before the read
    for _ in range(20):
        await _settled()
    assert pauses.holds_back("work") is paused_after
    assert source.paused is paused_after
