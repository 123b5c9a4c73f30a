"""Every copy of an idempotent job published without ``message_id`` keeps the idempotency key of the message.

README "Idempotency": without ``message_id`` an idempotent job with no ``key`` function is keyed by
``sha256:`` of its headers and body, so two identical messages are one job. A copy (a hand-back, a
retry tier, quarantine and replay, park and unpark, an undeliverable message's rescue) is a new
message, with headers of its own: each test publishes one message raw (no message_id: as a foreign
publisher, through the management API), lets it take one path, then publishes the identical message
again and counts the handler's successful runs: exactly 1, the second one a ``duplicate``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs import App, FilePayloadStore, JobContext, Reject
from amqpjobs.jobs.outcome import Outcome
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.parking import park, unpark
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.worker import Worker
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel, wait_until_async
from tests.integration.worker_env import Recorder, running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the worker's keys, not the broker's rules

BODY = b'{"n": 1}'


def _publish(broker: BrokerSettings, job: str = "charge", routing_key: str = "work", **props: Any) -> None:
    """Publish ``BODY`` as job ``job`` without message_id (unless ``props`` give one), as a foreign publisher."""
    doc = {"properties": {"type": job, "content_type": "application/json", **props}, "routing_key": routing_key,
           "payload": base64.b64encode(BODY).decode(), "payload_encoding": "base64"}  # fmt: skip
    with ManagementClient(broker) as mgmt:
        assert mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc) == {
            "routed": True
        }


async def _app(broker: BrokerSettings, tmp_path: Path, fails: int = 0, reject: bool = False, **job: Any) -> tuple[
    App, list[str]
]:  # fmt: skip
    """App with idempotent job ``charge`` on ``work`` (hashed key): the job ids of its successful runs.

    Its first ``fails`` calls raise (``reject``: :class:`Reject`, to quarantine; else an error, to a retry tier).
    """
    path = tmp_path / "topology.toml"
    if not path.exists():
        await _applied(broker, tmp_path)
    app = App("unnamed", topology=path, url=broker.url, ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    ran: list[str] = []
    calls = [0]

    @app.job("charge", queue="work", idempotent=True, **job)
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        calls[0] += 1
        if calls[0] <= fails:
            raise Reject("not now") if reject else RuntimeError("not yet")
        ran.append(ctx.job_id)

    return app, ran


async def _applied(broker: BrokerSettings, tmp_path: Path, text: str | None = None) -> Path:
    """Topology ``text`` (None: the plain ``work`` job queue) written to tmp_path/topology.toml and applied."""
    path = tmp_path / "topology.toml"
    path.write_text(work_topology() if text is None else text)
    await apply_topology(path, broker)
    return path


async def _runs_then_twice(broker: BrokerSettings, app: App, first: str = "succeeded") -> Recorder:
    """A worker of ``app`` until an outcome of kind ``first``, then until the message published again has its own
    (succeeded or duplicate); the app closed after. Its recorder."""
    try:
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda outs: any(o.kind == first for o in outs), 30)
            await _twice(broker, app, recorder, 1)
    finally:
        await app.close()
    return recorder


async def _returned(broker: BrokerSettings, times: int) -> None:
    """Take the head of ``work`` unacked and close the channel, ``times`` times: back in the queue, redelivered,
    as by a killed worker (a quorum queue counts each in ``x-delivery-count``)."""
    for _ in range(times):
        async with raw_channel(broker) as ch:
            queue = await ch.get_queue("work", ensure=False)
            assert await queue.get(fail=False, no_ack=False) is not None


def _ended(count: int) -> Callable[[list[Outcome]], bool]:
    """Whether ``count`` messages ended (succeeded or duplicate) among the outcomes."""
    return lambda outs: sum(o.kind in ("succeeded", "duplicate") for o in outs) >= count


async def _twice(broker: BrokerSettings, app: App, recorder: Recorder, before: int = 0) -> None:
    """Publish the message again, wait for its outcome (after ``before`` outcomes of those two kinds)."""
    _publish(broker)
    await recorder.wait_for(lambda outs: sum(o.kind in ("succeeded", "duplicate") for o in outs) >= before + 1, 30)


async def _empty(broker: BrokerSettings) -> None:
    for queue in ("work", "work.quarantine", "work.parked", "work.suspects", "work.retry.1s"):
        assert await depth(broker, queue) == 0, queue


async def _quarantined(broker: BrokerSettings) -> bool:
    return await depth(broker, "work.quarantine") == 1


def _kinds(recorder: Recorder) -> list[str]:
    return [o.kind for o in recorder.outcomes]


@pytest.mark.timeout(90)
async def test_a_retry_tier_copy_keeps_the_key(broker: BrokerSettings, tmp_path: Path) -> None:
    app, ran = await _app(broker, tmp_path, fails=1)
    _publish(broker)
    recorder = await _runs_then_twice(broker, app)
    assert _kinds(recorder) == ["retried", "succeeded", "duplicate"]
    assert len(ran) == 1, ran
    assert ran[0].startswith("sha256:"), ran
    await _empty(broker)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("parked", [False, True], ids=["replayed", "parked-unparked-replayed"])
async def test_a_quarantined_copy_replayed_keeps_the_key(broker: BrokerSettings, tmp_path: Path, parked: bool) -> None:
    app, ran = await _app(broker, tmp_path, fails=1, reject=True)
    _publish(broker)
    try:
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda outs: any(o.kind == "quarantined" for o in outs), 30)
            if parked:
                assert (await park(broker, "work.quarantine")).taken == 1
                assert (await unpark(broker, "work.parked")).taken == 1
            assert len((await replay(broker, "work.quarantine", ReplayOptions(rate=100))).moves) == 1
            await recorder.wait_for(lambda outs: any(o.kind == "succeeded" for o in outs), 30)
            await _twice(broker, app, recorder, 1)
    finally:
        await app.close()
    assert _kinds(recorder) == ["quarantined", "succeeded", "duplicate"]
    assert len(ran) == 1, ran
    await _empty(broker)


@pytest.mark.timeout(90)
async def test_a_copy_quarantined_by_a_worker_without_the_job_keeps_the_key(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """The job lookup missed (another app's worker on the queue): its copy, replayed to one with the job."""
    other = App("other", topology=await _applied(broker, tmp_path), url=broker.url)
    other.job("other", queue="work")(lambda p, c: None)
    _publish(broker)
    try:
        async with running_worker(other, broker) as (_, missed):
            await missed.wait_for(lambda outs: any(o.kind == "quarantined" for o in outs), 30)
    finally:
        await other.close()
    app, ran = await _app(broker, tmp_path)
    assert len((await replay(broker, "work.quarantine", ReplayOptions(rate=100))).moves) == 1
    recorder = await _runs_then_twice(broker, app)
    assert _kinds(recorder) == ["succeeded", "duplicate"], _kinds(recorder)
    assert len(ran) == 1, ran
    await _empty(broker)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("refused", [False, True], ids=["moved", "move-refused"])
@pytest.mark.parametrize("keyed", [False, True], ids=["hashed", "key-function"])
async def test_a_rate_limited_delivery_without_message_id_waits_bounded_and_runs_once(
    broker: BrokerSettings, tmp_path: Path, keyed: bool, refused: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Its wait for a token is bounded as every other (half the consumer timeout: 2 s here), then handed back.

    6/m: a token every 10 s. Before, such a delivery waited in its work queue's slot with no bound:
    past the broker's consumer_timeout its channel was closed and all it held redelivered (measured
    on 3.10.8, consumer_timeout 5 s: PRECONDITION_FAILED after 32 s, the job registered as a crash
    start). Now it is moved into the waiting room like any other, its copy keyed as it came; where
    the move fails (``refused``: a policy makes the waiting room refuse every publish), it waits
    in its slot, as long at most, and goes back as a copy keyed the same.
    """
    if refused:
        with ManagementClient(broker) as mgmt:
            policy = {"pattern": r"^work\.rate-waiting\.", "apply-to": "queues",
                      "definition": {"max-length": 0, "overflow": "reject-publish"}}  # fmt: skip
            mgmt.request("PUT", f"/policies/{quote(broker.vhost, safe='')}/refuse", json=policy)
    key = (lambda p: f"charge-{p['n']}") if keyed else None
    app, ran = await _app(broker, tmp_path, rate_limit="6/m", key=key)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=1, grace=5, consumer_timeout=4), recorder)
    _publish(broker)
    _publish(broker)
    await worker.start()
    started = time.monotonic()
    try:
        await recorder.wait_for(
            lambda outs: sum(o.kind in ("succeeded", "duplicate") for o in outs) >= 2
            and any(o.kind == "handed_back" for o in outs), 80
        )  # fmt: skip
    finally:
        await worker.shutdown()
        await app.close()
    kinds = _kinds(recorder)
    assert sorted(set(kinds)) == ["duplicate", "handed_back", "succeeded"], kinds  # never a redelivery
    assert kinds.count("succeeded") == 1, kinds
    assert len(ran) == 1, ran
    assert ran[0] == "charge-1" if keyed else ran[0].startswith("sha256:"), ran
    waits = [o for o in recorder.outcomes if o.kind == "handed_back"]
    assert waits, kinds
    assert time.monotonic() - started >= 1.5
    await _empty(broker)
    assert await depth(broker, "work.rate-waiting.charge") == 0
    failed = [r.getMessage() for r in caplog.records if "it waits for its token in its slot" in r.getMessage()]
    assert bool(failed) is refused, failed  # the path under test was taken (or not)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("keyed", [False, True], ids=["hashed", "key-function"])
async def test_an_undeliverable_copy_keeps_the_key(broker: BrokerSettings, tmp_path: Path, keyed: bool) -> None:
    """A correlation_id over 255 bytes (README "Wire format"): rescued to quarantine, then replayed.

    Hashed: its key is the rescue's ``undeliverable-<fingerprint>``, the same for the identical message.
    With a key function, the function's: the same payload published deliverable is its duplicate.
    """
    with ManagementClient(broker) as mgmt:
        if mgmt.broker_version() >= (4,):
            pytest.skip("RabbitMQ 4.x refuses the HTTP publish of such a message (506, measured on 4.3.6)")
    app, ran = await _app(broker, tmp_path, key=(lambda p: f"charge-{p['n']}") if keyed else None)
    try:
        async with running_worker(app, broker) as (_, recorder):
            for turn in (1, 2):
                if keyed and turn == 2:
                    _publish(broker)
                else:
                    _publish(broker, correlation_id="c" * 300)
                    await wait_until_async(lambda: _quarantined(broker), 30, "the rescue to quarantine")
                    assert len((await replay(broker, "work.quarantine", ReplayOptions(rate=100))).moves) == 1
                await recorder.wait_for(_ended(turn), 30)
    finally:
        await app.close()
    assert _kinds(recorder) == ["succeeded", "duplicate"], _kinds(recorder)
    assert len(ran) == 1, ran
    assert ran[0] == "charge-1" if keyed else ran[0].startswith("undeliverable-"), ran
    await _empty(broker)


@pytest.mark.timeout(60)
async def test_a_publishers_own_generated_ids_are_its_job_ids(broker: BrokerSettings, tmp_path: Path) -> None:
    """A message_id of the publisher's that starts with generated- is its job id, even with a key function.

    Before, ``keyed_again`` took any ``generated-`` id for a worker's copy: two jobs the publisher named
    apart (generated-order-1, -2) but with one payload were keyed by the function as one, the second
    acked as a duplicate and never run. A copy of ours carries ``amqpjobs-payload-key``, and one made
    before that header a ``generated-<uuid4>`` id (still keyed by the function: the last case).
    """
    app, ran = await _app(broker, tmp_path, key=lambda p: f"charge-{p['n']}")
    _publish(broker, message_id="generated-order-1")
    _publish(broker, message_id="generated-order-2")
    _publish(broker, message_id="generated-3fc2a1b0-8f0e-4c1d-9a2b-5e6f7a8b9c0d")  # an old copy: charge-1
    try:
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda outs: sum(o.kind in ("succeeded", "duplicate") for o in outs) >= 3, 30)
    finally:
        await app.close()
    assert ran == ["generated-order-1", "generated-order-2", "charge-1"], (ran, _kinds(recorder))
    await _empty(broker)


SHARDED = (
    '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\nshards = 2\nretry_tiers = ["1s"]\n'
)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["hashed", "key-function", "key-function-stored"])
async def test_a_look_ahead_delivery_handed_back_keeps_the_key(
    broker: BrokerSettings, tmp_path: Path, how: str
) -> None:
    """A hand-back before the job lookup (deliveries.py): the look-ahead delivery of a sharded job queue.

    After a short job the worker (concurrency 1) takes one delivery more; it waits 0.2 s for a running
    slot while a slow job runs, then goes back to its shard unstarted as a copy. Before, that copy
    carried a ``generated-<uuid>`` id and ran under it, and the identical message then ran again.
    ``key-function-stored``: its payload in the app's store (claim-check), read only at the start.
    """
    await _applied(broker, tmp_path, SHARDED)
    app, ran = await _app(broker, tmp_path, key=None if how == "hashed" else lambda p: f"charge-{p['n']}")
    charge: dict[str, Any] = {}
    if how == "key-function-stored":
        app.payload_store = FilePayloadStore(tmp_path / "payloads")
        charge = {"headers": {"amqpjobs-payload-ref": str(await app.payload_store.put(BODY))}}
    app.job("fast", queue="work")(lambda p, c: None)

    @app.job("slow", queue="work")
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(1.5)

    for job, props in (("fast", {"message_id": "f"}), ("slow", {"message_id": "s"}), ("charge", charge)):
        _publish(broker, job, "work.shard-0", **props)
    try:
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda outs: any(o.job == "charge" and o.kind == "succeeded" for o in outs), 30)
            _publish(broker, "charge", "work.shard-0", **charge)
            await recorder.wait_for(
                lambda outs: sum(o.job == "charge" and o.kind in ("succeeded", "duplicate") for o in outs) >= 2, 30
            )
    finally:
        await app.close()
    charges = [o.kind for o in recorder.outcomes if o.job == "charge"]
    assert "handed_back" in charges, charges  # the path under test was taken
    assert charges[-2:] == ["succeeded", "duplicate"], charges
    assert len(ran) == 1, ran
    for shard in ("work.shard-0", "work.shard-1", "work.quarantine"):
        assert await depth(broker, shard) == 0, shard


QUORUM = SHARDED.replace("shards = 2", 'type = "quorum"')


@pytest.mark.timeout(60)
async def test_a_quorum_redelivery_keeps_the_key(broker: BrokerSettings, tmp_path: Path) -> None:
    """A quorum queue adds ``x-delivery-count`` to a redelivery: the broker's header is no part of the key.

    Before, the redelivery (taken and not acked, as by a killed worker) was keyed with that header,
    registered and run under another ``sha256:`` than the identical message, which then ran again.
    """
    await _applied(broker, tmp_path, QUORUM)
    app, ran = await _app(broker, tmp_path)
    _publish(broker)
    await _returned(broker, 1)  # back in the queue marked redelivered, x-delivery-count 1
    recorder = await _runs_then_twice(broker, app)
    assert [k for k in _kinds(recorder) if k != "redelivered"] == ["succeeded", "duplicate"], _kinds(recorder)
    assert len(ran) == 1, ran
    await _empty(broker)


@pytest.mark.timeout(90)
async def test_a_broker_dead_letter_replayed_keeps_the_key(broker: BrokerSettings, tmp_path: Path) -> None:
    """Dead-lettered by the broker (a quorum queue's delivery limit), the message has no header of ours.

    Replay gives it a ``generated-<uuid>`` id; before, it ran under that id and the identical message
    then ran again. The replayed copy carries the key of the message without the broker's headers.
    """
    await _applied(broker, tmp_path, QUORUM.replace('type = "quorum"', 'type = "quorum"\ndelivery_limit = 1'))
    _publish(broker)
    await _returned(broker, 2)  # returned twice (as by killed workers): over the limit, dead-lettered into quarantine
    await wait_until_async(lambda: _quarantined(broker), 30, "the dead-letter into quarantine")
    assert len((await replay(broker, "work.quarantine", ReplayOptions(rate=100))).moves) == 1
    app, ran = await _app(broker, tmp_path)
    recorder = await _runs_then_twice(broker, app)
    assert _kinds(recorder) == ["succeeded", "duplicate"], _kinds(recorder)
    assert len(ran) == 1, ran
    await _empty(broker)
