"""The amqpjobs app the benchmark's worker processes run (``amqpjobs consume bench_app:app``).

One job, ``noop``, on job queue ``bench``: its handler writes one record (bench/common.py)
and returns. The topology file is ``$BENCH_TOPOLOGY``; the record file ``$BENCH_OUT`` is
opened at the first job, so importing this module has no side effects.
"""

from __future__ import annotations

import os

from common import JOB, QUEUE, Recorder
from pydantic import BaseModel

from amqpjobs import App, JobContext, RetryPolicy

app = App("bench", topology=os.environ.get("BENCH_TOPOLOGY", "topology"))
_recorder: Recorder | None = None


class Tick(BaseModel):
    """The payload: when the job was sent (seconds since the epoch)."""

    t: float


@app.job(JOB, queue=QUEUE, payload=Tick, retry=RetryPolicy(max_attempts=3))
async def noop(payload: Tick, ctx: JobContext) -> None:
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
    _recorder(payload.t)
