"""The bench's harness: messages, processes, throwaway vhosts, drains, and the contestants."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from aio_pika.abc import AbstractChannel
from common import EXCHANGE, JOB, QUEUE, TOPOLOGY, count, read_records
from report import AMQPJOBS_CLI, BENCH, GOALS, PY, ROOT, Machine, Report, Stat

from amqpjobs import JobContext
from amqpjobs.jobs.envelope import job_message
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

# ---------------------------------------------------------------------------------- helpers


def amqpjobs_message(now: float) -> tuple[bytes, Any]:
    """Body and pika properties of the message ``App.enqueue`` would publish for job ``noop``."""
    import pika

    m = job_message(JOB, {"t": now}, job_id=str(uuid.uuid4()), now=now)
    props = pika.BasicProperties(
        content_type=m.content_type, message_id=m.message_id, type=m.type, timestamp=int(now),
        headers=dict(m.headers), delivery_mode=2,
    )  # fmt: skip
    return m.body, props


def dramatiq_message(now: float) -> tuple[bytes, Any]:
    """What ``noop.send(now)`` publishes (Dramatiq's RabbitmqBroker.enqueue)."""
    import dramatiq
    import pika

    body = dramatiq.Message(queue_name=QUEUE, actor_name="noop", args=(now,), kwargs={}, options={}).encode()
    return body, pika.BasicProperties(delivery_mode=2)


def celery_message(now: float) -> tuple[bytes, Any]:
    """What ``noop.delay(now)`` publishes (task protocol 2, json)."""
    import pika
    from peer_celery import app

    task_id = str(uuid.uuid4())
    task = app.amqp.as_task_v2(task_id, "noop", args=(now,), kwargs={})
    props = pika.BasicProperties(
        headers=task.headers, content_type="application/json", content_encoding="utf-8",
        correlation_id=task.properties["correlation_id"], delivery_mode=2, priority=0,
    )  # fmt: skip
    return json.dumps(task.body).encode(), props  # what kombu's json serializer sends for this body


#: Message builder, exchange, routing key per message format.
FORMATS: dict[str, tuple[Callable[[float], tuple[bytes, Any]], str, str]] = {
    "amqpjobs": (amqpjobs_message, EXCHANGE, QUEUE),
    "dramatiq": (dramatiq_message, "", QUEUE),
    "celery": (celery_message, QUEUE, QUEUE),
}


def fill_sync(url: str, fmt: str, n: int) -> None:
    """Publish ``n`` messages of format ``fmt`` fast with sync pika (the caller then checks the queue depth).

    Filling is not what is measured: it skips per-message confirms, and :meth:`Bench.prefill`
    waits until the queue holds every message instead.
    """
    import pika

    build, exchange, routing_key = FORMATS[fmt]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for _ in range(n):
            body, props = build(time.time())
            channel.basic_publish(exchange, routing_key, body, props)
    finally:
        connection.close()


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU of ``procs`` and all their live descendants."""
    total = 0.0
    seen: set[int] = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for p in [proc, *proc.children(recursive=True)]:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
    return total


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


@dataclass(frozen=True)
class Contestant:
    """One consumer set-up of the throughput table."""

    key: str
    label: str
    argv: list[str]
    fmt: str  # message format: amqpjobs, dramatiq, celery
    consumers: int  # consumers the broker must see before it counts as ready (0: don't wait)
    processes: int = 1


def contestants() -> list[Contestant]:
    consume = [*AMQPJOBS_CLI, "consume", "bench_app:app", "--grace", "5s", "--concurrency"]
    raw = [PY, str(BENCH / "consumers.py")]
    return [
        Contestant("aj16", "amqpjobs consume, 16 slots (per-job log lines on, as shipped)", [*consume, "16"],
                   "amqpjobs", 1),  # one consumer with prefetch 16
        # levers, one at a time (bench/RESULTS.md "Levers"), then together
        Contestant("aj16l0", "amqpjobs consume, 16 slots, --log-outcomes none", [*consume, "16", "--log-outcomes",
                   "none"], "amqpjobs", 1),
        Contestant("aj16e0", "amqpjobs consume, 16 slots, --outcome-events none", [*consume, "16", "--outcome-events",
                   "none"], "amqpjobs", 1),
        Contestant("aj16uv", "amqpjobs consume, 16 slots, --loop uvloop", [*consume, "16", "--loop", "uvloop"],
                   "amqpjobs", 1),
        Contestant("aj16fast", "amqpjobs consume, 16 slots, --log-outcomes failures --outcome-events failures "
                   "--loop uvloop", [*consume, "16", "--log-outcomes", "failures", "--outcome-events", "failures",
                   "--loop", "uvloop"], "amqpjobs", 1),
        Contestant("aj16q", "amqpjobs Worker, 16 slots, per-job log lines off", [*raw, "amqpjobs", "--slots", "16"],
                   "amqpjobs", 1),
        Contestant("raw16", "raw aio-pika, prefetch 16, concurrent handlers", [*raw, "aiopika", "--prefetch", "16"],
                   "amqpjobs", 1),
        Contestant("raw16x1", "raw aio-pika, 16 channels × prefetch 1 (one channel per slot)",
                   [*raw, "aiopika", "--channels", "16", "--prefetch", "1"], "amqpjobs", 16),
        Contestant("aj1", "amqpjobs consume, 1 slot (log lines on)", [*consume, "1"], "amqpjobs", 1),
        Contestant("raw1", "raw aio-pika, prefetch 1", [*raw, "aiopika", "--prefetch", "1"], "amqpjobs", 1),
        Contestant("dramatiq", "Dramatiq, 1 process × 8 threads (prefetch 16)",
                   [PY, "-m", "dramatiq", "peer_dramatiq", "--processes", "1", "--threads", "8"], "dramatiq", 0),
        Contestant("celery", "Celery, -c 2 prefork, acks_late, prefetch multiplier 1",
                   [PY, "-m", "celery", "-A", "peer_celery", "worker", "-c", "2", "-P", "prefork",
                    "--prefetch-multiplier", "1", "-Q", QUEUE, "--without-gossip", "--without-mingle",
                    "--without-heartbeat", "-l", "WARNING"], "celery", 0),
        Contestant("pika200", "sync pika, prefetch 200 (ceiling line)", [*raw, "pika", "--prefetch", "200"],
                   "amqpjobs", 1),
    ]  # fmt: skip


@dataclass
class Drain:
    """One drain of a pre-filled queue."""

    rate: float  # jobs/s between the 10% and the 90% record
    cpu_us: float  # client CPU µs per job over the same stretch
    records: list[tuple[float, float]]


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------- the bench


class Harness:
    """Processes, vhosts and measuring helpers the scenarios share (the sections build on it)."""

    def __init__(self, args: argparse.Namespace, root: BrokerSettings, machine: Machine) -> None:
        self.args = args
        self.root = root
        self.machine = machine
        self.tmp = ROOT / ".broker" / "bench" / f"run-{uuid.uuid4().hex[:6]}"
        self.tmp.mkdir(parents=True)
        (self.tmp / "bench.toml").write_text(TOPOLOGY)
        self.vhosts: dict[str, BrokerSettings] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.report = Report()
        self.results: dict[str, Stat] = {}
        self.figures: dict[str, tuple[float, str]] = {}  # goal key (report.GOALS): value, detail

    # -- vhosts and processes
    async def vhost(self, key: str, topology: bool = True) -> BrokerSettings:
        if key in self.vhosts:
            return self.vhosts[key]
        settings = self.root.with_vhost(f"bench-{key}-{uuid.uuid4().hex[:6]}")
        with ManagementClient(settings) as mgmt:
            mgmt.create_vhost(settings.vhost)
        self.vhosts[key] = settings
        if topology:
            await apply_topology(self.tmp / "bench.toml", settings)
        return settings

    def delete_vhosts(self) -> None:
        with ManagementClient(self.root) as mgmt:
            for settings in self.vhosts.values():
                with contextlib.suppress(Exception):
                    mgmt.delete_vhost(settings.vhost)
        self.vhosts.clear()

    def spawn(self, argv: list[str], settings: BrokerSettings, out: Path, log_name: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "BENCH_URL": settings.url,
            "BENCH_OUT": str(out),
            "BENCH_TOPOLOGY": str(self.tmp / "bench.toml"),
            "AMQPJOBS_URL": settings.url,
            "AMQPJOBS_MANAGEMENT_URL": settings.management_url,
            "PYTHONPATH": os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p),
        }
        with (self.tmp / f"{log_name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, cwd=BENCH, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def stop(self, procs: list[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
        """SIGTERM each process (its descendants noted first), wait, then SIGKILL what is left, by PID."""
        family: list[psutil.Process] = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                family.extend(psutil.Process(proc.pid).children(recursive=True))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            if proc in self.procs:
                self.procs.remove(proc)
        _, alive = psutil.wait_procs(family, timeout=max(0.1, deadline - time.monotonic()))
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()

    def stop_all(self) -> None:
        self.stop(list(self.procs), timeout=5.0)

    # -- queues
    async def channel_do(self, settings: BrokerSettings, action: Callable[[AbstractChannel], Awaitable[Any]]) -> Any:
        connection = await aio_pika.connect(settings.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            return await action(channel)

    async def purge(self, settings: BrokerSettings) -> None:
        async def purge(channel: AbstractChannel) -> None:
            await (await channel.get_queue(QUEUE, ensure=False)).purge()

        await self.channel_do(settings, purge)

    async def consumers(self, settings: BrokerSettings) -> int:
        async def look(channel: AbstractChannel) -> int:
            queue = await channel.declare_queue(QUEUE, passive=True)
            result = queue.declaration_result
            return int(result.consumer_count or 0)

        value: int = await self.channel_do(settings, look)
        return value

    async def wait_ready(self, settings: BrokerSettings, expected: int, procs: list[subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + 60
        while await self.consumers(settings) < expected:
            self.check_alive(procs)
            if time.monotonic() > deadline:
                raise BenchError(f"consumers did not come up in 60 s (see {self.tmp})")
            await asyncio.sleep(0.1)

    def check_alive(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            if proc.poll() is not None:
                raise BenchError(f"{proc.args!r} exited with {proc.returncode} (logs in {self.tmp})")

    async def prefill(self, fmt: str, settings: BrokerSettings, n: int, expect: int | None = None) -> None:
        """Add ``n`` messages; return once the queue holds ``expect`` (default ``n``) ready messages."""
        await asyncio.to_thread(fill_sync, settings.url, fmt, n)
        deadline = time.monotonic() + 60
        while await self.depth(settings) < (n if expect is None else expect):
            if time.monotonic() > deadline:
                raise BenchError(f"the queue did not reach {n} messages after filling")
            await asyncio.sleep(0.05)

    async def depth(self, settings: BrokerSettings) -> int:
        async def look(channel: AbstractChannel) -> int:
            queue = await channel.declare_queue(QUEUE, passive=True)
            return int(queue.declaration_result.message_count or 0)

        value: int = await self.channel_do(settings, look)
        return value

    async def peer_vhost(self, c: Contestant) -> BrokerSettings:
        if c.fmt == "amqpjobs":
            return await self.vhost(c.key)
        settings = await self.vhost(c.key, topology=False)
        if c.fmt == "dramatiq":
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            broker = RabbitmqBroker(url=settings.url, confirm_delivery=True)
            broker.declare_queue(QUEUE, ensure=True)
            broker.close()
        else:
            from peer_celery import app

            with app.connection_for_write(settings.url) as conn:
                app.amqp.queues[QUEUE](conn.default_channel).declare()
        return settings

    # -- one drain
    async def drain(self, c: Contestant, n: int, rep: int, argv: list[str] | None = None) -> Drain:
        settings = await self.peer_vhost(c)
        await self.purge(settings)
        await self.prefill(c.fmt, settings, n)
        outs = [self.tmp / f"{c.key}-{rep}-{i}.rec" for i in range(c.processes)]
        procs = [self.spawn(argv or c.argv, settings, out, out.stem) for out in outs]
        try:
            return await self.watch(procs, outs, n)
        finally:
            if argv is not None:  # under py-spy: end the profiled child first, so py-spy writes its output
                for proc in procs:
                    with contextlib.suppress(psutil.Error):
                        for child in psutil.Process(proc.pid).children():
                            child.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await asyncio.to_thread(proc.wait, 30)
            self.stop(procs)

    async def watch(self, procs: list[subprocess.Popen[bytes]], outs: list[Path], n: int) -> Drain:
        """Wait until ``n`` records exist; rate and CPU over the middle 80% of the time all processes ran."""
        ps = [psutil.Process(p.pid) for p in procs]
        # time, records, CPU seconds; a first sample at 0 records: a drain done before the next sample
        # (a --quick run's 100 jobs) still has two to measure its CPU by (its start-up counted then)
        samples: list[tuple[float, int, float]] = [(time.time(), 0, cpu_seconds(ps))]
        deadline = time.monotonic() + 120 + n / 100
        while True:
            done = sum(count(out) for out in outs)
            if done:
                samples.append((time.time(), done, cpu_seconds(ps)))
            if done >= n:
                break
            self.check_alive(procs)
            if time.monotonic() > deadline:
                raise BenchError(f"only {done} of {n} jobs done in time (logs in {self.tmp})")
            await asyncio.sleep(0.05)
        per_process = [recs for recs in (read_records(out) for out in outs) if recs]  # tiny N: one may get none
        records = [r for recs in per_process for r in recs]
        begin = max(min(r[0] for r in recs) for recs in per_process)
        end = min(max(r[0] for r in recs) for recs in per_process)
        a, b = begin + 0.1 * (end - begin), end - 0.1 * (end - begin)
        inside = sum(1 for r in records if a <= r[0] <= b)
        rate = inside / (b - a)
        window = [s for s in samples if a <= s[0] <= b]
        if len(window) < 2 or window[-1][1] == window[0][1]:
            window = samples  # a drain too short for the middle stretch: the whole of it
        (_, c1, t1), (_, c2, t2) = window[0], window[-1]
        cpu_us = (t2 - t1) / (c2 - c1) * 1e6 if c2 > c1 else float("nan")
        return Drain(rate, cpu_us, records)

    # ------------------------------------------------------------------------------ sections
    def header(self, title: str) -> None:
        self.report.add(f"## {title}", "", self.machine.line(), "")

    def goal(self, key: str, value: float, detail: str = "") -> str:
        """Record the figure of goal ``key`` (report.GOALS) for the closing table; "1.23× (target ≥ 1.3×: met)".

        A NaN (a contestant left out) is not recorded: the closing table says "not measured".
        """
        goal = GOALS[key]
        if value == value:
            self.figures[key] = (value, detail)
        return f"{goal.fmt(value)} (target {goal.target_text()}: {goal.verdict(value)})"


async def _noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Publishing-side registration of the job (nothing runs it in this process)."""
