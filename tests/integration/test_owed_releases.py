"""Ledger writes owed while the ledger was away are paid once it answers; a dead worker's claim waits.

A claim the worker gave up is released, a succeeded run's done-mark is written (and answers DONE
here meanwhile).

README "Idempotency". The ledger's PostgreSQL is reached through a TCP proxy of the test's
own (stopped and started here); the shared server is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.runtime.ledger import Claim, SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.pg_connection import CONNECT_TIMEOUT
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth, effects_database
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_ledger_outage import effects, proxied
from tests.integration.worker_env import APPLIED_TOPOLOGY, Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the ledger side: any broker version


@pytest.fixture
def effects_db(pg_url: str) -> Iterator[str]:
    """A fresh database with an ``effects`` table (no unique constraint): its URL."""
    with effects_database(pg_url) as url:
        yield url


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(120)
async def test_a_release_that_failed_in_an_outage_is_paid_when_the_ledger_returns(
    broker: BrokerSettings, tmp_path: Path, effects_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fresh user's MEDIUM: the database goes away INSIDE three handlers' ``ctx.transaction()`` (the
    commit fails: an attempt used), so releasing their claims fails too. The retries run within seconds of
    the database's return, not once the 60 s lease ran out (before: ``deferred`` by their own stale claim,
    about once a second), each effect exactly once; one log line per claim when owed, one when paid."""
    keys = ("k1", "k2", "k3")
    runs: list[str] = []
    ran_at: dict[str, float] = {}
    inside = threading.Semaphore(0)
    cut = threading.Event()
    base = await make_app(broker, tmp_path)
    async with proxied(effects_db) as (proxy, dsn):
        app = App("idem", topology=base.topology(), url=broker.url, ledger=PostgresLedger(dsn))

        @app.job("charge", queue="work", idempotent=True, lease=60)
        def charge(payload: dict[str, Any], ctx: JobContext) -> None:
            runs.append(ctx.job_id)
            ran_at[ctx.job_id] = time.monotonic()
            with ctx.transaction() as db:
                db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))
                if ctx.attempt == 1:  # the database goes away before the commit
                    inside.release()
                    cut.wait(30)

        caplog.set_level(logging.INFO, logger="amqpjobs")
        async with running_worker(app, broker, concurrency=3) as (_, rec):
            for key in keys:
                await app.enqueue("charge", {}, job_id=key)
            for _ in keys:
                assert await asyncio.to_thread(inside.acquire, True, 30)
            await proxy.stop()
            cut.set()
            await rec.wait_for(lambda o: sum(x.kind == "retried" for x in o) == 3, timeout=20)
            await asyncio.sleep(3)  # the retries come back (0.2 s tier) and wait for the ledger in their slots
            await proxy.start()
            back = time.monotonic()
            with contextlib.suppress(TimeoutError):  # closed below before any assertion (no connection left open)
                await rec.wait_for(lambda o: sum(x.kind == "succeeded" for x in o) == 3, timeout=20)
        await app.close()
    late = [(o.job_id, o.kind, o.failure[0]) for o in rec.outcomes if o.kind not in ("retried", "succeeded")]
    assert not late, f"waited after the ledger's return: {late[:6]} ({len(late)} in all)"
    assert Counter(runs) == {"k1": 2, "k2": 2, "k3": 2}  # the failed attempt, then the retry
    assert sorted(effects(effects_db)) == list(keys)  # the first transactions rolled back: one effect each
    took = max(ran_at.values()) - back
    assert took <= 4.0, took  # paced tries: the longest pause between two is 2 s
    lines = sorted(f"{r.levelname} {r.getMessage()}" for r in caplog.records if "the claim on job id" in r.getMessage())
    assert len(lines) == 6, lines  # one when owed, one when paid, per claim: none per try
    for key, line in zip(keys, lines[:3], strict=True):
        assert line.startswith(f"INFO released the claim on job id {key} after "), lines
    for key, line in zip(keys, lines[3:], strict=True):
        assert line.startswith(f"WARNING releasing the claim on job id {key} failed (LedgerUnavailableError: the "
                               "PostgreSQL ledger "), lines  # fmt: skip
        assert line.endswith("; released as soon as the ledger answers"), lines


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(120)
async def test_a_done_mark_that_failed_after_the_handler_succeeded_is_owed_and_the_job_succeeds(
    broker: BrokerSettings, tmp_path: Path, effects_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """HIGH (README: never run a side effect twice): the database goes away between the handler's return and
    its done-mark (the handler, without ``ctx.transaction()``, stops the proxy itself). The run is a success
    (acked, not quarantined as ``worker-error`` with its claim left running), the done-mark is owed: the same
    key meanwhile runs nothing (``duplicate``, answered here), the mark is written within seconds of the
    return, and the key enqueued again afterwards runs nothing. One log line when owed, one when paid."""
    import psycopg

    runs: list[str] = []
    loop = asyncio.get_running_loop()
    base = await make_app(broker, tmp_path)
    state: list[Any] = []
    async with proxied(effects_db) as (proxy, dsn):
        app = App("idem", topology=base.topology(), url=broker.url, ledger=PostgresLedger(dsn))

        @app.job("charge", queue="work", idempotent=True, lease=60)
        def charge(payload: dict[str, Any], ctx: JobContext) -> None:
            runs.append(ctx.job_id)
            with psycopg.connect(effects_db, autocommit=True) as db:  # the effect, outside the ledger
                db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))
            if len(runs) == 1:  # the database goes away after the effect, before the done-mark
                asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)

        caplog.set_level(logging.INFO, logger="amqpjobs")
        async with running_worker(app, broker) as (_, rec):
            with contextlib.suppress(TimeoutError):  # asserted below, after the worker stopped
                await app.enqueue("charge", {}, job_id="d1")
                await rec.wait_for(lambda o: len(o) == 1, timeout=20)
                await app.enqueue("charge", {}, job_id="d1")  # the same key while the mark is owed
                await rec.wait_for(lambda o: len(o) == 2, timeout=20)
            await proxy.start()
            back = time.monotonic()
            while time.monotonic() - back < 10:
                with psycopg.connect(effects_db) as db:
                    state = db.execute("SELECT state FROM amqpjobs_ledger WHERE key = 'd1'").fetchall()
                if state == [("done",)]:
                    break
                await asyncio.sleep(0.1)
            took = time.monotonic() - back
            with contextlib.suppress(TimeoutError):
                await app.enqueue("charge", {}, job_id="d1")  # afterwards: the ledger says done
                await rec.wait_for(lambda o: len(o) == 3, timeout=20)
        await app.close()
    quarantined = await depth(broker, "work.quarantine")
    seen = [(o.kind, o.ran, o.failure[0]) for o in rec.outcomes]
    assert seen == [("succeeded", True, ""), ("duplicate", False, ""), ("duplicate", False, "")], seen
    assert quarantined == 0
    assert runs == ["d1"]
    assert effects(effects_db) == ["d1"]
    assert state == [("done",)]
    assert took <= 4.0, took  # paced tries: the longest pause between two is 2 s
    lines = [f"{r.levelname} {r.getMessage()}" for r in caplog.records if "done-mark of job id" in r.getMessage()]
    assert len(lines) == 2, lines  # one when owed, one when paid: none per try
    assert lines[0].startswith("WARNING writing the done-mark of job id d1 failed (LedgerUnavailableError: the "
                               "PostgreSQL ledger "), lines  # fmt: skip
    assert lines[0].endswith("); the run succeeded: written as soon as the ledger answers"), lines
    assert lines[1].startswith("INFO wrote the done-mark of job id d1 after "), lines
    assert lines[1].endswith("s owed"), lines


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(120)
async def test_a_killed_workers_claim_still_waits_for_its_lease(
    broker: BrokerSettings, tmp_path: Path, effects_db: str
) -> None:
    """The crash rule stays: a worker killed (SIGKILL) mid-handler owes nothing it could pay, so its claim is
    taken over only once its lease (6 s) has run out; meanwhile the redelivered job waits (``deferred``)."""
    import psycopg

    base = await make_app(broker, tmp_path)
    topo = tmp_path / "proc.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    env = dict(os.environ, AMQPJOBS_URL=broker.url, LEDGERAPP_TOPOLOGY=str(topo), LEDGERAPP_LEDGER=effects_db,
               LEDGERAPP_LEASE="6")  # fmt: skip
    exe = str(Path(sys.executable).with_name("amqpjobs"))

    def spawn() -> subprocess.Popen[bytes]:
        with (tmp_path / "first.log").open("w") as out:
            return subprocess.Popen([exe, "consume", "tests.integration.ledgerapp:app"], cwd=ROOT, env=env,
                                    stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    first = spawn()
    app = App("idem", topology=base.topology(), url=broker.url, ledger=PostgresLedger(effects_db))
    ran_at: list[float] = []

    @app.job("insert", queue="work", idempotent=True, lease=6)
    def insert(payload: dict[str, Any], ctx: JobContext) -> None:
        ran_at.append(time.time())
        with ctx.transaction() as db:
            db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))

    try:
        await app.enqueue("insert", {"before": 60}, job_id="lost")  # the first worker's run holds its claim
        expires_at = None
        deadline = time.monotonic() + 30
        while expires_at is None and time.monotonic() < deadline:
            with psycopg.connect(effects_db) as db, contextlib.suppress(psycopg.errors.UndefinedTable):
                row: Any = None  # the worker has not made its table yet
                row = db.execute("SELECT expires_at FROM amqpjobs_ledger WHERE key = 'lost' AND state = "
                                 "'running'").fetchone()  # fmt: skip
            expires_at = row[0] if row else None
            await asyncio.sleep(0.1)
        assert expires_at is not None, (tmp_path / "first.log").read_text()
    finally:
        first.kill()
        first.wait(10)
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: any(x.kind == "succeeded" for x in o), timeout=40)
    await app.close()
    assert effects(effects_db) == ["lost"]
    assert len(ran_at) == 1
    assert expires_at <= ran_at[0] <= expires_at + 3, ran_at[0] - expires_at  # taken over at the lease's end
    waited = [o for o in rec.outcomes if o.kind == "deferred"]
    assert waited, [o.kind for o in rec.outcomes]
    assert {o.failure[0] for o in waited} == {"ClaimBusy"}, [o.failure for o in waited]


@pytest.mark.timeout(60)
async def test_a_worker_stopping_past_its_grace_releases_a_cancelled_runs_claim_not_a_threads(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """At stop, past the grace period, an async handler is cancelled: its run is over, so its claim is
    released and the redelivered job runs at once elsewhere (before: BUSY for the 60 s lease). A plain-function
    handler's thread can't be stopped and may still commit: its claim stays until its lease runs out (the worker,
    awaited in-process, keeps its connection and the delivery until that thread ends)."""
    base = await make_app(broker, tmp_path)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    app = App("idem", topology=base.topology(), url=broker.url, ledger=ledger)
    started: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    finish = threading.Event()

    @app.job("slow_async", queue="work", idempotent=True, lease=60)
    async def slow_async(payload: dict[str, Any], ctx: JobContext) -> None:
        started.put_nowait(ctx.job_id)
        await asyncio.sleep(60)

    @app.job("slow_thread", queue="work", idempotent=True, lease=60)
    def slow_thread(payload: dict[str, Any], ctx: JobContext) -> None:
        loop.call_soon_threadsafe(started.put_nowait, ctx.job_id)
        finish.wait(30)

    rec = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=0.5), rec)
    await worker.start()
    stopping = None
    try:
        await app.enqueue("slow_async", {}, job_id="a1")
        await app.enqueue("slow_thread", {}, job_id="t1")
        assert {await asyncio.wait_for(started.get(), 20) for _ in range(2)} == {"a1", "t1"}
        # both still running after the grace period; the worker then waits for the thread (README "Workers")
        stopping = asyncio.create_task(worker.shutdown())
        for _ in range(100):  # the async run is cancelled at the grace (0.5 s) and its claim released
            if (a1 := await ledger.claim("a1", "another-worker", 60)) is Claim.CLAIMED:
                break
            await asyncio.sleep(0.05)
        assert a1 is Claim.CLAIMED
        assert not stopping.done()  # the thread runs on
        assert await ledger.claim("t1", "another-worker", 60) is Claim.BUSY
    finally:
        finish.set()
        assert await (stopping if stopping is not None else worker.shutdown()) == 1
        await app.close()


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(90)
async def test_waiting_on_another_workers_live_claim_logs_a_deferral_line_at_most_every_10s(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The fresh user's LOW: a copy waiting on a live claim elsewhere logged one ``outcome=deferred ... ClaimBusy``
    INFO line per pass of the first retry tier (1 s) for the whole lease (about 3,400 with the default lease).
    Now one when it starts waiting, then at most one per 10 s, naming how many were not logged; the outcomes
    (events, metrics, ``on_outcome``) still count each deferral."""
    base = await make_app(broker, tmp_path)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    app = App("idem", topology=base.topology(), url=broker.url, ledger=ledger)
    runs: list[str] = []

    @app.job("insert", queue="work", idempotent=True, lease=60)
    def insert(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    assert await ledger.claim("busy", "another-worker", 25) is Claim.CLAIMED  # live for 25 s, then taken over
    caplog.set_level(logging.INFO, logger="amqpjobs")
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("insert", {}, job_id="busy")
        await rec.wait_for(lambda o: any(x.kind == "succeeded" for x in o), timeout=60)
    await app.close()
    assert runs == ["busy"]
    deferred = [o for o in rec.outcomes if o.kind == "deferred"]
    assert len(deferred) >= 15, len(deferred)  # every pass is an outcome (about one a second)
    assert {o.failure[0] for o in deferred} == {"ClaimBusy"}
    lines = [r.getMessage() for r in caplog.records if "outcome=deferred" in r.getMessage()]
    assert len(lines) == 3, lines  # at about 0 s, 10 s and 20 s
    assert lines[0].endswith(
        'error="ClaimBusy: another run holds a live claim on this job id (in this worker or another)"; '
        "logged at most every 10s per job id while it waits"
    ), lines[0]
    unlogged = [int(line.rsplit(" (", 1)[1].split(" ")[0]) for line in lines[1:]]
    assert all(n >= 20 for n in unlogged), unlogged  # 10 s of passes through the 200 ms tier
    assert sum(unlogged) + len(lines) <= len(deferred), (unlogged, len(deferred))  # the rest: after the last line
    assert all(line.endswith(" more not logged since the last line)") for line in lines[1:]), lines


@asynccontextmanager
async def black_holing_app(
    broker: BrokerSettings, tmp_path: Path, database: str
) -> AsyncIterator[tuple[App, TcpProxy, Callable[[], None], list[float]]]:
    """App ``idem`` (the test topology) whose PostgresLedger reaches ``database`` through a TCP proxy: the app, the
    proxy, ``black_hole()`` (cut the network both ways, keeping the connections open; call it on the loop) and
    the monotonic times it was called at."""
    base = await make_app(broker, tmp_path)
    holed: list[float] = []
    async with proxied(database) as (proxy, dsn):
        app = App("idem", topology=base.topology(), url=broker.url, ledger=PostgresLedger(dsn))

        def black_hole() -> None:
            proxy.black_hole()
            holed.append(time.monotonic())

        yield app, proxy, black_hole, holed


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(90)
async def test_a_done_mark_over_a_black_holed_connection_is_owed_within_the_bound(
    broker: BrokerSettings, tmp_path: Path, effects_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fresh user's HIGH: the network is cut under the ESTABLISHED ledger connection, no reset (the proxy
    keeps it open and drops every byte, both ways). The done-mark gets no answer: within the bound
    (``CONNECT_TIMEOUT``, the connect's patience) the connection is closed and the mark owed, the job
    succeeded; another key meanwhile waits (``deferred``), it does not hang behind the mark. After the
    network is back the mark is written, the same key is a duplicate and the other key runs: one effect
    each (before: the done-mark hung for good, the other claim behind it, and a stop left the key to run
    again)."""
    import psycopg

    runs: list[str] = []
    loop = asyncio.get_running_loop()
    state: list[Any] = []
    async with black_holing_app(broker, tmp_path, effects_db) as (app, proxy, black_hole, holed):

        @app.job("charge", queue="work", idempotent=True, lease=60)
        def charge(payload: dict[str, Any], ctx: JobContext) -> None:
            runs.append(ctx.job_id)
            with psycopg.connect(effects_db, autocommit=True) as db:  # the effect, outside the ledger
                db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))
            if len(runs) == 1:  # the network is cut after the effect, before the done-mark
                loop.call_soon_threadsafe(black_hole)

        caplog.set_level(logging.INFO, logger="amqpjobs")
        async with running_worker(app, broker, concurrency=2) as (_, rec):
            await app.enqueue("charge", {}, job_id="d1")
            await rec.wait_for(lambda o: len(o) == 1, timeout=20)  # main: hangs here (the mark never returns)
            owed_after = time.monotonic() - holed[0]
            await app.enqueue("charge", {}, job_id="d2")  # another key during the cut: waits, never hangs
            await rec.wait_for(lambda o: any(x.kind == "deferred" for x in o), timeout=25)
            await app.enqueue("charge", {}, job_id="d1")  # the same key while the mark is owed
            await rec.wait_for(lambda o: [x.job_id for x in o if x.kind == "duplicate"] == ["d1"], timeout=20)
            proxy.black_hole(False)
            back = time.monotonic()
            while time.monotonic() - back < 10:
                with psycopg.connect(effects_db) as db:
                    state = db.execute("SELECT state FROM amqpjobs_ledger WHERE key = 'd1'").fetchall()
                if state == [("done",)]:
                    break
                await asyncio.sleep(0.1)
            took = time.monotonic() - back
            await rec.wait_for(lambda o: any(x.kind == "succeeded" and x.job_id == "d2" for x in o), timeout=25)
            await app.enqueue("charge", {}, job_id="d1")  # afterwards: the ledger says done
            await rec.wait_for(lambda o: sum(x.job_id == "d1" and x.kind == "duplicate" for x in o) == 2, timeout=20)
        await app.close()
    seen = [(o.job_id, o.kind, o.failure[0]) for o in rec.outcomes]
    assert seen[0] == ("d1", "succeeded", ""), seen
    away = "amqpjobs.errors.LedgerUnavailableError"
    assert set(seen[1:]) == {("d2", "deferred", away), ("d1", "duplicate", ""), ("d2", "succeeded", "")}, seen
    assert CONNECT_TIMEOUT - 0.5 <= owed_after <= CONNECT_TIMEOUT + 2.0, owed_after
    assert Counter(runs) == {"d1": 1, "d2": 1}
    assert effects(effects_db) == ["d1", "d2"]
    assert state == [("done",)]
    assert took <= 4.0, took  # paced tries: the longest pause between two is 2 s
    lines = [f"{r.levelname} {r.getMessage()}" for r in caplog.records if "done-mark of job id" in r.getMessage()]
    assert len(lines) == 2, lines  # one when owed, one when paid: none per try
    assert lines[0] == ("WARNING writing the done-mark of job id d1 failed (LedgerUnavailableError: the PostgreSQL "
                        f"ledger got no answer within {CONNECT_TIMEOUT}s: its connection was closed); the run "
                        "succeeded: written as soon as the ledger answers"), lines  # fmt: skip
    assert lines[1].startswith("INFO wrote the done-mark of job id d1 after "), lines


@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(90)
async def test_a_transaction_commit_over_a_black_holed_connection_fails_within_the_bound(
    broker: BrokerSettings, tmp_path: Path, effects_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same cut INSIDE a handler's ``ctx.transaction()`` (both ledger connections black-holed before the
    done-mark and the commit): the commit fails within the bound (an attempt used, the claim's release owed,
    the effect rolled back), not hangs the handler thread for good; once the network is back the retry runs
    and commits: one effect."""
    runs: list[tuple[str, int]] = []
    loop = asyncio.get_running_loop()
    failed: list[float] = []
    async with black_holing_app(broker, tmp_path, effects_db) as (app, proxy, black_hole, holed):

        @app.job("charge", queue="work", idempotent=True, lease=60)
        def charge(payload: dict[str, Any], ctx: JobContext) -> None:
            runs.append((ctx.job_id, ctx.attempt))
            try:
                with ctx.transaction() as db:
                    db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))
                    if ctx.attempt == 1:  # the network is cut before the done-mark and the commit
                        loop.call_soon_threadsafe(black_hole)
                        while not holed:
                            time.sleep(0.01)
            except Exception:
                failed.append(time.monotonic())
                raise

        caplog.set_level(logging.INFO, logger="amqpjobs")
        async with running_worker(app, broker) as (_, rec):
            await app.enqueue("charge", {}, job_id="t1")
            await rec.wait_for(lambda o: len(o) == 1, timeout=25)  # main: hangs here (the commit never returns)
            proxy.black_hole(False)
            await rec.wait_for(lambda o: any(x.kind == "succeeded" for x in o), timeout=25)
        await app.close()
    seen = [(o.kind, o.failure[0]) for o in rec.outcomes]
    assert seen[0] == ("retried", "psycopg.OperationalError"), seen
    assert seen[-1] == ("succeeded", ""), seen
    failed_after = failed[0] - holed[0]
    assert CONNECT_TIMEOUT - 0.5 <= failed_after <= CONNECT_TIMEOUT + 2.0, failed_after
    assert runs == [("t1", 1), ("t1", 2)], runs
    assert effects(effects_db) == ["t1"]
    failure = rec.outcomes[0].failure[1]
    assert failure == f"the PostgreSQL ledger got no answer within {CONNECT_TIMEOUT}s: its connection was closed"
