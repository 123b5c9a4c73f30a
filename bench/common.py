"""What the benchmark's consumer processes and the harness (bench/run.py) share.

Every contestant's handler does the same trivial thing: it appends one fixed-width record
(its start time and the time the job was sent, both seconds since the epoch) to the file
named by ``$BENCH_OUT`` with one ``O_APPEND`` write, then returns and the delivery is acked.
The harness counts jobs by the file's size and reads rates and latencies from the records,
so no contestant needs a result backend or a side channel of its own, and processes that
fork (Celery's prefork pool) need no shared counter.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

#: Bytes per record: ``f"{start:17.6f} {sent:17.6f}\n"``.
RECORD = 36
#: The job queue every amqpjobs and raw aio-pika/pika contestant consumes (one vhost each).
QUEUE = "bench"
EXCHANGE = "jobs"
JOB = "noop"
TOPOLOGY = f"""
[[exchange]]
name = "{EXCHANGE}"

[[job_queue]]
name = "{QUEUE}"
exchange = "{EXCHANGE}"
retry_tiers = ["1s", "5s"]
"""


def own_cpu() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Recorder:
    """Appends records to ``$BENCH_OUT`` (one write per job, atomic with ``O_APPEND``)."""

    def __init__(self, path: str | None = None) -> None:
        self.fd = os.open(path or os.environ["BENCH_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, sent: float) -> None:
        os.write(self.fd, f"{time.time():17.6f} {sent:17.6f}\n".encode())


def count(path: Path) -> int:
    """Records written so far."""
    try:
        return path.stat().st_size // RECORD
    except FileNotFoundError:
        return 0


def read_records(path: Path) -> list[tuple[float, float]]:
    """All complete records as (handler start, sent), in file order."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[tuple[float, float]] = []
    for i in range(0, len(data) - RECORD + 1, RECORD):
        start, sent = data[i : i + RECORD].split()
        out.append((float(start), float(sent)))
    return out
