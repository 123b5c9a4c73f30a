"""A decision that can't be kept because a resource alarm holds its marked copy (a dedicated 3.10 node).

At the grace's end the marked copy is the publishing connection's first publish of the alarm: the
broker holds it unread (no confirm within the 0.5 s bound) and would store it once the alarm clears.
The worker can't know it will, so it does not ack (acking would lose the job should the node stop
first); it resets its publishing connection instead, so that the broker drops the marked copy: one
outcome, the redelivery, run again by the next worker (before: the marked copy AND the redelivery were
in the queue once the alarm cleared, the decision carried out beside a second run). The ERROR says so.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain
from tests.integration.test_backpressure import AlarmNode, alarm_node, on_alarm_node  # noqa: F401 (fixtures)
from tests.integration.test_kept_decisions import DECIDED, delete
from tests.integration.test_stop_lines import started_worker, stop_lines, until
from tests.integration.worker_env import Recorder

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]


@pytest.mark.serial  # alarms the dedicated node
@pytest.mark.timeout(120)
async def test_a_marked_copy_an_alarm_holds_is_dropped_by_a_reset_so_the_job_has_one_outcome(
    alarm_node: AlarmNode,  # noqa: F811
    on_alarm_node: BrokerSettings,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, on_alarm_node)
    app = App("alarmed", topology=load_topology(path).topology, url=on_alarm_node.url)
    runs: list[bool] = []

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.redelivered)
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, on_alarm_node, ("work",), concurrency=1, grace=1)
    try:
        delete(on_alarm_node, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        alarm_node.memory_alarm(True)
        caplog.clear()
        worker.request_stop()
        stopping = asyncio.ensure_future(worker.shutdown())
        await until(lambda: any("could not be kept past the stop" in line for line in lines(caplog)), 15, "the end")
        await asyncio.sleep(0.5)  # the reset is on its way before the alarm clears
        began = time.monotonic()
    finally:
        alarm_node.memory_alarm(False)  # a blocked connection can't even close
    assert await stopping == 1
    [said] = [line for line in lines(caplog) if "could not be kept past the stop" in line]
    assert "(no confirm within 0.5s: a resource alarm (memory) holds the marked copy unread; the publishing " in said
    assert "connection was reset, so the broker drops it" in said
    assert stop_lines(caplog)[1:] == [
        "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace period; "
        "it returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue (redelivered: its outcome not kept, run again); exit 1",
    ]
    await asyncio.sleep(1.0)  # a held publish would be read once the alarm clears
    waiting = await depth(on_alarm_node, "work")
    print(f"after the alarm cleared ({time.monotonic() - began:.1f}s): {waiting} message(s) in work")
    assert waiting == 1  # the redelivery alone, no marked copy beside it (before: 2)
    await apply_topology(path, on_alarm_node)  # the quarantine exchange back: the next worker runs it again
    recorder = Recorder()
    later = Worker(app, on_alarm_node, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: any(o.kind == "quarantined" for o in outs), 30)
        await asyncio.sleep(1.0)  # a marked copy behind it would be carried out meanwhile
    finally:
        await later.shutdown()
        await app.close()
    assert runs == [False, True]  # the run before the stop, and the rerun of the redelivery: never a third outcome
    assert [o.kind for o in recorder.outcomes if o.kind != "redelivered"] == ["quarantined"]  # before: 2
    assert not [o for o in recorder.outcomes if o.decided]  # no decision carried out beside the rerun
    assert await depth(on_alarm_node, "work") == 0
    quarantined = await drain(on_alarm_node, "work.quarantine")
    assert [(m.message_id, DECIDED in m.headers) for m in quarantined] == [("rej-1", False)]  # once, not twice


@pytest.mark.serial  # alarms the dedicated node
@pytest.mark.timeout(120)
async def test_a_copy_an_alarm_holds_at_the_stop_is_dropped_so_its_redelivery_is_the_one_outcome(
    alarm_node: AlarmNode,  # noqa: F811
    on_alarm_node: BrokerSettings,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's quarantine copy waits for its confirm under an alarm (no hold: every object exists) when the
    grace ends: the delivery goes back, and the copy held unread must not be stored beside it once the alarm clears
    (before: the quarantine copy and the redelivery, 1 + 1)."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, on_alarm_node)
    app = App("alarmed", topology=load_topology(path).topology, url=on_alarm_node.url)
    go = asyncio.Event()

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        await go.wait()
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, on_alarm_node, ("work",), concurrency=1, grace=1)
    await app.enqueue("rej", {}, job_id="rej-1")
    await until(lambda: len(worker._inflight) == 1, 10, "the job to run")
    try:
        alarm_node.memory_alarm(True)
        go.set()
        await asyncio.sleep(1.0)  # its quarantine copy is sent, held unread
        assert await depth(on_alarm_node, "work.quarantine") == 0
        worker.request_stop()
        stopping = asyncio.ensure_future(worker.shutdown())
        await until(lambda: any("grace period" in line for line in lines(caplog)), 15, "the grace's end")
        await asyncio.sleep(1.0)
    finally:
        alarm_node.memory_alarm(False)
    assert await stopping == 1
    await app.close()
    await asyncio.sleep(1.0)  # a held publish would be read once the alarm clears
    found = (await depth(on_alarm_node, "work"), await depth(on_alarm_node, "work.quarantine"))
    print(f"after the alarm cleared: work, work.quarantine = {found}")
    assert found == (1, 0)  # the redelivery alone: the copy the alarm held was dropped, not stored beside it


@pytest.mark.serial  # alarms the dedicated node
@pytest.mark.timeout(120)
async def test_two_marked_copies_an_alarm_holds_are_both_dropped_and_each_error_says_so(
    alarm_node: AlarmNode,  # noqa: F811
    on_alarm_node: BrokerSettings,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two held deliveries (a quarantine, a retry) kept at one stop: the first reset drops both marked copies; the
    second ERROR says it was reset (before: `its connection can't be reset: the broker stores it`, untrue)."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, on_alarm_node)
    app = App("alarmed", topology=load_topology(path).topology, url=on_alarm_node.url)

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["n"] == 1:
            raise Reject("no")
        raise RuntimeError("retried")

    caplog.set_level("INFO", logger="amqpjobs.worker")

    def said() -> list[str]:
        return [line for line in lines(caplog) if "could not be kept past the stop" in line]

    worker = await started_worker(app, on_alarm_node, ("work",), concurrency=2, grace=1)
    try:
        delete(on_alarm_node, "exchanges", "work.quarantine")
        delete(on_alarm_node, "queues", app.topology().layout("work").tier_queues["work"][0])
        await app.enqueue("rej", {"n": 1}, job_id="rej-1")
        await app.enqueue("rej", {"n": 2}, job_id="rej-2")
        await until(lambda: worker._holding.count == 2, 10, "both deliveries to be held")
        alarm_node.memory_alarm(True)
        caplog.clear()
        worker.request_stop()
        stopping = asyncio.ensure_future(worker.shutdown())
        await until(lambda: len(said()) == 2, 15, "both ERRORs")
        await asyncio.sleep(0.5)
    finally:
        alarm_node.memory_alarm(False)
    assert await stopping == 1
    await app.close()
    assert [
        "holds the marked copy unread; the publishing connection was reset, so the broker drops it" in line
        for line in said()
    ] == [True, True]
    await asyncio.sleep(1.0)  # a held publish would be read once the alarm clears
    back = await drain(on_alarm_node, "work")
    assert sorted((m.message_id, m.redelivered, DECIDED in m.headers) for m in back) == [
        ("rej-1", True, False),
        ("rej-2", True, False),
    ]


@pytest.mark.serial  # alarms the dedicated node
@pytest.mark.timeout(120)
async def test_a_held_copy_an_alarm_holds_in_flight_at_the_grace_end_gets_no_marked_copy_beside_it(
    alarm_node: AlarmNode,  # noqa: F811
    on_alarm_node: BrokerSettings,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The quarantine exchange is back, and the hold's round publishes the copy into an alarm: held unread, the
    connection blocked, when the grace ends. No marked copy goes beside it, and the reset drops it: one outcome, the
    redelivery (before: the held copy and a marked copy, each stored once the alarm cleared, beside the redelivery)."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, on_alarm_node)
    app = App("alarmed", topology=load_topology(path).topology, url=on_alarm_node.url)

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, on_alarm_node, ("work",), concurrency=1, grace=1)
    publishing = worker._publishing
    assert publishing is not None
    try:
        delete(on_alarm_node, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        await apply_topology(path, on_alarm_node)
        alarm_node.memory_alarm(True)
        await until(lambda: blocked_by(publishing) is not None, 15, "the hold's round publish to be held unread")
        caplog.clear()
        worker.request_stop()
        stopping = asyncio.ensure_future(worker.shutdown())
        await until(lambda: any("grace period" in line for line in lines(caplog)), 15, "the grace's end")
        await asyncio.sleep(0.5)
    finally:
        alarm_node.memory_alarm(False)
    assert await stopping == 1
    await app.close()
    [said] = [line for line in lines(caplog) if "could not be kept past the stop" in line]
    assert (
        "(its copy, published by its hold, was not confirmed within 0.4s of the grace's end: a resource alarm "
        "(memory) holds that copy unread; the publishing connection was reset, so the broker drops it" in said
    )
    await asyncio.sleep(1.0)  # a held publish would be read once the alarm clears
    back = await drain(on_alarm_node, "work")
    assert [(m.message_id, m.redelivered, DECIDED in m.headers) for m in back] == [("rej-1", True, False)]
    assert await depth(on_alarm_node, "work.quarantine") == 0
