"""PostgreSQL stores through an outage: the ledger, results and payload stores reconnect, paced.

The database is reached through a TCP proxy of the test's own (stopped and started here);
the shared PostgreSQL server is never stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs import App, JobContext, LedgerUnavailableError, PayloadStoreError, ResultsUnavailableError
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime.ledger import Claim
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.payloads_postgres import PostgresPayloadStore
from amqpjobs.runtime.results_postgres import PostgresResults
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, effects_database
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.worker_env import APPLIED_TOPOLOGY, Recorder, make_app, running_worker


def via(url: str, port: int) -> str:
    """``url`` with its port replaced by ``port`` (the proxy's)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{port}"))


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A fresh database with an ``effects`` table (no unique constraint)."""
    with effects_database(pg_url) as url:
        yield url


@asynccontextmanager
async def proxied(url: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    parts = urlsplit(url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    port = await proxy.start()
    try:
        yield proxy, via(url, port)
    finally:
        await proxy.stop()


def effects(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as db:
        return sorted(r[0] for r in db.execute("SELECT job_id FROM effects").fetchall())


async def outage(
    broker: BrokerSettings, tmp_path: Path, database: str, caplog: pytest.LogCaptureFixture, seconds: float
) -> tuple[list[str], Recorder, list[str], float]:
    """Idempotent job ``charge`` (lease 5 s, its effect in ``effects``) on a worker of concurrency 2: v1 runs, the
    ledger's database goes away (the proxy stops), v2 and v3 are enqueued, ``seconds`` later it comes back.

    Returns the job ids run, the outcomes, the amqpjobs log lines said during the outage (``LEVEL message``)
    and the seconds from its end until all three succeeded (40 s at most).
    """
    runs: list[str] = []
    base = await make_app(broker, tmp_path)
    async with proxied(database) as (proxy, dsn):
        app = App("idem", topology=base.topology(), url=broker.url, ledger=PostgresLedger(dsn))

        @app.job("charge", queue="work", idempotent=True, lease=5)
        def charge(payload: dict[str, Any], ctx: JobContext) -> None:
            runs.append(ctx.job_id)
            with ctx.transaction() as db:
                db.execute("INSERT INTO effects (job_id) VALUES (%s)", (ctx.job_id,))

        caplog.set_level(logging.INFO, logger="amqpjobs")

        def succeeded(outcomes: list[Any]) -> int:
            return sum(o.kind == "succeeded" for o in outcomes)

        async with running_worker(app, broker, concurrency=2) as (_, rec):
            await app.enqueue("charge", {}, job_id="v1")
            await rec.wait_for(lambda o: succeeded(o) == 1)
            await proxy.stop()
            mark = len(caplog.records)
            await app.enqueue("charge", {}, job_id="v2")
            await app.enqueue("charge", {}, job_id="v3")
            await asyncio.sleep(seconds)
            during = [f"{r.levelname} {r.getMessage()}" for r in caplog.records[mark:] if r.name.startswith("amqpjobs")]
            await proxy.start()
            back = time.monotonic()
            await rec.wait_for(lambda o: succeeded(o) == 3, timeout=40)
            took = time.monotonic() - back
        await app.close()
    return runs, rec, during, took


@pytest.mark.broker
@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(120)
async def test_idempotent_jobs_wait_out_a_ledger_outage_then_run_once_each(
    broker: BrokerSettings, tmp_path: Path, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fresh user's H1: the ledger's database goes away after a job ran, two jobs are enqueued, it comes
    back. Each job runs exactly once, soon after the return, and the outage is a line or two in the log,
    not one per job every 0.2 s (before: the dead connection was used for good, the jobs never ran)."""
    runs, rec, during, took = await outage(broker, tmp_path, database, caplog, 6)
    assert sorted(runs) == ["v1", "v2", "v3"]
    assert effects(database) == ["v1", "v2", "v3"]
    assert took <= 4.0, took  # paced tries: the longest pause between two is 2 s
    assert len(during) == 1, during  # one line for the outage starting, none per job
    assert during[0].startswith("WARNING the PostgreSQL ledger is unreachable (OperationalError: "), during
    assert [o.kind for o in rec.outcomes] == ["succeeded"] * 3  # they waited in their slots: nothing deferred
    back_lines = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(back_lines) == 1, back_lines
    assert back_lines[0].startswith("the PostgreSQL ledger answers again after "), back_lines


@pytest.mark.broker
@pytest.mark.serial  # wall-clock bounds
@pytest.mark.timeout(120)
async def test_an_outage_longer_than_the_patience_defers_each_job_once_per_ten_seconds(
    broker: BrokerSettings, tmp_path: Path, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Past LEDGER_PATIENCE (10 s) a waiting delivery goes to the first tier (no attempt used) and waits again:
    over a 13 s outage, one ``deferred`` line per job and the outage's one WARNING; each job runs once after."""
    runs, rec, during, took = await outage(broker, tmp_path, database, caplog, 13)
    assert sorted(runs) == ["v1", "v2", "v3"]
    assert effects(database) == ["v1", "v2", "v3"]
    assert took <= 4.0, took
    assert during[0].startswith("WARNING the PostgreSQL ledger is unreachable ("), during
    deferred = sorted(line.split(" ")[2] for line in during[1:])
    assert deferred == ["id=v2", "id=v3"], during  # one pass each in 13 s (before: one per 0.2 s, with an ERROR)
    assert all("outcome=deferred" in line and "LedgerUnavailableError: the PostgreSQL ledger is unreachable" in line
               for line in during[1:]), during  # fmt: skip
    by_job: dict[str, list[tuple[str, int]]] = {o.job_id: [] for o in rec.outcomes}
    for o in rec.outcomes:
        by_job[o.job_id].append((o.kind, o.attempt))
    assert by_job == {"v1": [("succeeded", 1)], "v2": [("deferred", 1), ("succeeded", 1)],
                      "v3": [("deferred", 1), ("succeeded", 1)]}  # fmt: skip


@pytest.mark.timeout(60)
async def test_the_ledger_reconnects_and_tries_are_paced(database: str) -> None:
    """A claim after the database came back works on a new connection; while it is down, claims fail at once
    between paced connect attempts (a new connection at most every 2 s), never on the dead connection."""
    async with proxied(database) as (proxy, dsn):
        ledger = PostgresLedger(dsn)
        await ledger.open()
        assert await ledger.claim("k1", "me", 30) is Claim.CLAIMED
        await proxy.stop()
        failures = 0
        started = time.monotonic()
        while time.monotonic() - started < 3:
            with pytest.raises(
                LedgerUnavailableError, match=r"^the PostgreSQL ledger (is unreachable|lost its connection) "
            ):
                await ledger.claim("k2", "me", 30)
            failures += 1
            await asyncio.sleep(0.05)
        await proxy.start()
        back = time.monotonic()
        while True:
            try:
                claim = await ledger.claim("k2", "me", 30)
                break
            except Exception:
                assert time.monotonic() - back < 3, "no reconnect within 3 s of the database's return"
                await asyncio.sleep(0.05)
        assert claim is Claim.CLAIMED
        assert await ledger.done("k2", "me") is True
        await ledger.close()
    assert failures > 20  # each answered at once


@pytest.mark.timeout(60)
async def test_results_and_payload_stores_reconnect_after_an_outage(database: str) -> None:
    async with proxied(database) as (proxy, dsn):
        results = PostgresResults(dsn)
        payloads = PostgresPayloadStore(dsn, name="big")
        record = StateRecord("j1", "mail", "queued", 1, time.time())
        assert await results.write([record]) == []
        await payloads.write("k1", b"one")
        await proxy.stop()
        with pytest.raises(ResultsUnavailableError, match=r"^the PostgreSQL results store lost its connection"):
            await results.write([record])
        with pytest.raises(PayloadStoreError, match=r"^the PostgreSQL payload store lost its connection"):
            await payloads.write("k2", b"two")
        await proxy.start()
        await asyncio.sleep(2.5)  # the longest pause between two connect attempts
        assert await results.write([StateRecord("j1", "mail", "running", 1, time.time())]) == []
        assert [r.state for r in await results.history("j1")] == ["queued", "running"]
        await payloads.write("k2", b"two")
        assert await payloads.read("k2") == b"two"
        await results.close()
        await payloads.close()


@pytest.mark.broker
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("dsn", "code", "says"),
    [
        (
            "postgresql://amqpjobs:amqpjobs@127.0.0.1:1/amqpjobs",
            3,
            "ledger error: the PostgreSQL ledger is unreachable",
        ),
        ("postgresql://amqpjobs:amqpjobs@127.0.0.1:notaport/amqpjobs", 2, "PostgresLedger(dsn=...) names a port "),
        ("nonsense", 2, "error: PostgresLedger(dsn=...) is not a URL (postgresql://...) nor "),
    ],
)
async def test_worker_start_with_the_ledger_unreachable_exits_3_and_a_bad_dsn_2(
    broker: BrokerSettings, tmp_path: Path, dsn: str, code: int, says: str
) -> None:
    """L13: README's exit codes say 3 for a service unreachable; 2 stays for invalid input (the DSN)."""
    await make_app(broker, tmp_path)
    topo = tmp_path / "proc.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    env = dict(os.environ, AMQPJOBS_URL=broker.url, LEDGERAPP_TOPOLOGY=str(topo), LEDGERAPP_LEDGER=dsn)
    exe = str(Path(sys.executable).with_name("amqpjobs"))
    done = await asyncio.to_thread(
        subprocess.run, [exe, "consume", "tests.integration.ledgerapp:app"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert says in done.stderr, done.stderr
    assert "amqpjobs:amqpjobs@" not in done.stderr  # no password shown
