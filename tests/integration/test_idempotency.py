"""Exactly-once effect: the idempotency ledger (SQLite and PostgreSQL) against the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs import App, ConfigurationError, JobContext, Worker, WorkerOptions
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.runtime.ledger import Claim, Ledger, SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth, effects_database, fresh_database, raw_channel
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app, running_worker

pytestmark = pytest.mark.broker


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger database with an ``effects`` table (no unique constraint), as a LEDGERAPP_LEDGER spec."""
    if request.param == "sqlite":
        path = tmp_path / "ledger.db"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
        yield f"sqlite:{path}"
        return
    with effects_database(request.getfixturevalue("pg_url")) as url:
        yield url


def make_ledger(spec: str) -> Ledger:
    return SqliteLedger(spec.removeprefix("sqlite:")) if spec.startswith("sqlite:") else PostgresLedger(spec)


def effects(spec: str) -> list[str]:
    if spec.startswith("sqlite:"):
        with sqlite3.connect(spec.removeprefix("sqlite:")) as db:
            return [r[0] for r in db.execute("SELECT job_id FROM effects")]
    import psycopg

    with psycopg.connect(spec) as db:
        return [r[0] for r in db.execute("SELECT job_id FROM effects").fetchall()]


async def idempotent_app(broker: BrokerSettings, tmp_path: Path, spec: str, runs: list[str], sleep: float = 0) -> App:
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=make_ledger(spec))
    marker = "?" if spec.startswith("sqlite:") else "%s"

    @app.job("charge", queue="work", idempotent=True, lease=5, key=lambda p: f"charge:{p['order']}")
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        time.sleep(sleep)  # holding the claim, not a lock of the database (SQLite's would make a claim wait)
        with ctx.transaction() as db:
            db.execute(f"INSERT INTO effects (job_id) VALUES ({marker})", (ctx.job_id,))

    return app


async def test_same_id_enqueued_twice_runs_once(broker: BrokerSettings, tmp_path: Path, ledger_spec: str):
    runs: list[str] = []
    app = await idempotent_app(broker, tmp_path, ledger_spec, runs)
    async with running_worker(app, broker) as (_, rec):
        first = await app.enqueue("charge", {"order": 17})
        second = await app.enqueue("charge", {"order": 17})
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert first == second == "charge:17"  # the id from the job's key function
    assert runs == ["charge:17"]
    assert effects(ledger_spec) == ["charge:17"]
    assert [o.kind for o in rec.outcomes] == ["succeeded", "duplicate"]


async def test_concurrent_duplicate_on_two_workers_runs_once(broker: BrokerSettings, tmp_path: Path, ledger_spec: str):
    runs: list[str] = []
    app = await idempotent_app(broker, tmp_path, ledger_spec, runs, sleep=1.0)
    other: list[Any] = []
    async with running_worker(app, broker) as (_, rec):
        second = Worker(app, broker, WorkerOptions(queues=("work",)), other.append)
        await second.start()
        try:
            await app.enqueue("charge", {"order": 5}, job_id="pay-5")
            await app.enqueue("charge", {"order": 5}, job_id="pay-5")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                kinds = sorted(o.kind for o in [*rec.outcomes, *other])
                if "succeeded" in kinds and "duplicate" in kinds:
                    break
                await asyncio.sleep(0.1)
        finally:
            await second.shutdown()
    await app.close()
    kinds = sorted(o.kind for o in [*rec.outcomes, *other])
    assert runs == ["pay-5"]
    assert effects(ledger_spec) == ["pay-5"]
    assert kinds.count("succeeded") == 1
    assert kinds.count("duplicate") == 1
    # the other worker found the live claim: its delivery waited in the first tier, once or more, using no attempt
    assert kinds.count("deferred") >= 1, kinds
    assert set(kinds) == {"succeeded", "duplicate", "deferred"}
    assert {o.attempt for o in [*rec.outcomes, *other]} == {1}
    assert "retried" not in kinds  # waiting for a claim is not a failure
    assert await depth(broker, "work") == 0


async def test_replaying_a_done_job_runs_nothing(broker: BrokerSettings, tmp_path: Path, ledger_spec: str):
    runs: list[str] = []
    app = await idempotent_app(broker, tmp_path, ledger_spec, runs)
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("charge", {"order": 9})
        await rec.wait_for(lambda o: len(o) == 1)
        # the same job, quarantined earlier by some failure, now replayed
        import aio_pika

        failure = evidence.Failure("exhausted", "ValueError", "boom", "", 4, "", "", "h", 1, "", "", "jobs", "work",
                                   "work", "charge", "charge:9", "")  # fmt: skip
        async with raw_channel(broker) as ch:
            ex = await ch.get_exchange("work.quarantine")
            await ex.publish(aio_pika.Message(b'{"order": 9}', message_id="charge:9", type="charge",
                                              content_type="application/json",
                                              headers={envelope.ATTEMPT: 4, **evidence.evidence_headers(failure)}),
                             routing_key="work")  # fmt: skip
        report = await replay(broker, "work", ReplayOptions(rate=100))
        assert report.replayed == 1
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert runs == ["charge:9"]
    assert effects(ledger_spec) == ["charge:9"]
    assert [o.kind for o in rec.outcomes] == ["succeeded", "duplicate"]


async def test_too_short_retention_is_refused_at_start(broker: BrokerSettings, tmp_path: Path):
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url,
              ledger=SqliteLedger(tmp_path / "l.db", retention="1h"), quarantine_retention="7d")  # fmt: skip
    app.job("charge", queue="work", idempotent=True)(lambda p, c: None)
    with pytest.raises(ConfigurationError) as info:
        await Worker(app, broker, WorkerOptions(queues=("work",))).start()
    text = str(info.value)
    assert "keeps done-markers 3600s" in text
    assert "retry window (1.2s) plus the quarantine retention (604800s) = 604801s" in text
    assert "would run its effect again" in text
    no_ledger = App("idem", topology=base.topology(), url=broker.url)
    no_ledger.job("charge", queue="work", idempotent=True)(lambda p, c: None)
    with pytest.raises(ConfigurationError, match="has no ledger"):
        await Worker(no_ledger, broker, WorkerOptions(queues=("work",))).start()


async def test_ledger_claims_and_prunes(tmp_path: Path, ledger_spec: str):
    ledger = make_ledger(ledger_spec)
    try:
        assert await ledger.claim("k", "a", 0.5) is Claim.CLAIMED
        assert await ledger.claim("k", "b", 0.5) is Claim.BUSY
        await asyncio.sleep(0.6)
        assert await ledger.claim("k", "b", 5) is Claim.CLAIMED  # a's lease expired: taken over
        await ledger.release("k", "a")  # a no longer holds it: no effect
        assert await ledger.claim("k", "c", 5) is Claim.BUSY
        assert await ledger.done("k", "b") is True
        assert await ledger.claim("k", "c", 5) is Claim.DONE
        assert await ledger.done("k", "c") is False
        await ledger.release("k", "b")  # done markers stay
        assert await ledger.claim("k", "d", 5) is Claim.DONE
        assert await ledger.prune(3600) == 0
        await asyncio.sleep(0.05)
        assert await ledger.prune(0.01) == 1
        assert await ledger.claim("k", "e", 5) is Claim.CLAIMED
    finally:
        await ledger.close()


@pytest.mark.version_independent
async def test_a_postgres_prune_of_many_rows_goes_in_batches_and_keeps_the_fresh_ones(pg_url: str) -> None:
    """Each use of the connection is bounded (CONNECT_TIMEOUT), so a prune deletes PRUNE_BATCH rows per statement:
    a backlog of exactly two batches and a few rows more all go, the fresh done-markers and the claims stay."""
    import psycopg

    from amqpjobs.runtime.pg_connection import PRUNE_BATCH

    with fresh_database(pg_url) as url:
        ledger = PostgresLedger(url)
        try:
            assert await ledger.claim("fresh", "a", 60) is Claim.CLAIMED  # creates the table
            assert await ledger.done("fresh", "a") is True
            assert await ledger.claim("running", "a", 60) is Claim.CLAIMED
            old = time.time() - 7200
            with psycopg.connect(url, autocommit=True) as db:
                db.execute("INSERT INTO amqpjobs_ledger (key, state, owner, expires_at, updated_at) "
                           "SELECT 'old:' || i, 'done', 'w', %s, %s FROM generate_series(1, %s) AS i",
                           (old, old, 2 * PRUNE_BATCH + 3))  # fmt: skip
            assert await ledger.prune(3600) == 2 * PRUNE_BATCH + 3
            assert await ledger.prune(3600) == 0
            with psycopg.connect(url) as db:
                left = sorted(r[0] for r in db.execute("SELECT key FROM amqpjobs_ledger"))
            assert left == ["fresh", "running"]
        finally:
            await ledger.close()


async def test_a_key_with_a_nul_is_a_key_like_any_other(tmp_path: Path, ledger_spec: str):
    """A job id (the default key) may carry a NUL, which PostgreSQL text can't hold: never 'the ledger is down'."""
    ledger = make_ledger(ledger_spec)
    key = "charge:\x00 7"
    try:
        assert await ledger.claim(key, "a", 5) is Claim.CLAIMED
        assert await ledger.claim(key, "b", 5) is Claim.BUSY
        assert await ledger.claim("charge:", "b", 5) is Claim.CLAIMED  # another key
        assert await ledger.done(key, "a") is True
        assert await ledger.claim(key, "c", 5) is Claim.DONE
        assert await ledger.claim("t\x00", "a", 5) is Claim.CLAIMED

        def effect() -> None:
            with ledger.transaction("t\x00", "a"):
                pass

        await asyncio.to_thread(effect)
        assert await ledger.claim("t\x00", "b", 5) is Claim.DONE
        await ledger.release("charge:", "b")
        assert await ledger.claim("charge:", "c", 5) is Claim.CLAIMED
    finally:
        await ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_chaos_kill_9_twenty_times_exactly_one_effect_each(
    broker: BrokerSettings, tmp_path: Path, ledger_spec: str
):
    base = await make_app(broker, tmp_path)
    topo = tmp_path / "proc.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    env = dict(
        os.environ, AMQPJOBS_URL=broker.url, LEDGERAPP_TOPOLOGY=str(topo), LEDGERAPP_LEDGER=ledger_spec,
        LEDGERAPP_LEASE="2",
    )  # fmt: skip
    exe = str(Path(sys.executable).with_name("amqpjobs"))
    log = (tmp_path / "workers.log").open("a")

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([exe, "consume", "tests.integration.ledgerapp:app", "--concurrency", "2"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    publisher = App("pub", topology=base.topology(), url=broker.url)
    publisher.job("insert", queue="work")(lambda p, c: None)
    workers = [spawn(), spawn()]
    rng = random.Random(7)
    kills = 0
    try:
        for i in range(1000):
            await publisher.enqueue("insert", {"sleep": 0.01}, job_id=f"row-{i}")
        while kills < 20:
            await asyncio.sleep(rng.uniform(0.3, 0.9))
            victim = rng.randrange(2)
            workers[victim].kill()  # SIGKILL, mid-whatever
            workers[victim].wait(10)
            kills += 1
            workers[victim] = spawn()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if len(set(effects(ledger_spec))) >= 1000 and await depth(broker, "work") == 0:
                break
            await asyncio.sleep(0.5)
        # two runs of one job at once: the first outlives its 2 s lease before its transaction, the second
        # (deferred while the claim lived) takes the expired claim over; the first commits first, so the
        # second's transaction finds the job done: rolled back, counted as a duplicate
        for pair in ("late-0", "late-1"):
            await publisher.enqueue("insert", {"before": 4}, job_id=pair)
            await publisher.enqueue("insert", {"before": 4}, job_id=pair)
        await publisher.close()
        settled = re.compile(r"id=(late-\d) attempt=1 duration=([\d.]+)s outcome=(succeeded|duplicate)")
        while time.monotonic() < deadline:
            if len(settled.findall((tmp_path / "workers.log").read_text())) >= 4:  # both deliveries of each
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)  # anything still bouncing through a tier
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
        log.close()
    rows = effects(ledger_spec)
    assert kills == 20
    assert len(rows) == 1002, f"{len(rows)} rows, {len(rows) - len(set(rows))} duplicates"
    assert set(rows) == {f"row-{i}" for i in range(1000)} | {"late-0", "late-1"}
    assert await depth(broker, "work.quarantine") == 0
    found = settled.findall((tmp_path / "workers.log").read_text())
    assert sorted((job, kind) for job, _, kind in found) == [
        ("late-0", "duplicate"), ("late-0", "succeeded"), ("late-1", "duplicate"), ("late-1", "succeeded"),
    ], found  # fmt: skip
    # the duplicate ran its handler (4 s) and its transaction was rolled back: not a duplicate found at its claim
    assert all(float(took) >= 4 for _, took, _ in found), found


async def test_key_function_must_give_a_non_empty_string(broker: BrokerSettings, tmp_path: Path):
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=SqliteLedger(tmp_path / "k.db"))
    app.job("pay", queue="work", idempotent=True, key=lambda p: p.get("ref"))(lambda p, c: None)
    for payload in ({"order": 1}, {"ref": ""}, {"ref": 5}):
        with pytest.raises(ConfigurationError, match="must return a non-empty str"):
            await app.enqueue("pay", payload)
    assert await app.enqueue("pay", {"ref": "pay:1"}) == "pay:1"
    await app.close()


async def test_transaction_twice_in_one_run_is_refused_and_quarantined(broker: BrokerSettings, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture):  # fmt: skip
    base = await make_app(broker, tmp_path)
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
    app = App("idem", topology=base.topology(), url=broker.url, ledger=SqliteLedger(path))

    @app.job("twice", queue="work", idempotent=True)
    def twice(payload: dict[str, Any], ctx: JobContext) -> None:
        with ctx.transaction() as db:
            db.execute("INSERT INTO effects (job_id) VALUES (?)", (ctx.job_id,))
        with ctx.transaction() as db:
            db.execute("INSERT INTO effects (job_id) VALUES (?)", (ctx.job_id,))

    caplog.set_level("INFO", logger="amqpjobs.worker")
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("twice", {}, job_id="t-1")
        await rec.wait_for(lambda o: len(o) == 1)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["quarantined"]
    assert rec.outcomes[0].error == (
        "amqpjobs.errors.ConfigurationError: job 'twice': ctx.transaction() can be used once per run; the first one "
        "committed with "
        "the job's done-mark, so the job counts as done (a replay acks it as a duplicate) and the rest of this run "
        "did not happen: put the whole effect in one transaction"
    )  # what the quarantine evidence says, so that nobody replays it expecting the rest
    assert effects(f"sqlite:{path}") == ["t-1"]  # the first transaction committed, the second never ran
    assert any("outcome=quarantined reason=permanent error=\"amqpjobs.errors.ConfigurationError: job " in r.getMessage()
               for r in caplog.records)  # fmt: skip


def mark_done_elsewhere(spec: str, key: str) -> None:
    """Mark ``key`` done in the ledger as another run would have (its claim taken over after its lease)."""
    sql = "UPDATE amqpjobs_ledger SET state = 'done', owner = 'elsewhere' WHERE key = {m} AND state = 'running'"
    if spec.startswith("sqlite:"):
        with sqlite3.connect(spec.removeprefix("sqlite:")) as db:
            assert db.execute(sql.format(m="?"), (key,)).rowcount == 1
        return
    import psycopg

    with psycopg.connect(spec) as db:
        assert db.execute(sql.format(m="%s"), (key,)).rowcount == 1


def ledger_rows(spec: str) -> list[tuple[str, str]]:
    """(key, state) of each ledger row."""
    sql = "SELECT key, state FROM amqpjobs_ledger ORDER BY key"
    if spec.startswith("sqlite:"):
        with sqlite3.connect(spec.removeprefix("sqlite:")) as db:
            return [(r[0], r[1]) for r in db.execute(sql)]
    import psycopg

    with psycopg.connect(spec) as db:
        return [(r[0], r[1]) for r in db.execute(sql).fetchall()]


async def test_idempotent_handler_without_transaction_is_marked_done_and_runs_once(
    broker: BrokerSettings, tmp_path: Path, ledger_spec: str
):
    # no ctx.transaction(): only the worker's ledger.done() after the handler returns marks the job done
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=make_ledger(ledger_spec))
    runs: list[str] = []

    @app.job("notify", queue="work", idempotent=True, lease=30, key=lambda p: f"notify:{p['order']}")
    async def notify(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("notify", {"order": 3})
        await rec.wait_for(lambda o: len(o) == 1)
        await app.enqueue("notify", {"order": 3})  # after the first run ended: no live claim to wait for
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert runs == ["notify:3"]
    assert [o.kind for o in rec.outcomes] == ["succeeded", "duplicate"]
    assert ledger_rows(ledger_spec) == [("notify:3", "done")]
    assert await depth(broker, "work") == 0


async def test_transaction_of_a_job_done_meanwhile_is_rolled_back_as_a_duplicate(
    broker: BrokerSettings, tmp_path: Path, ledger_spec: str
):
    # the claim was taken, then the job was done by another run (its lease ran out meanwhile):
    # the handler's transaction finds it done on commit and rolls its effect back
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=make_ledger(ledger_spec))
    marker = "?" if ledger_spec.startswith("sqlite:") else "%s"
    runs: list[str] = []

    @app.job("charge", queue="work", idempotent=True, lease=30)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        mark_done_elsewhere(ledger_spec, ctx.job_id)
        with ctx.transaction() as db:
            db.execute(f"INSERT INTO effects (job_id) VALUES ({marker})", (ctx.job_id,))

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("charge", {}, job_id="late-1")
        await rec.wait_for(lambda o: len(o) == 1)
    await app.close()
    assert runs == ["late-1"]
    assert effects(ledger_spec) == []  # rolled back
    assert [o.kind for o in rec.outcomes] == ["duplicate"]
    assert ledger_rows(ledger_spec) == [("late-1", "done")]
    assert await depth(broker, "work") == 0


@pytest.mark.version_independent
@pytest.mark.parametrize("keyed", [True, False], ids=["key-function", "message-hash"])
async def test_a_message_without_message_id_keeps_its_key_so_a_second_copy_is_a_duplicate(
    broker: BrokerSettings, tmp_path: Path, keyed: bool
) -> None:
    """A publisher of another stack sends no message_id: the worker keyed each delivery with a random id, so a
    redelivery (or the same message twice) ran the effect twice (an outsider's report). Now the key function of
    the payload, else a hash of the message, is the key."""
    base = await make_app(broker, tmp_path)
    app = App("unnamed", topology=base.topology(), url=broker.url, ledger=SqliteLedger(str(tmp_path / "l.db")))
    ran: list[str] = []

    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    app.job("charge", queue="work", idempotent=True, key=(lambda p: f"charge:{p['order']}") if keyed else None)(charge)
    published = {"properties": {"headers": {envelope.JOB: "charge"}, "content_type": "application/json"},
                 "routing_key": "work", "payload": '{"order": 81}', "payload_encoding": "string"}  # fmt: skip
    with ManagementClient(broker) as mgmt:  # as the management UI or a shell script publishes: no message_id
        for _ in range(2):
            mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/amq.default/publish", json=published)
    async with running_worker(app, broker, concurrency=1) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) >= 2, timeout=20)
    await app.close()
    assert sorted(o.kind for o in recorder.outcomes) == ["duplicate", "succeeded"]
    assert len(ran) == 1
    assert ran[0] == "charge:81" if keyed else ran[0].startswith("sha256:")


@contextlib.asynccontextmanager
async def claimed_pg_ledger(pg_url: str) -> AsyncIterator[tuple[str, PostgresLedger]]:
    """A fresh database with an ``effects`` table, and a ledger on it whose key ``k`` is claimed by ``me``."""
    with effects_database(pg_url) as url:
        ledger = PostgresLedger(url)
        try:
            assert await ledger.claim("k", "me", 30) is Claim.CLAIMED
            yield url, ledger
        finally:
            await ledger.close()


@pytest.mark.version_independent
@pytest.mark.parametrize("then", ["returns", "raises", "fails in SQL"])
@pytest.mark.parametrize("ending", ["commit()", "rollback()", "COMMIT", "ROLLBACK"])
async def test_a_postgres_handler_that_ends_ctx_transaction_itself_fails_permanently_unmarked(
    pg_url: str, ending: str, then: str
) -> None:
    """psycopg refuses ``commit()`` inside ``conn.transaction()``, not a ``COMMIT`` of the handler's SQL: that one is
    seen at the end (another transaction id). Either way the run fails permanently (no retry repeats the effect)
    and the job is not marked done; what a raw COMMIT committed stays, and the error says so."""

    from amqpjobs.jobs.failure import classify

    async with claimed_pg_ledger(pg_url) as (url, ledger):

        def handler() -> None:
            with ledger.transaction("k", "me") as db:
                db.execute("INSERT INTO effects VALUES ('before')")
                if ending.endswith("()"):
                    getattr(db, ending[:-2])()
                else:
                    db.execute(ending)
                db.execute("INSERT INTO effects VALUES ('after')")
                if then == "raises":  # an outsider's: retried, its own COMMIT kept a row at every attempt
                    raise ValueError("after my own commit")
                if then == "fails in SQL":  # the transaction is aborted: nothing more runs on it
                    db.execute("SELECT no_such_column FROM effects")

        with pytest.raises(ConfigurationError) as refused:
            await asyncio.to_thread(handler)
        assert classify((), refused.value) == "permanent"
        message = str(refused.value)
        assert message.startswith(
            "job id 'k': ctx.transaction() commits the effect with the job's done-mark when its with block ends; "
            "the handler tried to end the transaction itself ("
        )
        if ending == "COMMIT":  # committed by the handler's own SQL before the end could see it
            assert effects(url) == ["before"]
            assert message.endswith("without the done-mark: check it before replaying the job")
        else:  # nothing of it was committed: nothing to check
            assert effects(url) == []
            assert message.endswith(": remove that")
        assert await ledger.claim("k", "other", 30) is Claim.BUSY  # not done: still the run's claim
        await ledger.release("k", "me")  # as the worker does after a failed run
        assert await ledger.claim("k", "other", 30) is Claim.CLAIMED


@pytest.mark.version_independent
@pytest.mark.parametrize("then", ["returns", "raises", "runs SQL"])
async def test_a_postgres_handler_that_closes_the_connection_of_ctx_transaction_fails_permanently_unmarked(
    pg_url: str, then: str
) -> None:
    """``db.close()`` in the block ends the transaction as a ``ROLLBACK`` would (the server rolls it back): the
    run fails permanently with the error SQLite's ledger gives (psycopg's "the connection is closed" said
    nothing of the handler, and was retried), nothing is committed, the key is not marked done, and the
    ledger's next transaction works on a connection of its own."""

    from amqpjobs.jobs.failure import classify

    async with claimed_pg_ledger(pg_url) as (url, ledger):

        def closing() -> None:
            with ledger.transaction("k", "me") as db:
                db.execute("INSERT INTO effects VALUES ('closed')")
                db.close()
                if then == "raises":
                    raise ValueError("after my own close")
                if then == "runs SQL":
                    db.execute("INSERT INTO effects VALUES ('after')")

        with pytest.raises(ConfigurationError) as refused:
            await asyncio.to_thread(closing)
        assert classify((), refused.value) == "permanent"
        assert str(refused.value).endswith("the handler tried to end the transaction itself (close()): remove that")
        assert effects(url) == []
        assert await ledger.claim("k", "other", 30) is Claim.BUSY  # not done: still the run's claim
        await ledger.release("k", "me")
        assert await ledger.claim("k", "again", 30) is Claim.CLAIMED

        def again() -> None:
            with ledger.transaction("k", "again") as db:
                db.execute("INSERT INTO effects VALUES ('again')")

        await asyncio.to_thread(again)
        assert effects(url) == ["again"]
        assert await ledger.claim("k", "third", 30) is Claim.DONE


@pytest.mark.version_independent
async def test_a_postgres_connection_the_server_ends_inside_ctx_transaction_is_a_retry_not_a_handler_fault(
    pg_url: str,
) -> None:
    """The other side of the ``close()`` rule: a connection lost under the handler (its backend terminated)
    stays psycopg's ``OperationalError``, a transient failure the worker retries; nothing committed."""
    import psycopg

    from amqpjobs.jobs.failure import classify

    async with claimed_pg_ledger(pg_url) as (url, ledger):

        def cut_off() -> None:
            with ledger.transaction("k", "me") as db:
                db.execute("INSERT INTO effects VALUES ('cut')")
                pid = db.info.backend_pid
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                db.execute("INSERT INTO effects VALUES ('after')")

        with pytest.raises(psycopg.OperationalError) as lost:
            await asyncio.to_thread(cut_off)
        assert classify((), lost.value) != "permanent"
        assert effects(url) == []


@pytest.mark.version_independent
async def test_ctx_transaction_in_an_async_handler_is_quarantined_permanent_with_its_reason(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """On the event loop its database calls would block every other job (a retest: it ran there); refused, the job
    is quarantined at once with the error naming the fix, nothing kept, not marked done."""
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=SqliteLedger(str(tmp_path / "l.db")))

    @app.job("charge", queue="work", idempotent=True)
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        with ctx.transaction() as db:
            db.execute("SELECT 1")

    await app.enqueue("charge", {}, job_id="async-1")
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) >= 1, timeout=20)
    await app.close()
    assert [(o.kind, o.attempt) for o in recorder.outcomes] == [("quarantined", 1)]
    assert await depth(broker, "work.quarantine") == 1
    async with raw_channel(broker) as ch:
        queue = await ch.declare_queue("work.quarantine", passive=True)
        message = await queue.get()
        assert message.headers[evidence.REASON] == "permanent"
        assert "ctx.transaction() was called on the event loop" in str(message.headers[evidence.ERROR_MESSAGE])
        await message.ack()
    assert await SqliteLedger(str(tmp_path / "l.db")).claim("async-1", "me", 30) is Claim.CLAIMED  # not done


@pytest.mark.version_independent
async def test_immediate_retries_of_an_idempotent_job_get_a_transaction_each_and_stop_at_a_duplicate(
    broker: BrokerSettings, tmp_path: Path, ledger_spec: str
):
    """``immediate_retries`` on an idempotent job: a run whose transaction rolled back gets a new one.

    Before (helper-176): the "once per run" rule counted every handler run of the delivery as
    one, so the immediate retry after a blip inside ``ctx.transaction()`` was refused
    (ConfigurationError: quarantined ``permanent``, the job never done), and a transaction
    that found the job done (DuplicateJobError) ran the handler again, to that same refusal.
    """
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=make_ledger(ledger_spec))
    marker = "?" if ledger_spec.startswith("sqlite:") else "%s"
    runs: list[str] = []
    blips = RetryPolicy(immediate_retries=2, immediate_wait=0.01)

    @app.job("blip", queue="work", idempotent=True, retry=blips)
    def blip(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        with ctx.transaction() as db:
            db.execute(f"INSERT INTO effects (job_id) VALUES ({marker})", (ctx.job_id,))
            if runs.count(ctx.job_id) == 1:
                raise ConnectionResetError("blip")  # rolled back: nothing of this run is kept

    @app.job("late", queue="work", idempotent=True, retry=blips, lease=30)
    def late(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        mark_done_elsewhere(ledger_spec, ctx.job_id)
        with ctx.transaction() as db:
            db.execute(f"INSERT INTO effects (job_id) VALUES ({marker})", (ctx.job_id,))

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("blip", {}, job_id="b-1")
        await app.enqueue("late", {}, job_id="l-1")
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert sorted((o.job_id, o.kind, o.error) for o in rec.outcomes) == [
        ("b-1", "succeeded", ""),
        ("l-1", "duplicate", ""),
    ]
    assert runs == ["b-1", "b-1", "l-1"]
    assert effects(ledger_spec) == ["b-1"]
    assert ledger_rows(ledger_spec) == [("b-1", "done"), ("l-1", "done")]
    assert await depth(broker, "work.quarantine") == 0
