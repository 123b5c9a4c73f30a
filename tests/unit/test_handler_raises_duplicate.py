"""A handler's own raise of DuplicateJobError is its job's failure unless its ctx.transaction() found the job done.

Only the ledger's transaction may say "already done" (the effect was rolled back): a non-idempotent job, or an
idempotent one whose handler raises it itself (a library's, another job's ledger), was acked as a duplicate, a
job never done. Worker logic, not the broker's: the in-memory double runs the real worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from amqpjobs import App, JobContext
from amqpjobs.errors import DuplicateJobError
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology

TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\nretry_tiers = ["1s"]\n'


def make_app(tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("d", topology=load_topology(path).topology, ledger=SqliteLedger(tmp_path / "ledger.db"))


async def test_a_plain_job_raising_duplicatejoberror_itself_fails_and_is_quarantined(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.job("plain", queue="work")
    async def plain(payload: dict[str, Any], ctx: JobContext) -> None:
        raise DuplicateJobError("a library's word, not the ledger's")

    async with TestBroker(app) as broker:
        await app.enqueue("plain", {}, job_id="p-1")
        done = await broker.drain()
    assert [p.kind for p in done] == ["retried", "quarantined"]
    [parked] = broker.quarantine("work")
    assert parked.headers["amqpjobs-error-type"] == "amqpjobs.errors.DuplicateJobError"


async def test_an_idempotent_job_whose_transaction_found_it_done_is_a_duplicate_but_its_own_raise_is_not(
    tmp_path: Path,
) -> None:
    app = make_app(tmp_path)

    @app.job("own", queue="work", idempotent=True)
    async def own(payload: dict[str, Any], ctx: JobContext) -> None:
        raise DuplicateJobError("raised by the handler, no transaction opened")

    @app.job("charge", queue="work", idempotent=True)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        with ctx.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects (id TEXT)")
            db.execute("INSERT INTO effects VALUES (?)", (ctx.job_id,))

    async with TestBroker(app, ledger=app.ledger) as broker:
        await app.enqueue("own", {}, job_id="o-1")
        await app.enqueue("charge", {}, job_id="c-1")
        await app.enqueue("charge", {}, job_id="c-1")  # the same job again: its claim says done
        done = await broker.drain()
    assert [(p.job_id, p.kind) for p in done if p.job_id == "o-1"] == [("o-1", "retried"), ("o-1", "quarantined")]
    assert [p.kind for p in done if p.job_id == "c-1"] == ["succeeded", "duplicate"]
