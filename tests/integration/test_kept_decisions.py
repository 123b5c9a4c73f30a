"""A held delivery whose handler ran keeps its decision past a stop (review held11 step 2; real broker).

The handler ran and decided (a quarantine, a retry), but the copy could not go (its queue or
exchange deleted): the delivery was held. At the stop's grace end the worker publishes the
decided copy into the delivery's own work queue, marked ``amqpjobs-decided``, and acks the
original; the next worker carries the decision out without running the handler again. A
header we did not write (a publisher's forgery) never sends a copy anywhere else: it is
quarantined with evidence, its handler not run. Replay, park and unpark drop the header.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs import App, JobContext, Reject, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, drain, raw_channel
from tests.integration.test_stop_lines import SHARDED, started_worker, stop_lines, until
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker

DECIDED = "amqpjobs-decided"


def text(value: Any) -> str:
    """A header's value as text (aio-pika gives a long string as str or bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def delete(broker: BrokerSettings, kind: str, name: str) -> None:
    with ManagementClient(broker) as mgmt:
        mgmt.request("DELETE", f"/{kind}/{quote(broker.vhost, safe='')}/{quote(name, safe='')}")


async def stopped_while_held(
    app: App, broker: BrokerSettings, queue: str, tenant: str | None = None, deleted: tuple[str, str] | None = None
) -> None:
    """Enqueue job 'rej' (id ``rej-1``) to ``queue`` and run a worker (grace 1 s) until its decided copy's delivery is
    held, the ``deleted`` object (kind, name; default ``queue``'s quarantine exchange) gone; then stop it (exit 1)."""
    kind, name = deleted or ("exchanges", f"{queue}.quarantine")
    worker = await started_worker(app, broker, (queue,), concurrency=1, grace=1)
    try:
        delete(broker, kind, name)
        await app.enqueue("rej", {}, job_id="rej-1", tenant=tenant)
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1


async def quarantined_by_the_next_worker(app: App, broker: BrokerSettings, path: Path, queue: str) -> Any:
    """Apply the topology at ``path`` again, run a worker of ``queue`` until its one outcome is ``quarantined``,
    close the app; the one quarantine copy of ``queue`` (its reason ``rejected``, no decided header left)."""
    await apply_topology(path, broker)
    recorder = Recorder()
    later = Worker(app, broker, WorkerOptions(queues=(queue,), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: [o.kind for o in outs] == ["quarantined"], 30)
    finally:
        await later.shutdown()
        await app.close()
    [copy] = await drain(broker, f"{queue}.quarantine")
    assert (text(copy.headers["amqpjobs-reason"]), DECIDED in copy.headers) == ("rejected", False)
    return copy


@pytest.mark.timeout(90)
async def test_a_held_retry_whose_handler_ran_is_not_run_again_after_the_restart(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Attempt 1 fails; its tier queue was deleted, so the retry copy is held until the grace's end. After
    ``topology apply`` and a restart the retry is carried out (tier 1, then attempt 2), attempt 1 never again."""
    app = await make_app(broker, tmp_path)
    tier = app.topology().layout("work").tier_queues["work"][0]
    runs: list[tuple[int, bool]] = []

    @app.job("flaky", queue="work")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, ctx.redelivered))
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete(broker, "queues", tier)
        await app.enqueue("flaky", {}, job_id="flaky-1")
        await until(lambda: worker._holding.count == 1, 10, "the retry copy's delivery to be held")
        caplog.clear()
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
    assert stop_lines(caplog) == [
        "draining: no job in flight; 1 held delivery (ran; its outcome 'retry' waits for " + tier + ") waits up to "
        "the grace of 1s",
        "1 held delivery (ran; its outcome 'retry' waits for " + tier + ") still held after the grace period; it "
        "returns to its queue with its outcome kept (not run again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue with its outcome kept (not run again); exit 1",
    ]
    async with raw_channel(broker) as ch:
        queue = await ch.get_queue("work", ensure=False)
        kept = await queue.get(no_ack=False)
        assert (kept.message_id, kept.redelivered, text(kept.headers[DECIDED]), kept.headers["amqpjobs-attempt"]) == (
            "flaky-1", False, "retry:1", 2)  # fmt: skip
        await kept.nack(requeue=True)
    await apply_topology(tmp_path / "applied.toml", broker)
    caplog.clear()
    recorder = Recorder()
    later = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: any(o.kind == "succeeded" for o in outs), 30)
    finally:
        await later.shutdown()
        await app.close()
    assert runs == [(1, False), (2, False)]  # attempt 1 ran once; its decided retry carried out, then attempt 2
    assert [(o.kind, o.attempt, o.decided) for o in recorder.outcomes] == [
        ("retried", 1, True),
        ("succeeded", 2, False),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    assert (
        "job=flaky id=flaky-1 attempt=1 duration=0.000s outcome=retried next_attempt=2 delay=0.2s decided=earlier-run"
        in lines
    )
    assert not [line for line in lines if "ended without an outcome" in line]
    assert await depth(broker, "work") == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("forged", "why"),
    [
        ("retry:7", "names retry tier 7, but work has 3 (1 to 3)"),
        ("retry:0", "names retry tier 0, but work has 3 (1 to 3)"),
        ("launch", "is no decision this worker carries out (quarantine or retry:<tier>)"),
        ("quarantine", "says quarantine, but the message has no amqpjobs-reason evidence"),
        ("work.retry.200ms", "is no decision this worker carries out (quarantine or retry:<tier>)"),
    ],
)
async def test_a_forged_decided_header_is_quarantined_with_evidence_and_never_run(
    broker: BrokerSettings, tmp_path: Path, forged: str, why: str
):
    """A publisher we don't control sets amqpjobs-decided: the worker publishes nowhere it names, runs no
    handler, and quarantines the message with evidence saying what was wrong (reason invalid-decision)."""
    app = await make_app(broker, tmp_path)
    runs: list[str] = []

    @app.job("noted", queue="work")
    async def noted(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await worker.start()
    try:
        async with raw_channel(broker) as ch:
            await ch.default_exchange.publish(
                aio_pika.Message(b"{}", message_id="forged-1", type="noted", headers={DECIDED: forged}), "work"
            )
        await recorder.wait_for(lambda outs: len(outs) == 1, 20)
        await asyncio.sleep(0.3)
    finally:
        await worker.shutdown()
        await app.close()
    assert runs == []
    assert [(o.kind, o.decision.reason) for o in recorder.outcomes] == [("quarantined", "invalid-decision")]  # type: ignore[union-attr]
    [copy] = await drain(broker, "work.quarantine")
    assert text(copy.headers["amqpjobs-reason"]) == "invalid-decision"
    assert text(copy.headers["amqpjobs-error-type"]) == "InvalidDecision"
    assert text(copy.headers["amqpjobs-error-message"]) == f"header {DECIDED} {forged!r} {why}"
    assert DECIDED not in copy.headers  # replayed, it runs normally
    for queue in app.topology().layout("work").tier_queues["work"]:
        assert await depth(broker, queue) == 0


@pytest.mark.timeout(90)
async def test_a_kept_quarantine_replayed_from_quarantine_runs_normally(broker: BrokerSettings, tmp_path: Path):
    """'rej' rejects once with work.quarantine deleted (held, then kept past the stop); the next worker
    quarantines it without running it; parked, unparked and replayed, it runs normally (and rejects again)."""
    app = await make_app(broker, tmp_path)
    runs: list[tuple[str, int]] = []

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        if len(runs) == 1:
            raise Reject("no")

    await stopped_while_held(app, broker, "work")
    await apply_topology(tmp_path / "applied.toml", broker)
    recorder = Recorder()
    later = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=1), recorder)
    await later.start()
    try:
        await recorder.wait_for(lambda outs: [o.kind for o in outs] == ["quarantined"], 30)
        assert runs == [("rej-1", 1)]
        for args in (("quarantine", "park", "work.quarantine"), ("quarantine", "unpark", "work")):
            moved = await asyncio.to_thread(cli, broker, *args, "--yes")
            assert moved.exit_code == 0, moved.output
        async with raw_channel(broker) as ch:
            queue = await ch.get_queue("work.quarantine", ensure=False)
            message = await queue.get(no_ack=False)
            assert DECIDED not in message.headers
            assert text(message.headers["amqpjobs-reason"]) == "rejected"
            await message.nack(requeue=True)
        replayed = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--rate", "100")
        assert replayed.exit_code == 0, replayed.output
        await recorder.wait_for(lambda outs: [o.kind for o in outs] == ["quarantined", "succeeded"], 30)
    finally:
        await later.shutdown()
        await app.close()
    assert runs == [("rej-1", 1), ("rej-1", 1)]  # the replay ran it, normally (attempt 1 again)


@pytest.mark.timeout(90)
async def test_a_kept_decision_held_again_at_the_next_stop_is_kept_again(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """work.quarantine is missing again when the next worker takes the kept quarantine (here redelivered: a
    raw client took it first and gave it back): it holds that copy (no handler run), and at its stop keeps it
    again, in a fresh marked copy, never a plain redelivery."""
    app = await make_app(broker, tmp_path)
    runs: list[str] = []

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise Reject("no")

    await stopped_while_held(app, broker, "work")
    await apply_topology(tmp_path / "applied.toml", broker)
    caplog.set_level("INFO", logger="amqpjobs.worker")
    async with raw_channel(broker) as ch:
        taken = await (await ch.get_queue("work", ensure=False)).get(no_ack=False)
        again = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
        delete(broker, "exchanges", "work.quarantine")
        await taken.nack(requeue=True)
    try:
        await until(lambda: again._holding.count == 1, 10, "the kept quarantine's copy to be held")
        caplog.clear()
        again.request_stop()
    finally:
        assert await again.shutdown() == 1
        await app.close()
    assert runs == ["rej-1"]
    assert stop_lines(caplog) == [
        "draining: no job in flight; 1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) waits "
        "up to the grace of 1s",
        "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace period; "
        "it returns to its queue with its outcome kept (not run again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue with its outcome kept (not run again); exit 1",
    ]
    [back] = await drain(broker, "work")
    assert (back.message_id, back.redelivered, text(back.headers[DECIDED])) == ("rej-1", False, "quarantine")
    assert text(back.headers["amqpjobs-reason"]) == "rejected"


@pytest.mark.timeout(60)
async def test_a_decision_that_can_not_be_kept_returns_as_a_redelivery_and_the_lines_say_so(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The work queue refuses the marked copy (a policy: max-length 1, reject-publish, one job ready in it):
    the delivery returns as today, redelivered, and the lines say its outcome was not kept."""
    app = await make_app(broker, tmp_path)

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    try:
        delete(broker, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        await app.enqueue("rej", {}, job_id="filler")  # ready: the work queue is not consumed while one is held
        with ManagementClient(broker) as mgmt:
            policy = {"pattern": "^work$", "apply-to": "queues", "definition": {"max-length": 1,
                      "overflow": "reject-publish"}}  # fmt: skip
            mgmt.request("PUT", f"/policies/{quote(broker.vhost, safe='')}/full", json=policy)
        await asyncio.sleep(0.5)  # the policy reaches the queue
        caplog.clear()
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
        await app.close()
    assert stop_lines(caplog) == [
        "draining: no job in flight; 1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) waits "
        "up to the grace of 1s",
        "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace period; "
        "it returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue (redelivered: its outcome not kept, run again); exit 1",
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    [said] = [line for line in lines if "could not be kept past the stop" in line]
    assert said.startswith(
        "job rej-1: its outcome quarantine (reason rejected) could not be kept past the stop "
        "(PublishNackedError: the broker nacked the publish to '(default)' / 'work' (queue full"
    )
    assert said.endswith("; the delivery returns to work as a redelivery, and the next worker runs the job again")
    back = await drain(broker, "work")
    assert sorted((m.message_id, m.redelivered, DECIDED in m.headers) for m in back) == [
        ("filler", False, False), ("rej-1", True, False)]  # fmt: skip


@pytest.mark.timeout(90)
async def test_a_sharded_queue_keeps_the_decision_on_the_shard_it_came_from(broker: BrokerSettings, tmp_path: Path):
    """A shard's held quarantine is kept on that shard (its own work queue) and carried out from there."""
    path = tmp_path / "sharded.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("kept", topology=load_topology(path).topology, url=broker.url)
    runs: list[str] = []

    @app.job("rej", queue="sharded")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise Reject("no")

    await stopped_while_held(app, broker, "sharded", tenant="t0")
    shards = app.topology().layout("sharded").work_queues
    depths = {queue: await depth(broker, queue) for queue in shards}
    assert sorted(depths.values()) == [0, 1]  # on its own shard, not routed again
    await quarantined_by_the_next_worker(app, broker, path, "sharded")
    assert runs == ["rej-1"]


QUORUM = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "qwork"
exchange = "jobs"
type = "quorum"
retry_tiers = ["1s"]
"""


@pytest.mark.timeout(90)
async def test_a_quorum_queue_keeps_the_decision_as_a_new_message_not_a_redelivery(
    broker: BrokerSettings, tmp_path: Path
):
    """On a quorum job queue the marked copy is a new message (x-delivery-count 0: nothing toward the delivery
    limit); the next worker quarantines it once, the handler not run again."""
    path = tmp_path / "quorum.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    app = App("kept", topology=load_topology(path).topology, url=broker.url)
    runs: list[str] = []

    @app.job("rej", queue="qwork")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise Reject("no")

    await stopped_while_held(app, broker, "qwork")
    async with raw_channel(broker) as ch:
        kept = await (await ch.get_queue("qwork", ensure=False)).get(no_ack=False)
        # a first delivery: x-delivery-count 0 on 3.x; 4.0+ adds the header only from the first redelivery on
        assert (kept.redelivered, kept.headers.get("x-delivery-count", 0), text(kept.headers[DECIDED])) == (
            False, 0, "quarantine")  # fmt: skip
        await kept.nack(requeue=True)
    await quarantined_by_the_next_worker(app, broker, path, "qwork")
    assert runs == ["rej-1"]
