"""Rate limits across worker processes (README "Flow control" -> "Rate limits"), on the real broker."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import aiormq
import pytest

from amqpjobs import App, Breaker, JobContext
from amqpjobs.jobs.rate import WAITING_FROM
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.runtime.status import collect
from amqpjobs.runtime.worker import Outcome, Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.naming import breaker_queue_name, rate_queue_names
from amqpjobs.wire.breakers import OpenRecord
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, depth, drain, raw_channel
from tests.integration.worker_env import Recorder, running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = work_topology()
ROOMS = rate_queue_names("work", "limited")


@contextmanager
def rate_workers(broker: BrokerSettings, tmp_path: Path, *args: str, **extra: str) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume tests.integration.rateapp:app *args``, logs to worker.log (SIGTERM at the end)."""
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "RATEAPP_TOPOLOGY": str(tmp_path / "topology.toml"), "RATEAPP_RECORD": str(tmp_path / "record.txt"),
           **extra}  # fmt: skip
    with consume_subprocess("tests.integration.rateapp:app", env, args, tmp_path / "worker.log", terminate=True) as p:
        yield p


async def publisher(broker: BrokerSettings, tmp_path: Path) -> App:
    """Apply the topology; an app that only publishes ``limited`` and ``other``."""
    path = tmp_path / "topology.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App("pub", topology=load_topology(path).topology, url=broker.url)
    app.job("limited", queue="work")(lambda p, c: None)
    app.job("other", queue="work")(lambda p, c: None)
    return app


async def consumers(broker: BrokerSettings, queue: str) -> int:
    """Consumers of ``queue`` now (0 while it does not exist)."""
    try:
        async with raw_channel(broker) as ch:
            declared = await ch.declare_queue(queue, passive=True)
            return declared.declaration_result.consumer_count or 0
    except aiormq.exceptions.ChannelNotFoundEntity:
        return 0


async def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def times(record: Path, job: str, event: str) -> list[float]:
    lines = [line.split() for line in record.read_text().splitlines()] if record.exists() else []
    return sorted(float(p[2]) for p in lines if p[:2] == [job, event])


def most_in_one_second(starts: list[float], window: float = 1.0) -> int:
    """The most starts in any window [t, t + ``window`` s) (one starting at each start is enough)."""
    return max((bisect.bisect_left(starts, t + window) - i for i, t in enumerate(starts)), default=0)


def test_most_in_one_second_counts_a_sliding_window():
    assert most_in_one_second([0.0, 0.5, 0.99, 1.0, 1.2, 1.98]) == 4  # 0.99, 1.0, 1.2, 1.98
    assert most_in_one_second([]) == 0


async def enqueue_all(app: App, jobs: list[tuple[str, dict[str, float]]]) -> None:
    await asyncio.gather(*(app.enqueue(job, payload) for job, payload in jobs))


@pytest.mark.serial
async def test_300_jobs_at_10_per_second_on_4_processes_take_30s_and_leave_the_queue_to_other_jobs(
    broker: BrokerSettings, tmp_path: Path
):
    app = await publisher(broker, tmp_path)
    record = tmp_path / "record.txt"
    try:
        with rate_workers(broker, tmp_path, "--processes", "4", "--concurrency", "8", "--grace", "10s"):

            async def ready() -> bool:
                return [await consumers(broker, n) for n in ("work", ROOMS.waiting)] == [4, 4]

            await wait_for(ready, 60, "4 worker processes consuming the work queue and the waiting room")
            # the other job alone: 300 runs of 0.4 s on 32 slots
            await enqueue_all(app, [("other", {"seconds": 0.4})] * 300)

            async def others_done() -> bool:
                return len(times(record, "other", "done")) == 300

            await wait_for(others_done, 30, "300 runs of the other job")
            alone = times(record, "other", "done")[-1] - times(record, "other", "start")[0]
            record.unlink()
            # both: 300 rate-limited at 10/s and 300 runs of the other job, interleaved
            began = time.time()
            await enqueue_all(app, [("limited", {}), ("other", {"seconds": 0.4})] * 300)

            async def limited_done() -> bool:
                return len(times(record, "limited", "start")) >= 300 and len(times(record, "other", "done")) == 300

            await wait_for(limited_done, 45, "300 rate-limited runs")
            await asyncio.sleep(0.5)  # none more (each ran once)
            starts = times(record, "limited", "start")
            together = times(record, "other", "done")[-1] - times(record, "other", "start")[0]
            took = starts[-1] - began
            gaps = [(round(a - began, 2), round(b - a, 3)) for a, b in itertools.pairwise(starts) if b - a > 0.15]
            print(f"limited: {len(starts)} starts in {took:.2f}s (first after {starts[0] - began:.2f}s, gaps over "
                  f"0.15 s at {gaps}), at most {most_in_one_second(starts)} a second; other: {alone:.2f}s alone, "
                  f"{together:.2f}s beside it ({together / alone:.2f}x)")  # fmt: skip
            assert len(starts) == 300
            assert 29.0 <= took <= 31.0
            # count + 1 a period (README "Rate limits") holds for the tokens; a start is recorded by its handler in one
            # of 4 processes on 2 cores, beside two other serial tests, up to ~0.2 s late (local CI 71: gaps of 0.22
            # and 0.18 s, then 12 in one second as the late one met the next window's): so windows of 0.8 s
            assert most_in_one_second(starts, window=0.8) <= 11
            assert together <= 1.2 * alone
            assert len({line.split()[3] for line in record.read_text().splitlines() if "limited" in line}) == 4
    finally:
        await app.close()
        print((tmp_path / "worker.log").read_text()[-3000:])


async def in_process_app(broker: BrokerSettings, tmp_path: Path, rate: str) -> App:
    """The topology applied; an app whose ``limited`` job has ``rate`` and records its runs, and an ``other`` job."""
    app = await publisher(broker, tmp_path)
    runner = App("rateapp", topology=app.topology(), url=broker.url)

    async def limited(payload: dict[str, object], ctx: JobContext) -> None:
        if payload.get("fail"):
            raise RuntimeError("boom")

    runner.job("limited", queue="work", rate_limit=rate)(limited)
    runner.job("other", queue="work")(lambda p, c: None)
    return runner


async def test_waiting_jobs_hold_no_slot_and_a_stopping_worker_hands_them_back_unstarted(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level("INFO", logger="amqpjobs")
    app = await in_process_app(broker, tmp_path, "1/h")  # no token in this test (bar an hour's turn)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=1, grace=10), recorder)
    await worker.start()
    try:
        for i in range(3):
            await app.enqueue("limited", {}, job_id=f"limited-{i}")
        await app.enqueue("other", {}, job_id="other-0")  # its one slot is free: the limited ones wait elsewhere
        await recorder.wait_for(lambda outs: any(o.job_id == "other-0" for o in outs), 10)
        assert len([o for o in recorder.outcomes if o.job == "limited"]) <= 1  # a token only at the turn of an hour
        report = (await collect(broker, list(app.topology().layouts())))[0]
        assert [q.name for q in report.waiting] == [ROOMS.waiting]
        note = next(n for n in report.notes if "rate-limited" in n)
        assert note.startswith("job 'limited' is rate-limited: ")
        assert f"waiting room {ROOMS.waiting}" in note
        assert "tokens minted by token emitter of job limited at 1/h (pid" in note
    finally:
        assert await worker.shutdown() == 0
        await app.close()
    started = [o for o in recorder.outcomes if o.job == "limited" and o.kind != "handed_back"]
    # handed back once from the waiting room, after the work queue's consumer was cancelled (it can't take it back)
    assert sum(o.kind == "handed_back" for o in recorder.outcomes) == 1
    # the one delivery it held (one slot) went back to the work queue as a copy; the others wait in the room
    back = await drain(broker, "work")
    assert len(back) == 1 - len(started)
    assert await depth(broker, ROOMS.waiting) == 2
    assert not any(m.redelivered for m in back)  # copies: their next start is no crash suspect
    assert [WAITING_FROM in (m.headers or {}) for m in back] == [False] * len(back)
    assert [(m.headers or {}).get("amqpjobs-attempt", 1) for m in back] == [1] * len(back)  # no attempt used
    [draining] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("draining")]
    assert draining == "draining: no job in flight"  # the one waiting for a token never runs: no job to drain
    [stopped] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worker stopped")]
    assert stopped == (  # the one waiting delivery is no job finished
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 waiting for a token handed back "
        "unstarted; exit 0"
    )


async def test_a_delivery_waiting_for_a_token_goes_back_unstarted_before_the_broker_consumer_timeout(
    broker: BrokerSettings, tmp_path: Path
):
    """A waiting delivery is held unacked: at a slow rate (1/h, or 10/h over 4 processes: 8 waiting, 48 min) it
    outlived the broker's consumer_timeout (30 min), the broker closed the waiting room's channel (seen on 3.10:
    PRECONDITION_FAILED - delivery acknowledgement timed out) and the deliveries came back redelivered, each
    registered as a crash start (start 2 of at most 6) though it never started. At half the consumer timeout
    (--consumer-timeout, 4 s here) it goes back to its work queue unstarted, and on to the waiting room's end."""
    app = await in_process_app(broker, tmp_path, "1/h")  # no token in this test (bar an hour's turn)
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=1, grace=5, consumer_timeout=4), recorder)
    await worker.start()
    try:
        await app.enqueue("limited", {}, job_id="waits")
        started = time.monotonic()
        await recorder.wait_for(lambda outs: any(o.job_id == "waits" and o.kind == "handed_back" for o in outs), 8)
        assert time.monotonic() - started >= 1.5, "handed back before half the consumer timeout"
        await recorder.wait_for(lambda outs: sum(o.job_id == "waits" and o.kind == "handed_back" for o in outs) >= 2, 8)
    finally:
        await worker.shutdown()
        await app.close()
    kinds = {o.kind for o in recorder.outcomes if o.job_id == "waits"}
    assert kinds == {"handed_back"}, kinds  # never registered as a crash start, never run (no token)


async def test_the_draining_line_counts_running_handlers_not_deliveries_waiting_for_a_token(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """One handler runs and one delivery waits for its token at the stop: one job to drain, not two."""
    caplog.set_level("INFO", logger="amqpjobs")
    app = await in_process_app(broker, tmp_path, "1/h")  # no token in this test (bar an hour's turn)
    began, release = asyncio.Event(), asyncio.Event()

    async def slow(payload: dict[str, object], ctx: JobContext) -> None:
        began.set()
        await release.wait()

    app.job("slow", queue="work")(slow)
    worker = Worker(app, broker, WorkerOptions(concurrency=1, grace=10), Recorder())
    await worker.start()
    try:
        await app.enqueue("limited", {}, job_id="limited-0")
        await wait_for(lambda: _waiting_in_room(worker), 10, "the limited job to wait for its token")
        await app.enqueue("slow", {}, job_id="slow-0")
        await asyncio.wait_for(began.wait(), 10)
        stopping = asyncio.create_task(worker.shutdown())
        await asyncio.sleep(0.5)
        release.set()
        assert await stopping == 0
    finally:
        release.set()
        await app.close()
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("draining")] == ["draining 1 in-flight job(s), grace 10s"]
    assert [m for m in messages if m.startswith("worker stopped")] == [
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered), 1 waiting for a token handed back "
        "unstarted; exit 0"
    ]
    assert await depth(broker, "work") == 1  # the waiting one, back in its work queue unstarted


async def _waiting_in_room(worker: Worker) -> bool:
    rates = worker._rates
    return rates is not None and any(r.source is not None and r.source._waiting for r in rates.rooms.values())


async def test_a_token_is_spent_only_by_a_start_one_taken_by_a_delivery_told_to_wait_goes_back(
    broker: BrokerSettings, tmp_path: Path
):
    """A rate-limited delivery that took its token and then does not start (here: its breaker is open, so it
    waits in a tier) gives the token back (requeued, its expiry kept) for the next delivery: the token queue's
    acks (tokens used, as the broker counts them) are the handler's starts, no more."""
    app = await in_process_app(broker, tmp_path, "5/s")
    starts: list[float] = []

    async def counted(payload: dict[str, object], ctx: JobContext) -> None:
        starts.append(time.time())

    runner = App("rateapp", topology=app.topology(), url=broker.url)
    runner.job("limited", queue="work", rate_limit="5/s", breaker=Breaker(failures=5, window=10, cool_down=3))(counted)
    async with raw_channel(broker) as channel:  # open for 3 s from now, as a worker records it
        now = time.time()
        arguments = {"x-queue-type": "classic", **OpenRecord(now, now + 3, 5).arguments()}
        await channel.declare_queue(breaker_queue_name("work", "limited"), durable=True, arguments=arguments)
    async with running_worker(runner, broker, concurrency=2, queues=("work",)) as (_, recorder):
        for i in range(6):
            await runner.enqueue("limited", {}, job_id=f"limited-{i}")
        await recorder.wait_for(lambda outs: sum(o.kind == "succeeded" for o in outs) == 6, 30)
        deferred = sum(o.kind == "deferred" for o in recorder.outcomes)
        used = await tokens_used(broker, at_least=len(starts))  # the worker's channels still open
    await runner.close()
    await app.close()
    assert len(starts) == 6
    assert deferred >= 6  # each waited out the open breaker at least once, after taking a token
    assert used == len(starts), f"{used} token(s) used for {len(starts)} start(s), {deferred} deferral(s)"


async def tokens_used(broker: BrokerSettings, at_least: int) -> int:
    """The token queue's acks as the management API counts them, once its figures cover the run.

    Called while the consuming channels are open: a channel reports its acks every 5 s
    (``collect_statistics_interval``), and a busy broker's collector runs late. Read every
    0.5 s (up to 60 s) until ``at_least`` are counted, then once more a collection later, so
    an ack sent after the ones counted (a token used twice) is counted too. Acks never sent
    never come: that still fails.
    """
    deadline = time.monotonic() + 60
    with ManagementClient(broker) as mgmt:

        def read() -> int:
            tokens = mgmt.queue(broker.vhost, ROOMS.tokens) or {}
            return int((tokens.get("message_stats") or {}).get("ack", 0))

        while (used := read()) < at_least and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if used < at_least:
            return used
        await asyncio.sleep(6)
        return read()


async def test_a_failing_rate_limited_job_is_retried_through_its_tier_then_quarantined(
    broker: BrokerSettings, tmp_path: Path
):
    app = await in_process_app(broker, tmp_path, "20/s")
    async with running_worker(app, broker, concurrency=2, queues=("work",)) as (_, recorder):
        await app.enqueue("limited", {"fail": True}, job_id="failing")
        await recorder.wait_for(lambda outs: any(o.kind == "quarantined" for o in outs), 15)
    await app.close()
    outs = [(o.kind, o.attempt, o.queue) for o in recorder.outcomes]
    assert outs == [("retried", 1, "work"), ("quarantined", 2, "work")]
    [quarantined] = await drain(broker, "work.quarantine")
    headers = quarantined.headers or {}
    assert (headers["amqpjobs-original-queue"], headers["amqpjobs-attempts"]) == ("work", 2)
    assert (headers["amqpjobs-original-exchange"], headers["amqpjobs-original-routing-key"]) == ("jobs", "work")
    assert await depth(broker, ROOMS.waiting) == 0


async def test_a_killed_emitter_is_replaced_by_another_worker(broker: BrokerSettings, tmp_path: Path):
    app = await in_process_app(broker, tmp_path, "20/s")
    with rate_workers(broker, tmp_path, "--concurrency", "2", RATEAPP_RATE="20/s") as proc:

        def minting() -> bool:
            log = (tmp_path / "worker.log").read_text() if (tmp_path / "worker.log").exists() else ""
            return "now mints its tokens" in log

        await wait_for(asyncio_true(minting), 30, "the process to mint tokens")
        metrics = WorkerMetrics()
        recorder = Recorder()
        worker = Worker(app, broker, WorkerOptions(concurrency=2, grace=10), recorder, metrics)
        await worker.start()
        try:
            emitting = {"job": "limited"}
            await asyncio.sleep(2.5)  # it tried the lock at least twice meanwhile
            assert metrics.sample("amqpjobs_rate_limit_emitter", emitting) == 0
            proc.kill()  # SIGKILL: its connection goes, and the exclusive queue (the lock) with it
            proc.wait(10)

            async def took_over() -> bool:
                return metrics.sample("amqpjobs_rate_limit_emitter", emitting) == 1

            await wait_for(took_over, 15, "the in-process worker to mint the tokens")
            for i in range(10):
                await app.enqueue("limited", {}, job_id=f"after-{i}")
            await recorder.wait_for(lambda outs: sum(o.kind == "succeeded" for o in outs) == 10, 15)
            assert metrics.sample("amqpjobs_rate_limit_tokens_total", emitting) >= 10
        finally:
            await worker.shutdown()
            await app.close()


def asyncio_true(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


async def publish_suspect(broker: BrokerSettings, job_id: str) -> None:
    """A registered suspect of ``limited``, as a worker leaves one: start 2, from work queue ``work``."""
    import aio_pika

    from amqpjobs.jobs import crash

    async with raw_channel(broker) as ch:
        message = aio_pika.Message(
            b"{}", type="limited", message_id=job_id, headers={crash.STARTS: 2, crash.WORK_QUEUE: "work"}
        )
        await ch.default_exchange.publish(message, routing_key="work.suspects")


async def test_a_rate_limited_suspect_takes_a_token_or_goes_back_to_wait_uncharged(
    broker: BrokerSettings, tmp_path: Path
):
    """README "Rate limits": a suspect takes a token too; without one in its turn it waits for a later one."""
    app = await in_process_app(broker, tmp_path, "1/h")  # no token in this test (bar an hour's turn)
    await publish_suspect(broker, "suspect-1")
    async with running_worker(app, broker, concurrency=2, queues=("work",)) as (_, recorder):
        await asyncio.sleep(3.0)  # a few suspects turns
        await app.enqueue("other", {}, job_id="other-after")  # the work queue still runs between turns
        await recorder.wait_for(lambda outs: any(o.job_id == "other-after" for o in outs), 10)
        assert [o.job_id for o in recorder.outcomes if o.job == "limited"] == []  # not run without a token
    await app.close()
    [back] = await drain(broker, "work.suspects")  # still there, its start count unchanged
    assert (back.message_id, (back.headers or {}).get("amqpjobs-starts"), back.redelivered) == ("suspect-1", 2, False)


async def test_a_rate_limited_suspect_runs_alone_with_a_token(broker: BrokerSettings, tmp_path: Path):
    app = await in_process_app(broker, tmp_path, "2/s")
    await publish_suspect(broker, "suspect-2")
    metrics = WorkerMetrics()
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=2, grace=10), recorder, metrics)
    await worker.start()
    try:
        await recorder.wait_for(lambda outs: any(o.job_id == "suspect-2" for o in outs), 15)
        assert [(o.job_id, o.kind) for o in recorder.outcomes] == [("suspect-2", "succeeded")]
        # its token was taken: fewer tokens wait than were minted is not observable; the gate says it
        assert worker._rates is not None
        assert worker._rates.rooms["limited"].gate.taken == 1
    finally:
        await worker.shutdown()
        await app.close()
    assert await depth(broker, "work.suspects") == 0


async def test_status_max_age_covers_waiting_rooms(broker: BrokerSettings, tmp_path: Path):
    """``status --max-age`` flags a waiting room whose oldest job is older (a rate-limited backlog falling behind)."""
    import aio_pika

    app = await in_process_app(broker, tmp_path, "1/h")
    async with running_worker(app, broker, concurrency=1, queues=("work",)):
        pass  # declares the rate queues
    async with raw_channel(broker) as ch:
        old = datetime.fromtimestamp(time.time() - 900, UTC)
        message = aio_pika.Message(b"{}", type="limited", message_id="old-1", timestamp=old)
        await ch.default_exchange.publish(message, routing_key=ROOMS.waiting)
    await app.close()
    layouts = list(app.topology().layouts())
    deadline = time.monotonic() + 20  # the management API's figures come every few seconds
    while True:
        report = (await collect(broker, layouts, max_age=60))[0]
        aged = [p for p in report.problems if ROOMS.waiting in p and "old" in p]
        if aged or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert len(aged) == 1, report.problems
    assert aged[0].startswith(f"oldest message in {ROOMS.waiting} is 9"), aged
    assert aged[0].endswith("s old (> 60s)")


async def test_rate_queues_deleted_by_hand_are_declared_again_by_the_workers(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """README "Rate limits": a waiting room or token queue found missing is declared again, said once."""
    app = await in_process_app(broker, tmp_path, "20/s")
    caplog.set_level("INFO", logger="amqpjobs")
    async with running_worker(app, broker, concurrency=2, queues=("work",)) as (_, recorder):
        for round_, queue in enumerate((ROOMS.tokens, ROOMS.waiting, ROOMS.tokens)):
            async with raw_channel(broker) as ch:
                await ch.queue_delete(queue)
            await asyncio.sleep(1.5)  # the emitter mints into nowhere meanwhile (the tokens), or nothing waits
            for i in range(3):
                await app.enqueue("limited", {}, job_id=f"r{round_}-{i}")
            done = 3 * (round_ + 1)

            def finished(outs: list[Outcome], n: int = done) -> bool:
                return sum(o.kind == "succeeded" for o in outs) == n

            await recorder.wait_for(finished, 15)
        for queue in (ROOMS.waiting, ROOMS.tokens):
            await depth(broker, queue)  # both exist again (a passive declare of a missing one raises)
    await app.close()
    said = [r.getMessage() for r in caplog.records if "declared it again" in r.getMessage()]
    assert any(ROOMS.tokens in m for m in said), said
    assert any(ROOMS.waiting in m for m in said), said
    assert not [r for r in caplog.records if "apply the topology" in r.getMessage()]


async def test_status_flags_a_missing_rate_queue(broker: BrokerSettings, tmp_path: Path):
    app = await in_process_app(broker, tmp_path, "1/h")
    async with running_worker(app, broker, concurrency=1, queues=("work",)):
        async with raw_channel(broker) as ch:
            await ch.queue_delete(ROOMS.tokens)
        report = (await collect(broker, list(app.topology().layouts())))[0]
    await app.close()
    assert f"token queue {ROOMS.tokens} of rate-limited job 'limited' is missing" in " | ".join(report.problems)


async def test_workers_with_different_rates_are_warned_and_shown_by_status(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """README "Rate limits" -> changing a rate: the minter's rate applies; the others say so, and so does status."""
    caplog.set_level("INFO", logger="amqpjobs")
    first = await in_process_app(broker, tmp_path, "20/s")
    second = await in_process_app(broker, tmp_path, "30/s")
    async with running_worker(first, broker, concurrency=1, queues=("work",)):
        await asyncio.sleep(1.5)  # it mints
        async with running_worker(second, broker, concurrency=1, queues=("work",)):
            await asyncio.sleep(2.5)  # it tried the lock and looked at the minter's rate
            deadline = time.monotonic() + 15  # the management API's consumer details come every few seconds
            while True:
                report = (await collect(broker, list(first.topology().layouts())))[0]
                if len(report.rate_limits[0]["worker_rates"]) == 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
    await first.close()
    await second.close()
    warned = [r.getMessage() for r in caplog.records if "not at this worker's" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith("job=limited: its tokens are minted at 20/s by token emitter of job limited at 20/s")
    assert warned[0].count("not at this worker's 30/s") == 1
    [limits] = report.rate_limits
    assert (limits["rate"], limits["worker_rates"], limits["missing"]) == ("20/s", ["20/s", "30/s"], [])
    assert limits["minter"]["pid"] == os.getpid()
    note = next(n for n in report.notes if "rate-limited" in n)
    assert "workers of job 'limited' have different rate limits (20/s, 30/s); the minter's, 20/s, applies" in note


async def test_a_worker_warns_once_per_minter_and_rate_it_differs_from(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """README "Rate limits" -> changing a rate: a new minter at another rate is said too, each one once."""
    from amqpjobs.jobs.rate import parse_rate_limit
    from amqpjobs.runtime.rate_rooms import Room, TokenGate
    from amqpjobs.runtime.token_emitter import TokenEmitter
    from amqpjobs.topology.rate_queues import rate_declarations
    from amqpjobs.wire.connection import connect
    from amqpjobs.wire.lock import LockHolder, exclusive_lock, lock_holder

    caplog.set_level("WARNING", logger="amqpjobs")
    app = await in_process_app(broker, tmp_path, "30/s")
    topology = app.topology()
    [layout] = [lay for lay in topology.layouts() if lay.name == "work"]
    decls = rate_declarations(topology.job_queues[0], "limited")
    rate, stop = parse_rate_limit("30/s"), asyncio.Event()
    room = Room("limited", rate, ROOMS, layout, TokenGate("limited", rate, stop), decls)
    connection = await connect(broker)

    async def declare_again(room: Room, found: str) -> None:
        raise AssertionError("not called here")

    emitter = TokenEmitter(connection, broker, stop, None, declare_again)
    said: list[list[str]] = []
    try:
        for pid, theirs in ((1001, "20/s"), (1002, "20/s"), (1003, "25/s"), (1004, "30/s")):
            holder = LockHolder(f"token emitter of job limited at {theirs}", f"host-{pid}", pid, datetime.now(UTC),
                                (("rate", theirs),))  # fmt: skip
            async with exclusive_lock(connection, broker, ROOMS.emitter, holder, "tokens", look_up=False):

                async def known(holder: LockHolder = holder) -> bool:
                    return (await lock_holder(broker, ROOMS.emitter))[1] == holder

                await wait_for(known, 15, "the management API naming the holder")
                for _ in range(3):  # looked at every MINTER_LOOK_EVERY seconds: said at the first look only
                    await emitter._compare_rates(room)
            said.append([r.getMessage() for r in caplog.records if "not at this worker's" in r.getMessage()])
    finally:
        await connection.close()
        await app.close()
    assert [len(s) for s in said] == [1, 2, 3, 3], said  # 1002 at 20/s is another minter: said again
    assert [m.split(" (pid ")[0] for m in said[-1]] == [
        "job=limited: its tokens are minted at 20/s by token emitter of job limited at 20/s",
        "job=limited: its tokens are minted at 20/s by token emitter of job limited at 20/s",
        "job=limited: its tokens are minted at 25/s by token emitter of job limited at 25/s",
    ]
    assert [m.split(" (pid ")[1].split(",")[0] for m in said[-1]] == ["1001 on host-1001", "1002 on host-1002",
                                                                       "1003 on host-1003"]  # fmt: skip


async def test_a_killed_worker_leaves_few_waiting_deliveries_redelivered(broker: BrokerSettings, tmp_path: Path):
    """README "Rate limits": a process holds at most WAITING_PER_PROCESS deliveries waiting for a token, not
    --concurrency: only those come back marked redelivered (and run alone as suspects) when it is killed."""
    from amqpjobs.runtime.rate_rooms import WAITING_PER_PROCESS

    app = await publisher(broker, tmp_path)
    try:
        with rate_workers(broker, tmp_path, "--concurrency", "8", RATEAPP_RATE="1/h") as proc:
            await wait_for(lambda: _consumed(broker, ROOMS.waiting), 30, "the worker consuming the waiting room")
            await enqueue_all(app, [("limited", {})] * 10)

            async def moved() -> bool:  # all moved into the waiting room, and the worker took what it takes
                return (
                    await depth(broker, "work") == 0 and await depth(broker, ROOMS.waiting) == 10 - WAITING_PER_PROCESS
                )

            await wait_for(moved, 30, "the 10 moved into the waiting room, 2 of them held by the worker")
            proc.kill()
            proc.wait(10)
        back = await drain(broker, ROOMS.waiting)
    finally:
        await app.close()
    assert len(back) == 10
    assert sum(bool(m.redelivered) for m in back) == WAITING_PER_PROCESS == 2


async def _consumed(broker: BrokerSettings, queue: str) -> bool:
    return await consumers(broker, queue) == 1


async def test_a_token_queue_deleted_through_the_management_api_logs_no_library_error(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Tokens minted into a deleted token queue come back (``mandatory``): handled by us, not logged by aiormq."""
    app = await in_process_app(broker, tmp_path, "50/s")
    caplog.set_level("DEBUG", logger="aiormq")
    caplog.set_level("DEBUG", logger="aio_pika")
    caplog.set_level("INFO", logger="amqpjobs")
    async with running_worker(app, broker, concurrency=2, queues=("work",)) as (_, recorder):
        with ManagementClient(broker) as mgmt:
            for _ in range(100):  # the emitter mints
                if (mgmt.queue(broker.vhost, ROOMS.tokens) or {}).get("messages_ready"):
                    break
                await asyncio.sleep(0.1)
            mgmt.request("DELETE", f"/queues/{quote(broker.vhost, safe='')}/{quote(ROOMS.tokens, safe='')}")
        await asyncio.sleep(1.5)  # 75 tokens minted meanwhile: the first ones had no queue to go to
        for i in range(5):
            await app.enqueue("limited", {}, job_id=f"after-{i}")
        await recorder.wait_for(lambda outs: sum(o.kind == "succeeded" for o in outs) == 5, 15)  # tokens flow again
        await depth(broker, ROOMS.tokens)  # declared again
        running = list(caplog.records)  # (a shutdown may cancel a channel's RPC: aiormq warns then, not about this)
    await app.close()
    library = [r for r in running if r.name.startswith(("aiormq", "aio_pika")) and r.levelno >= logging.INFO]
    assert [(r.name, r.levelname, r.getMessage()[:120]) for r in library] == []
    returned = [r for r in caplog.records if r.name.startswith(("aiormq", "aio_pika")) and "return" in r.getMessage()]
    assert [r.getMessage()[:120] for r in returned] == []  # before: 82 "Unhandled message ... Basic.Return" errors
    said = [r.getMessage() for r in caplog.records if "declared it again" in r.getMessage()]
    assert len(said) == 1, said
    assert ROOMS.tokens in said[0]
    assert "(a token had no queue to go to; deleted by hand?)" in said[0]


@pytest.mark.serial
async def test_a_stop_of_2_processes_hands_each_waiting_delivery_back_once_per_child(
    broker: BrokerSettings, tmp_path: Path
):
    """A stopping child cancels its consumers before it hands back what waits for a token (README "Rate limits"),
    so no child takes back a copy it handed back itself. (A copy may still reach the other child, when that one
    has not yet cancelled: the broker's race, counted here.)"""
    import re
    import signal
    from collections import Counter

    app = await publisher(broker, tmp_path)
    try:
        with rate_workers(broker, tmp_path, "--processes", "2", "--concurrency", "4", "--grace", "10s",
                          RATEAPP_RATE="1/h") as proc:  # fmt: skip

            async def ready() -> bool:
                return [await consumers(broker, n) for n in ("work", ROOMS.waiting)] == [2, 2]

            await wait_for(ready, 60, "2 worker processes consuming the work queue and the waiting room")
            await enqueue_all(app, [("limited", {})] * 12)

            async def moved() -> bool:  # moved into the waiting room; each child holds 2 waiting
                return await depth(broker, "work") == 0 and await depth(broker, ROOMS.waiting) == 12 - 2 * 2

            await wait_for(moved, 30, "the 12 moved into the waiting room, 2 held by each child")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        out = (tmp_path / "worker.log").read_text()
        left = await depth(broker, "work") + await depth(broker, ROOMS.waiting)
    finally:
        await app.close()
    back = re.findall(r"\[child (\d)\] \S+ job=limited id=(\S+) attempt=\d+ duration=\S+ outcome=handed_back", out)
    per_child = Counter(back)
    per_id = Counter(job_id for _, job_id in back)
    stopping = [line for line in out.splitlines() if re.search(r"outcome=handed_back|worker stopped|draining", line)]
    print(f"handed_back per id: {sorted(per_id.values())}; {left} left", *stopping, sep="\n")
    assert left == 12  # none ran, none lost
    assert len(per_id) == 4  # the 2 waiting in each child
    assert set(per_child.values()) == {1}, stopping  # no child hands the same job back twice
    assert all(n <= 2 for n in per_id.values()), stopping  # at most once more, by the other child


async def test_a_redelivered_rate_limited_delivery_keeps_its_start(broker: BrokerSettings, tmp_path: Path) -> None:
    """Review 24 (1), the same fault in the move to the waiting room: a rate-limited job's delivery
    that comes back redelivered from its work queue (a worker started it in its slot, the move having
    failed, and died) is registered for its next start, not moved as a fresh one; it then runs alone
    with ``ctx.redelivered``."""
    app = await publisher(broker, tmp_path)
    runner = App("rateapp", topology=app.topology(), url=broker.url)
    seen: dict[str, bool] = {}

    async def limited(payload: dict[str, object], ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.redelivered

    runner.job("limited", queue="work", rate_limit="100/s")(limited)
    await app.enqueue("limited", {}, job_id="redo")
    async with raw_channel(broker) as holder:
        queue = await holder.get_queue("work", ensure=False)
        held = await queue.get(no_ack=False)
        assert held is not None
        assert held.message_id == "redo"
    # the holder's connection closed: "redo" is back in "work", redelivered
    async with running_worker(runner, broker, concurrency=2) as (_, recorder):
        await recorder.wait_for(lambda o: any(x.job_id == "redo" and x.kind == "succeeded" for x in o), timeout=20)
    kinds = [x.kind for x in recorder.outcomes if x.job_id == "redo"]
    assert seen == {"redo": True}, (seen, kinds)
    assert kinds == ["redelivered", "succeeded"], kinds
    await app.close()


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_a_quorum_waiting_room_marks_no_job_redelivered_that_never_started(
    broker: BrokerSettings, tmp_path: Path, concurrency: int
) -> None:
    """Review 25 (2): consuming the waiting room again after each token (cancel, then consume) made a
    quorum waiting room return the delivery on its way to the cancelled consumer marked redelivered,
    taken for a crashed start (a WARNING, run alone, a start charged): 9 of 29 jobs here. No worker
    dies in this test, so no job may come back redelivered while it runs (a stop's cancel may: README)."""
    path = tmp_path / "topology.toml"
    path.write_text(TOPOLOGY.replace('retry_tiers = ["1s"]', 'retry_tiers = ["1s"]\ntype = "quorum"'))
    await apply_topology(path, broker)
    app = App("pub", topology=load_topology(path).topology, url=broker.url)
    app.job("limited", queue="work")(lambda p, c: None)
    runner = App("rateapp", topology=app.topology(), url=broker.url)
    seen: dict[str, bool] = {}

    async def limited(payload: dict[str, object], ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.redelivered

    runner.job("limited", queue="work", rate_limit="20/s")(limited)
    try:
        for i in range(40):
            await app.enqueue("limited", {}, job_id=f"j-{i}")
        async with running_worker(runner, broker, concurrency=concurrency) as (_, recorder):
            await recorder.wait_for(lambda o: sum(x.kind == "succeeded" for x in o) >= 30, timeout=30)
            kinds = Counter(x.kind for x in recorder.outcomes)
            again = [job for job, redelivered in seen.items() if redelivered]
    finally:
        await app.close()
    print(f"concurrency {concurrency}: {dict(kinds)}")
    assert kinds["redelivered"] == 0, kinds
    assert again == [], again


async def test_a_suspect_runs_with_no_delivery_waiting_for_a_token_beside_it(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Review 25 (1): a suspect runs alone, "with nothing else held" (README "When a job crashes"). The
    deliveries of a rate-limited job waiting for a token stayed held during the turn, so a suspect that
    killed its process sent them back redelivered, charged with its crash (2 a crash). They are handed
    back unstarted before the suspect starts, and come back to wait once the turn is over."""
    app = await publisher(broker, tmp_path)
    runner = App("rateapp", topology=app.topology(), url=broker.url)
    held_beside: list[int] = []
    worker: Worker | None = None

    def waiting_here() -> int:
        assert worker is not None
        assert worker._rates is not None
        return sum(r.source._held for r in worker._rates.rooms.values() if r.source is not None)

    async def other(payload: dict[str, object], ctx: JobContext) -> None:
        if ctx.job_id == "redo":
            held_beside.append(waiting_here())

    runner.job("limited", queue="work", rate_limit="1/h")(lambda p, c: None)
    runner.job("other", queue="work")(other)
    await app.enqueue("other", {}, job_id="redo")
    recorder = Recorder()
    worker = Worker(runner, broker, WorkerOptions(concurrency=4, grace=10), recorder)
    try:
        async with raw_channel(broker) as holder:
            queue = await holder.get_queue("work", ensure=False)
            held = await queue.get(no_ack=False)
            assert held is not None
            await worker.start()
            await app.enqueue("limited", {}, job_id="first")  # takes the hour's one token and runs
            for i in range(3):
                await app.enqueue("limited", {}, job_id=f"waits-{i}")
            deadline = time.monotonic() + 10
            while waiting_here() < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert waiting_here() == 2  # two wait for a token in this process, the third in the room
        # the holder's connection closed: "redo" is back in "work", redelivered: a suspect
        await recorder.wait_for(lambda o: any(x.job_id == "redo" and x.kind == "succeeded" for x in o), timeout=20)
        deadline = time.monotonic() + 10
        while waiting_here() < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        after = waiting_here()
    finally:
        await worker.shutdown()
        await app.close()
    kinds = Counter((x.job_id, x.kind) for x in recorder.outcomes)
    print(f"held beside the suspect: {held_beside}; outcomes: {dict(kinds)}")
    assert held_beside == [0], kinds
    assert after == 2  # waiting again after the turn
    assert kinds[("redo", "redelivered")] == 1, kinds
    assert not [k for k in kinds if k[1] == "redelivered" and k[0] != "redo"], kinds
