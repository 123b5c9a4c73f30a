"""An app with idempotent jobs, for tests that run workers as processes.

Environment: ``LEDGERAPP_TOPOLOGY`` (topology file), ``LEDGERAPP_LEDGER`` (``sqlite:<path>``
or a ``postgresql://`` URL), ``LEDGERAPP_LEASE`` (seconds, default 2).
"""

from __future__ import annotations

import os
import time
from typing import Any

from amqpjobs import App, JobContext
from amqpjobs.runtime.ledger import Ledger, SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger


def make_ledger(spec: str) -> Ledger:
    if spec.startswith("sqlite:"):
        return SqliteLedger(spec.removeprefix("sqlite:"))
    return PostgresLedger(spec)


SPEC = os.environ.get("LEDGERAPP_LEDGER", "")
app = App(
    "ledgerapp",
    topology=os.environ.get("LEDGERAPP_TOPOLOGY", "topology"),
    ledger=make_ledger(SPEC) if SPEC else None,
)


@app.job("insert", queue="work", idempotent=True, lease=float(os.environ.get("LEDGERAPP_LEASE", "2")))
def insert(payload: dict[str, Any], ctx: JobContext) -> None:
    """The effect: a row keyed by job id in a table WITHOUT a unique constraint, in the ledger's transaction.

    ``payload["before"]`` seconds pass between the claim and the transaction (a run that outlives its lease).
    """
    marker = "?" if SPEC.startswith("sqlite:") else "%s"
    time.sleep(float(payload.get("before", 0)))
    with ctx.transaction() as db:
        db.execute(f"INSERT INTO effects (job_id) VALUES ({marker})", (ctx.job_id,))
        time.sleep(float(payload.get("sleep", 0)))
