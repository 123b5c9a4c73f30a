"""A job app with a circuit breaker, for ``amqpjobs consume --processes`` tests (test_breaker_processes.py).

Environment: ``BREAKERAPP_TOPOLOGY`` (topology file), ``BREAKERAPP_RECORD`` (each run appends
"start <id> <attempt> <pid> <time>" and, when it fails, "fail <id> <pid>"), ``BREAKERAPP_FAILING``
(a file: the job fails while it exists).
"""

from __future__ import annotations

import os
import time
from typing import Any

from amqpjobs import App, Breaker, JobContext

app = App("breakerapp", topology=os.environ.get("BREAKERAPP_TOPOLOGY", "topology"))


def _append(line: str) -> None:
    with open(os.environ["BREAKERAPP_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@app.job("flaky", queue="work", timeout="30s", breaker=Breaker(failures=3, window="10s", cool_down="2s"))
def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fail while the ``BREAKERAPP_FAILING`` file exists."""
    _append(f"start {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    if os.path.exists(os.environ["BREAKERAPP_FAILING"]):
        _append(f"fail {ctx.job_id} {os.getpid()}")
        raise ConnectionError("the dependency is down")
