"""Every benchmark of issue 9, side by side with the peers, written to bench/RESULTS.md.

Usage: python bench/run.py [--n 20000] [--reps 3] [--quick] [--out bench/RESULTS.md] [--no-profile]
                           [--only throughput,publish,...] [--contestants aj16,raw16,...]
       (make bench; needs the project's broker, started here with scripts/broker.sh up, and the
       bench extra: pip install -e '.[bench]')

Same machine, same broker, same run; durable queues, persistent messages, publisher confirms,
ack after a trivial handler (it appends one record to a file: bench/common.py). Each figure
is the median of ``--reps`` runs with min and max; contestants take turns within each
repetition so that background noise spreads over all of them. Every consumer runs in a
process of its own, started and ended by PID here, in a throwaway vhost of its own.

1. throughput: amqpjobs 16 slots vs raw aio-pika prefetch 16, 1 slot vs prefetch 1, Dramatiq
   (1 process, 8 threads) and Celery (acks_late, prefetch multiplier 1, -c 2 prefork), and a sync
   pika prefetch-200 consumer as the machine's ceiling; jobs/s and client CPU µs per job;
2. two amqpjobs worker processes vs one;
3. publish rate: enqueue one by one and batched vs raw aio-pika with confirms;
4. latency enqueue → handler start at a steady 200 jobs/s, amqpjobs vs raw aio-pika;
5. worker RSS after 10k and after 200k jobs;
6. retry-tier timing error and replay rate error;
7. ``amqpjobs topology apply`` time for 200 job queues, first and second run.
Targets are printed beside the figures (they are not pass/fail). Where the amqpjobs worker
misses a throughput target, its hot path is profiled with py-spy and the top functions written
into the results.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from aio_pika.abc import AbstractChannel, DeliveryMode
from common import EXCHANGE, JOB, QUEUE, TOPOLOGY, count, read_records

from amqpjobs import App, JobContext, Retry, Worker, WorkerOptions
from amqpjobs.jobs.envelope import iso_utc, job_message
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
AMQPJOBS_CLI = [PY, "-c", "from amqpjobs.cli import main; main()"]

# ---------------------------------------------------------------------------------- figures


@dataclass
class Stat:
    """Values of one figure over the repetitions."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        vals = [v for v in self.values if v == v]
        return statistics.median(vals) if vals else float("nan")

    def fmt(self, spec: str = ".0f", scale: float = 1.0) -> str:
        """``median (min–max)``; just the value for a single run."""
        vals = [v * scale for v in self.values if v == v]  # NaN: a drain too short to measure CPU
        if not vals:
            return "–"
        med = statistics.median(vals)
        if len(vals) == 1:
            return format(med, spec)
        return f"{format(med, spec)} ({format(min(vals), spec)}–{format(max(vals), spec)})"


def ratio(a: Stat, b: Stat) -> float:
    return a.median / b.median if b.median else float("nan")


def per_cpu_second(cpu_us: Stat) -> str:
    """Jobs per client CPU-second from CPU µs per job ("–" when a drain was too short to measure CPU)."""
    return f"{1e6 / cpu_us.median:.0f}" if cpu_us.median > 0 else "–"


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    if value != value:  # NaN: a contestant left out with --contestants
        return "–"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "**missed**"


class Report:
    """Markdown for RESULTS.md, echoed to stdout as it is written."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            print(line, flush=True)

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            self.add("| " + " | ".join(row) + " |")
        self.add("")

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------- machine


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_revision() -> str:
    """The commit measured, and whether amqpjobs/ had uncommitted changes (others edit the tree too)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "amqpjobs"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown (no git)"
    state = "with uncommitted changes under amqpjobs/" if dirty.stdout.strip() else "amqpjobs/ clean"
    return f"commit {head.stdout.strip() or '?'}, {state}"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


@dataclass
class Machine:
    cores: int
    cpu: str
    broker: str
    erlang: str

    def line(self) -> str:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        return (
            f"_Machine: {self.cores} cores ({self.cpu}), RabbitMQ {self.broker} (Erlang {self.erlang}) on loopback, "
            f"Python {platform.python_version()}; load average now {load}._"
        )


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


def raw_message(now: float) -> aio_pika.Message:
    """The same wire format, built by hand as a raw aio-pika publisher would."""
    return aio_pika.Message(
        json.dumps({"t": now}).encode(),
        content_type="application/json",
        message_id=str(uuid.uuid4()),
        type=JOB,
        timestamp=datetime.fromtimestamp(now, UTC),
        headers={"amqpjobs-attempt": 1, "amqpjobs-enqueued-at": iso_utc(now)},
        delivery_mode=DeliveryMode.PERSISTENT,
    )


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


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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


class Bench:
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
        samples: list[tuple[float, int, float]] = []  # time, records, CPU seconds
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

    async def throughput(self) -> None:
        n, reps = self.args.n, self.args.reps
        self.header(f"1. Throughput: drain {n:,} pre-filled jobs")
        rows = [c for c in contestants() if not self.args.contestants or c.key in self.args.contestants]
        rates: defaultdict[str, Stat] = defaultdict(Stat)  # a contestant left out (--contestants): NaN ratios
        cpus: defaultdict[str, Stat] = defaultdict(Stat)
        for rep in range(reps):
            for c in rows:
                d = await self.drain(c, n, rep)
                rates[c.key].add(d.rate)
                cpus[c.key].add(d.cpu_us)
                print(f"  rep {rep + 1}/{reps} {c.key:<9} {d.rate:8.0f} jobs/s {d.cpu_us:7.0f} µs CPU/job", flush=True)
        self.report.table(
            ["contestant", "jobs/s median (min–max)", "client CPU µs/job", "jobs/s per client CPU-second"],
            [[c.label, rates[c.key].fmt(), cpus[c.key].fmt(), per_cpu_second(cpus[c.key])] for c in rows],
        )
        keys = [c.key for c in contestants()]
        r = {k: ratio(rates["aj16"], rates[k]) for k in keys}
        rq = {k: ratio(rates["aj16q"], rates[k]) for k in keys}
        r1 = ratio(rates["aj1"], rates["raw1"])
        self.report.table(
            ["ratio", "as shipped (log lines on)", "log lines off", "target", "verdict (as shipped)"],
            [
                ["amqpjobs 16 slots / raw aio-pika prefetch 16", f"{r['raw16']:.2f}×", f"{rq['raw16']:.2f}×", "≥ 1.0×",
                 verdict(r["raw16"], 1.0)],
                ["amqpjobs 1 slot / raw aio-pika prefetch 1", f"{r1:.2f}×", "–", "≥ 0.9×", verdict(r1, 0.9)],
                ["amqpjobs 16 slots / Dramatiq 8 threads", f"{r['dramatiq']:.2f}×", f"{rq['dramatiq']:.2f}×", "≥ 2×",
                 verdict(r["dramatiq"], 2.0)],
                ["amqpjobs 16 slots / Celery -c 2", f"{r['celery']:.2f}×", f"{rq['celery']:.2f}×", "≥ 3×",
                 verdict(r["celery"], 3.0)],
                ["amqpjobs 16 slots / sync pika prefetch 200 (ceiling)", f"{r['pika200']:.2f}×",
                 f"{rq['pika200']:.2f}×", "–", "–"],
                ["amqpjobs 16 slots / raw aio-pika 16 channels × prefetch 1", f"{r['raw16x1']:.2f}×",
                 f"{rq['raw16x1']:.2f}×", "–", "–"],
                ["raw aio-pika 16 channels × prefetch 1 / raw aio-pika prefetch 16 (cost of a channel per slot)",
                 f"{ratio(rates['raw16x1'], rates['raw16']):.2f}×", "–", "–", "–"],
                ["raw aio-pika prefetch 16 / sync pika prefetch 200", f"{ratio(rates['raw16'], rates['pika200']):.2f}×",
                 "–", "–", "–"],
            ],
        )  # fmt: skip
        over1 = (1e6 / rates["aj1"].median) - (1e6 / rates["raw1"].median)
        over16 = cpus["aj16"].median - cpus["raw16"].median
        self.report.add(
            f"amqpjobs' own cost: 1 slot adds {over1:.0f} µs of wall time per job over raw aio-pika prefetch 1 "
            "(budget for 0.9×: ≈ 120 µs); 16 slots add "
            f"{over16:.0f} µs of client CPU per job over raw aio-pika prefetch 16 "
            f"({cpus['aj16q'].median - cpus['raw16'].median:.0f} µs with log lines off).",
            "",
        )
        for k in rates:
            self.results[f"rate.{k}"] = rates[k]
            self.results[f"cpu.{k}"] = cpus[k]

    async def scaling(self) -> None:
        n, reps = self.args.n, self.args.reps
        self.header("2. Two amqpjobs worker processes vs one (16 slots each)")
        one = next(c for c in contestants() if c.key == "aj16")
        two = Contestant("aj16x2", "2 × amqpjobs consume, 16 slots", one.argv, "amqpjobs", 32, processes=2)
        rate1, rate2, cpu2 = self.results.get("rate.aj16") or Stat(), Stat(), Stat()
        for rep in range(reps):
            if "rate.aj16" not in self.results:
                rate1.add((await self.drain(one, n, rep)).rate)
            d = await self.drain(two, n, rep)
            rate2.add(d.rate)
            cpu2.add(d.cpu_us)
            print(f"  rep {rep + 1}/{reps} 2 processes {d.rate:8.0f} jobs/s", flush=True)
        self.report.table(
            ["workers", "jobs/s median (min–max)", "client CPU µs/job"],
            [
                ["1 process", rate1.fmt(), (self.results.get("cpu.aj16") or Stat()).fmt()],
                ["2 processes", rate2.fmt(), cpu2.fmt()],
            ],
        )
        self.report.add(
            f"Scaling 2 vs 1: {ratio(rate2, rate1):.2f}× (2 cores shared by both workers, the broker and the "
            "harness: the ideal is well below 2×).",
            "",
        )
        self.results["rate.aj16x2"] = rate2

    async def publish(self) -> None:
        n, reps = self.args.n, self.args.reps
        single = max(50, min(n // 10, 2000))
        self.header(f"3. Publish rate with publisher confirms ({single:,} one by one, {n:,} batched 500 at a time)")
        settings = await self.vhost("publish")
        app = App("bench", topology=load_topology(self.tmp / "bench.toml").topology, url=settings.url)
        app.job(JOB, queue=QUEUE)(_noop)
        await app.connect()
        connection = await aio_pika.connect_robust(settings.url)
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)

        async def aj_one(k: int) -> None:
            for _ in range(k):
                await app.enqueue(JOB, {"t": time.time()})

        async def aj_batch(k: int) -> None:
            for start in range(0, k, 500):
                await asyncio.gather(*(app.enqueue(JOB, {"t": time.time()}) for _ in range(min(500, k - start))))

        async def raw_one(k: int) -> None:
            for _ in range(k):
                await exchange.publish(raw_message(time.time()), QUEUE)

        async def raw_batch(k: int) -> None:
            for start in range(0, k, 500):
                now = time.time()
                await asyncio.gather(*(exchange.publish(raw_message(now), QUEUE) for _ in range(min(500, k - start))))

        cases: list[tuple[str, str, Callable[[int], Awaitable[None]], int]] = [
            ("aj1", "amqpjobs `enqueue`, one by one", aj_one, single),
            ("raw1", "raw aio-pika publish, one by one", raw_one, single),
            ("ajb", "amqpjobs `enqueue`, batched (gather 500)", aj_batch, n),
            ("rawb", "raw aio-pika publish, batched (gather 500)", raw_batch, n),
        ]
        rates = {key: Stat() for key, *_ in cases}
        cpus = {key: Stat() for key, *_ in cases}
        try:
            for rep in range(reps):
                for key, _, fn, k in cases:
                    await self.purge(settings)
                    c0, t0 = own_cpu(), time.perf_counter()
                    await fn(k)
                    elapsed, cpu = time.perf_counter() - t0, own_cpu() - c0
                    rates[key].add(k / elapsed)
                    cpus[key].add(cpu / k * 1e6)
                    print(f"  rep {rep + 1}/{reps} {key:<5} {k / elapsed:8.0f} msg/s", flush=True)
            await self.purge(settings)
        finally:
            await connection.close()
            await app.close()
        self.report.table(
            ["publisher", "msg/s median (min–max)", "client CPU µs/msg"],
            [[label, rates[key].fmt(), cpus[key].fmt()] for key, label, *_ in cases],
        )
        rb = ratio(rates["ajb"], rates["rawb"])
        self.report.add(
            f"enqueue batched / raw batched: {rb:.2f}× (target ≥ 0.9×: {verdict(rb, 0.9)}); one by one: "
            f"{ratio(rates['aj1'], rates['raw1']):.2f}×.",
            "",
        )
        self.results.update({f"pub.{k}": v for k, v in rates.items()})
        self.results.update({f"cpu.pub.{k}": v for k, v in cpus.items()})

    async def latency(self) -> None:
        reps = self.args.reps
        m = max(100, min(self.args.n // 10, 2000))
        rate = 200.0
        self.header(f"4. Latency, enqueue → handler start, {m:,} jobs at a steady {rate:.0f} jobs/s")
        cs = {c.key: c for c in contestants()}
        p50 = {k: Stat() for k in ("aj16", "raw16")}
        p99 = {k: Stat() for k in ("aj16", "raw16")}
        worst = {k: Stat() for k in ("aj16", "raw16")}
        for rep in range(reps):
            for key in ("aj16", "raw16"):
                lat = await self.paced(cs[key], m, rate, rep)
                p50[key].add(percentile(lat, 0.50))
                p99[key].add(percentile(lat, 0.99))
                worst[key].add(lat[-1])
                print(f"  rep {rep + 1}/{reps} {key:<6} p50 {lat[len(lat) // 2] * 1e3:6.2f} ms "
                      f"p99 {percentile(lat, 0.99) * 1e3:6.2f} ms", flush=True)  # fmt: skip
        self.report.table(
            ["consumer (publisher)", "p50 ms", "p99 ms", "max ms"],
            [
                [f"{cs[k].label} ({'App.enqueue' if k == 'aj16' else 'raw aio-pika publish'})",
                 p50[k].fmt(".2f", 1e3), p99[k].fmt(".2f", 1e3), worst[k].fmt(".2f", 1e3)]
                for k in ("aj16", "raw16")
            ],
        )  # fmt: skip
        r = ratio(p99["aj16"], p99["raw16"])
        self.report.add(f"p99 amqpjobs / raw: {r:.2f}× (target ≤ 1.5×: {verdict(r, 1.5, False)}).", "")
        self.results["lat.p99.aj16"], self.results["lat.p99.raw16"] = p99["aj16"], p99["raw16"]

    async def paced(self, c: Contestant, m: int, rate: float, rep: int) -> list[float]:
        settings = await self.vhost(c.key)
        await self.purge(settings)
        out = self.tmp / f"lat-{c.key}-{rep}.rec"
        proc = self.spawn(c.argv, settings, out, f"lat-{c.key}-{rep}")
        app = App("bench", topology=load_topology(self.tmp / "bench.toml").topology, url=settings.url)
        app.job(JOB, queue=QUEUE)(_noop)
        connection = await aio_pika.connect_robust(settings.url)
        try:
            await self.wait_ready(settings, c.consumers, [proc])
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(EXCHANGE, ensure=False)
            await app.connect()

            async def send() -> None:
                if c.key == "aj16":
                    await app.enqueue(JOB, {"t": time.time()})
                else:
                    await exchange.publish(raw_message(time.time()), QUEUE)

            tasks: set[asyncio.Task[None]] = set()
            t0 = time.monotonic()
            for i in range(m):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            deadline = time.monotonic() + 60
            while count(out) < m and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await connection.close()
            await app.close()
            self.stop([proc])
        return sorted(start - sent for start, sent in read_records(out))

    async def rss(self) -> None:
        total = 200_000 if not self.args.quick else max(2000, self.args.n * 5)
        first = 10_000 if not self.args.quick else max(200, self.args.n // 2)
        marks = sorted({first, total // 4, total // 2, 3 * total // 4, total})
        self.header(f"5. Worker RSS while it runs {total:,} jobs (amqpjobs consume, 16 slots; one run)")
        cs = {c.key: c for c in contestants()}
        rows = []
        for key in ("aj16", "raw16"):
            k_total = total if key == "aj16" else first
            k_marks = [x for x in marks if x <= k_total]
            got = await self.rss_run(cs[key], k_total, k_marks)
            rows.append([cs[key].label, *(f"{got[x] / 2**20:.1f}" if x in got else "–" for x in [0, *marks])])
            if key == "aj16":
                self.results["rss.first"] = Stat([got[first] / 2**20])
                self.results["rss.last"] = Stat([got[total] / 2**20])
        self.report.table(["RSS, MB", "idle", *(f"after {x:,} jobs" for x in marks)], rows)
        a, b = self.results["rss.first"].median, self.results["rss.last"].median
        self.report.add(
            f"amqpjobs worker RSS {a:.1f} MB after {first:,} jobs, {b:.1f} MB after {total:,} "
            f"(growth {b - a:+.1f} MB); target ≤ 60 MB and flat: {verdict(max(a, b), 60, False)}"
            f"{'' if abs(b - a) <= 2 else ' (not flat)'}.",
            "",
        )

    async def rss_run(self, c: Contestant, total: int, marks: list[int]) -> dict[int, int]:
        settings = await self.vhost(c.key)
        await self.purge(settings)
        out = self.tmp / f"rss-{c.key}.rec"
        proc = self.spawn(c.argv, settings, out, f"rss-{c.key}")
        ps = psutil.Process(proc.pid)
        got: dict[int, int] = {}
        try:
            await self.wait_ready(settings, c.consumers, [proc])
            await asyncio.sleep(0.5)
            got[0] = ps.memory_info().rss
            published = 0
            deadline = time.monotonic() + 120 + total / 200
            pending = list(marks)
            while pending:
                done = count(out)
                while pending and done >= pending[0]:
                    got[pending.pop(0)] = ps.memory_info().rss
                if published < total and published - done < 20_000:
                    k = min(5_000, total - published)
                    await asyncio.to_thread(fill_sync, settings.url, "amqpjobs", k)
                    published += k
                else:
                    await asyncio.sleep(0.05)
                self.check_alive([proc])
                if time.monotonic() > deadline:
                    raise BenchError(f"RSS run: only {done} of {total} jobs in time")
        finally:
            self.stop([proc])
        return got

    async def retry_timing(self) -> None:
        reps = self.args.reps
        jobs = 100 if not self.args.quick else 20
        self.header(f"6. Retry-tier timing error ({jobs} jobs failing twice: tiers 1 s then 5 s) and replay rate error")
        errors = {tier: {p: Stat() for p in ("p50", "p99", "max")} for tier in (1.0, 5.0)}
        for rep in range(reps):
            got = await self.retry_run(jobs, rep)
            for tier, values in got.items():
                values.sort()
                errors[tier]["p50"].add(percentile(values, 0.5))
                errors[tier]["p99"].add(percentile(values, 0.99))
                errors[tier]["max"].add(values[-1])
            print(f"  rep {rep + 1}/{reps} retry timing done", flush=True)
        self.report.table(
            ["tier", "error p50 ms", "error p99 ms", "error max ms"],
            [[f"{tier:g} s", *(errors[tier][p].fmt(".0f", 1e3) for p in ("p50", "p99", "max"))] for tier in errors],
        )
        self.report.add(
            "Error = (start of the next attempt − end of the failed one) − the tier's delay; it includes the "
            "republish to the tier (confirmed), the queue TTL expiry, the dead-letter hop back and the delivery.",
            "",
        )
        import replay_rate

        settings = await self.vhost("replay", topology=False)
        path = self.tmp / "replay.toml"
        path.write_text(replay_rate.TOPOLOGY)
        await apply_topology(path, settings)
        seconds = 4 if not self.args.quick else 1
        rows = []
        for rate in (100.0, 500.0):
            achieved = Stat()
            for rep in range(reps):
                value, _ = await replay_rate.one(settings, rate, int(rate * seconds), self.tmp)
                achieved.add(value)
                print(f"  rep {rep + 1}/{reps} replay at {rate:.0f}/s: {value:.1f}/s", flush=True)
            error = Stat([(v / rate - 1) * 100 for v in achieved.values])
            rows.append([f"{rate:.0f}", f"{int(rate * seconds):,}", achieved.fmt(".1f"), error.fmt("+.1f")])
        self.report.table(["requested msg/s", "messages", "achieved msg/s", "error %"], rows)

    async def retry_run(self, jobs: int, rep: int) -> dict[float, list[float]]:
        settings = await self.vhost(f"retry{rep}")
        app = App("bench", topology=load_topology(self.tmp / "bench.toml").topology, url=settings.url)
        starts: dict[str, list[tuple[float, float]]] = {}

        async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
            begin = time.time()
            runs = starts.setdefault(ctx.job_id, [])
            runs.append((begin, begin))
            if ctx.attempt < 3:
                runs[-1] = (begin, time.time())
                raise Retry("again")

        app.job(JOB, queue=QUEUE)(flaky)
        worker = Worker(app, settings, WorkerOptions(concurrency=16))
        await worker.start()
        try:
            await asyncio.gather(*(app.enqueue(JOB, {"t": time.time()}) for _ in range(jobs)))
            deadline = time.monotonic() + 60
            while sum(len(v) for v in starts.values()) < 3 * jobs and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await worker.shutdown()
            await app.close()
        out: dict[float, list[float]] = {1.0: [], 5.0: []}
        for runs in starts.values():
            for (_, failed), (begin, _), tier in zip(runs, runs[1:], (1.0, 5.0), strict=False):
                out[tier].append(begin - failed - tier)
        return out

    async def apply_time(self) -> None:
        reps = self.args.reps
        queues = 200 if not self.args.quick else 20
        lines = ['[[exchange]]\nname = "jobs"\n']
        for i in range(queues):
            lines.append(f'[[job_queue]]\nname = "q{i:03d}"\nexchange = "jobs"\nretry_tiers = ["1s", "10s", "1m"]\n')
        path = self.tmp / "apply200.toml"
        path.write_text("\n".join(lines))
        d = load_topology(path).topology.declarations()
        self.apply_objects = len(d.exchanges) + len(d.queues) + len(d.bindings)
        self.header(
            f"7. `amqpjobs topology apply` for {queues} job queues with 3 retry tiers each ({len(d.exchanges):,} "
            f"exchanges, {len(d.queues):,} queues, {len(d.bindings):,} bindings)"
        )
        first, second = Stat(), Stat()
        for rep in range(reps):
            settings = await self.vhost(f"apply{rep}", topology=False)
            for stat in (first, second):
                env = {**os.environ, "AMQPJOBS_URL": settings.url, "AMQPJOBS_MANAGEMENT_URL": settings.management_url}
                t0 = time.perf_counter()
                done = await asyncio.to_thread(
                    subprocess.run, [*AMQPJOBS_CLI, "topology", "apply", str(path)], env=env, capture_output=True
                )
                if done.returncode != 0:
                    raise BenchError(f"topology apply failed: {done.stderr.decode()[-2000:]}")
                stat.add(time.perf_counter() - t0)
            print(f"  rep {rep + 1}/{reps} apply {first.values[-1]:.2f} s, again {second.values[-1]:.2f} s", flush=True)
        self.report.table(
            ["run", "seconds (whole command, Python start included)", "target"],
            [
                ["first (creates everything)", first.fmt(".2f"), f"≤ 3 s: {verdict(first.median, 3.0, False)}"],
                ["second (nothing to create)", second.fmt(".2f"), f"≤ 3 s: {verdict(second.median, 3.0, False)}"],
            ],
        )
        self.results["apply.first"], self.results["apply.second"] = first, second

    # -- profile
    def py_spy(self) -> str | None:
        return shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")

    async def no_profile(self) -> None:
        self.header("Where the time goes (py-spy, amqpjobs worker hot path)")
        self.report.add("Not profiled in this run (--quick or --no-profile).", "")

    async def profile(self) -> None:
        missed = []
        got = self.results
        if ratio(got.get("rate.aj16", Stat()), got.get("rate.raw16", Stat())) < 1.0:
            missed.append(("aj16", "raw16"))
        if ratio(got.get("rate.aj1", Stat()), got.get("rate.raw1", Stat())) < 0.9:
            missed.append(("aj1", "raw1"))
        peers_missed = [
            (key, target) for key, target in (("dramatiq", 2.0), ("celery", 3.0))
            if ratio(got.get("rate.aj16", Stat()), got.get(f"rate.{key}", Stat())) < target
        ]  # fmt: skip
        missed += [("aj16", key) for key, _ in peers_missed]
        self.header("Where the time goes (py-spy, amqpjobs worker hot path)")
        spy = self.py_spy()
        if spy is None:
            self.report.add("py-spy is not installed (pip install -e '.[bench]'); no profile taken.", "")
            return
        if not missed:
            self.report.add("Every worker throughput target was met; the worker was not profiled.", "")
        for key, target in peers_missed:
            self.report.add(*ceiling_note(got, key, target))
        cs = {c.key: c for c in contestants()}
        n = self.args.n
        if missed:
            self.report.add(
                "py-spy samples each consumer process at 250 Hz while it drains the same pre-filled queue as in "
                "table 1 (idle samples, i.e. waiting in `select`, and start-up imports left out). *self* = the "
                "function itself was running; *total* = it was on the stack (the event loop's own frames, on every "
                "stack, omitted). µs/job = share × the contestant's median client CPU per job from table 1.",
                "",
            )
        profiled: set[str] = set()
        for ours, theirs in missed:
            for key in (ours, theirs):
                if key in profiled:
                    continue
                profiled.add(key)
                c = cs[key]
                raw = self.tmp / f"profile-{key}.txt"
                argv = [spy, "record", "--subprocesses", "--rate", "250", "--format", "raw", "-o", str(raw), "--",
                        *c.argv]  # fmt: skip
                await self.drain(c, n, 99, argv=argv)
                cpu = self.results[f"cpu.{key}"].median
                self.report.add(f"### {c.label}", "")
                self.report.add(*profile_tables(raw, cpu, "µs/job"))
            short = {"aj16": "amqpjobs 16 slots", "raw16": "raw aio-pika prefetch 16", "aj1": "amqpjobs 1 slot",
                     "raw1": "raw aio-pika prefetch 1", "dramatiq": "Dramatiq 8 threads",
                     "celery": "Celery -c 2"}  # fmt: skip
            self.report.add(f"### {short[ours]} vs {short[theirs]}", "")
            self.report.add(
                *package_diff(
                    (short[ours], self.tmp / f"profile-{ours}.txt", self.results[f"cpu.{ours}"].median),
                    (short[theirs], self.tmp / f"profile-{theirs}.txt", self.results[f"cpu.{theirs}"].median),
                )
            )
        if ratio(self.results.get("pub.ajb", Stat()), self.results.get("pub.rawb", Stat())) < 0.9:
            settings = await self.vhost("publish")
            await self.purge(settings)
            raw = self.tmp / "profile-enqueue.txt"
            argv = [spy, "record", "--rate", "250", "--format", "raw", "-o", str(raw), "--",
                    PY, str(BENCH / "consumers.py"), "enqueue", "--n", str(n)]  # fmt: skip
            proc = self.spawn(argv, settings, self.tmp / "enqueue.rec", "profile-enqueue")
            await asyncio.to_thread(proc.wait, 120 + n / 100)
            self.stop([proc])
            await self.purge(settings)
            cpu = self.results["cpu.pub.ajb"].median
            self.report.add(f"### `App.enqueue`, batched (gather 500), {n:,} jobs", "")
            self.report.add(*profile_tables(raw, cpu, "µs/msg"))
        first = self.results.get("apply.first")
        if first is not None and first.median > 3.0:
            settings = await self.vhost("apply-profile", topology=False)
            raw = self.tmp / "profile-apply.txt"
            argv = [spy, "record", "--idle", "--rate", "250", "--format", "raw", "-o", str(raw), "--",
                    *AMQPJOBS_CLI, "topology", "apply", str(self.tmp / "apply200.toml")]  # fmt: skip
            proc = self.spawn(argv, settings, self.tmp / "apply.rec", "profile-apply")
            await asyncio.to_thread(proc.wait, 120)
            self.stop([proc])
            self.report.add(
                "### `amqpjobs topology apply`, 200 job queues, first run (wall clock: idle samples, i.e. waiting "
                "for the broker, included; imports included)",
                "",
            )
            self.report.add(*profile_tables(raw, first.median * 1e3, "ms/run", skip_imports=False))
            prof = read_profile(raw, skip_imports=False)
            waiting = prof.packages.get("stdlib selectors", 0) / prof.samples if prof.samples else 0.0
            objects = getattr(self, "apply_objects", 0)
            if objects:
                self.report.add(
                    f"Waiting in `select` is {100 * waiting:.0f}% of the command's {first.median:.2f} s: the "
                    f"{objects:,} declarations go one at a time over one channel, so each costs a broker round "
                    f"trip (≈ {first.median * waiting / objects * 1e3:.1f} ms each).",
                    "",
                )

    # -- all
    async def run(self) -> str:
        started = time.monotonic()
        with ManagementClient(self.root) as mgmt:
            totals = mgmt.overview().get("object_totals", {})
        self.report.add(
            "# amqpjobs benchmarks",
            "",
            f"Written by `python bench/run.py{' --quick' if self.args.quick else ''} --n {self.args.n} "
            f"--reps {self.args.reps}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
            "",
            self.machine.line(),
            "",
            "Same machine, same broker, same run. Durable queues, persistent messages, publisher confirms on every "
            "publish, ack after a trivial handler (it appends one 36-byte record to a file, the same for every "
            "contestant). Every consumer is a process of its own in a throwaway vhost. Figures are the median of "
            f"{self.args.reps} runs with (min–max); contestants take turns within each run. Rates count the "
            "jobs between the 10% and the 90% record (start-up and tail left out); client CPU is user + system "
            "time of the consumer process and its children over the same stretch (Celery's pool, Dramatiq's "
            "worker process).",
            "",
            f"**Noise:** other engineers run their test suites against this same broker and machine (at the start "
            f"the broker had {totals.get('connections', '?')} connections and {totals.get('queues', '?')} queues "
            "besides ours). Expect a few percent of run-to-run spread; the min–max ranges show it. Ratios within one "
            "table are steadier than absolute figures across tables.",
            "",
            f"Code: {git_revision()}.",
            "",
            f"Versions: amqpjobs {_version('amqpjobs')}, aio-pika {_version('aio-pika')}, aiormq "
            f"{_version('aiormq')}, pika {_version('pika')}, Dramatiq {_version('dramatiq')}, Celery "
            f"{_version('celery')} (kombu {_version('kombu')}, py-amqp {_version('amqp')}).",
            "",
        )
        sections: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("throughput", self.throughput),
            ("scaling", self.scaling),
            ("publish", self.publish),
            ("latency", self.latency),
            ("rss", self.rss),
            ("retry", self.retry_timing),
            ("apply", self.apply_time),
        ]
        if self.args.no_profile:
            sections.append(("profile", self.no_profile))
        else:
            sections.append(("profile", self.profile))
        if self.args.only:
            sections = [(name, section) for name, section in sections if name in self.args.only]
        for name, section in sections:
            t0 = time.monotonic()
            try:
                await section()
            except Exception as exc:  # one broken section must not lose the others' figures
                traceback.print_exc()
                self.report.add(f"**The {name} section failed:** `{type(exc).__name__}: {str(exc)[:500]}`", "")
            print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
        self.report.add(f"_Whole run: {time.monotonic() - started:.0f} s._")
        return self.report.text()


async def _noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Publishing-side registration of the job (nothing runs it in this process)."""


# ---------------------------------------------------------------------------------- profiles


BENCH_FILES = ("common.py", "bench_app.py", "consumers.py", "peer_celery.py", "peer_dramatiq.py")
#: Frames on (nearly) every stack of a worker: left out of the "total" table.
ROOT_FRAMES = {
    "<module>", "run", "Runner.run", "BaseEventLoop.run_until_complete", "BaseEventLoop.run_forever",
    "BaseEventLoop._run_once", "Handle._run", "main", "consume", "_errors_to_exit_codes.<locals>.wrapper",
}  # fmt: skip


def _path(frame: str) -> str:
    return frame.rsplit(" (", 1)[-1].rstrip(")").rsplit(":", 1)[0]


def package_of(frame: str) -> str:
    """Which package a py-spy frame ``function (path:line)`` belongs to (py-spy prints paths from sys.path)."""
    path = _path(frame)
    if path == "<string>":
        return "generated code (dataclass __init__)"
    if path.startswith("<frozen "):
        return "stdlib " + path.removeprefix("<frozen ").split(".")[0].rstrip(">")
    for marker in ("site-packages/", "/python3.11/", "/work/main/"):
        path = path.split(marker, 1)[-1]
    top = path.split("/", 1)[0].removesuffix(".py")
    if path.split("/")[-1] in BENCH_FILES:
        return "bench handler"
    if top in sys.stdlib_module_names:
        return f"stdlib {top}"
    return top or "other"


def _short(frame: str) -> str:
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/python3.11/", "/bench/", "/work/main/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"`{name}` ({where.rsplit(':', 1)[0]})"


@dataclass
class Profile:
    """py-spy's raw (collapsed) output, counted."""

    samples: int = 0
    self_time: Counter[str] = field(default_factory=Counter)
    total_time: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)

    def package_share(self, per_unit: float) -> dict[str, float]:
        return {pkg: per_unit * w / self.samples for pkg, w in self.packages.items()} if self.samples else {}


def read_profile(path: Path, skip_imports: bool = True) -> Profile:
    prof = Profile()
    if not path.exists():
        return prof
    for line in path.read_text().splitlines():
        stack, _, weight = line.rpartition(" ")
        if not stack or not weight.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames or (skip_imports and any("_find_and_load" in f for f in frames)):
            continue  # start-up imports
        w = int(weight)
        prof.samples += w
        leaf = frames[-1]
        prof.self_time[_short(leaf)] += w
        prof.packages[package_of(leaf)] += w
        for f in {_short(f) for f in frames}:
            prof.total_time[f] += w
    return prof


def profile_tables(path: Path, per_unit: float, unit: str, skip_imports: bool = True, top: int = 15) -> Iterator[str]:
    """Markdown tables from py-spy's raw (collapsed) output: self time by package, top self, top total."""
    prof = read_profile(path, skip_imports)
    samples = prof.samples
    if not samples:
        yield "(py-spy wrote no profile)" if not path.exists() else "(no samples)"
        yield ""
        return
    yield f"{samples:,} samples. Self time by package:"
    yield ""
    yield f"| package | self % | ≈ {unit} |"
    yield "|---|---|---|"
    for pkg, w in prof.packages.most_common():
        yield f"| {pkg} | {100 * w / samples:.1f} | {per_unit * w / samples:.1f} |"
    yield ""
    yield f"| top functions by self time | self % | ≈ {unit} |"
    yield "|---|---|---|"
    for f, w in prof.self_time.most_common(top):
        yield f"| {f} | {100 * w / samples:.1f} | {per_unit * w / samples:.1f} |"
    yield ""
    yield f"| top functions by total time (on the stack) | total % | ≈ {unit} |"
    yield "|---|---|---|"
    shown = [(f, w) for f, w in prof.total_time.most_common() if f.split("`")[1] not in ROOT_FRAMES]
    shown = [(f, w) for f, w in shown if not f.endswith("(click/core.py)")][: top + 10]
    for f, w in shown:
        yield f"| {f} | {100 * w / samples:.1f} | {per_unit * w / samples:.1f} |"
    yield ""


def ceiling_note(got: dict[str, Stat], peer: str, target: float) -> list[str]:
    """Why amqpjobs misses ``target`` × ``peer``: what that rate would be against the client ceilings."""
    aj, peer_rate = got.get("rate.aj16", Stat()).median, got.get(f"rate.{peer}", Stat()).median
    raw, pika = got.get("rate.raw16", Stat()).median, got.get("rate.pika200", Stat()).median
    needed = target * peer_rate
    name = {"dramatiq": "Dramatiq", "celery": "Celery"}[peer]
    lines = [
        f"**{target:g}× {name} missed ({aj / peer_rate:.2f}×).** It would take {needed:,.0f} jobs/s from amqpjobs' "
        f"16 slots: {needed / raw:.2f}× raw aio-pika prefetch 16 ({raw:,.0f} jobs/s, the issue's practical "
        f"ceiling of a Python asyncio client; raw aio-pika itself is {raw / peer_rate:.2f}× {name} here)"
        + (
            f" and {needed / pika:.2f}× the sync pika prefetch-200 ceiling line ({pika:,.0f} jobs/s)"
            if pika == pika
            else ""
        )
        + f". amqpjobs runs at {aj / raw:.2f}× raw aio-pika. The profiles below show where each spends its CPU "
        "per job: in amqpjobs most of it is aiormq/pamqp frame decoding and the asyncio loop, which every "
        "aio-pika-based consumer pays; the framework's own share (package amqpjobs) is the rest.",
        "",
    ]
    return lines


def package_diff(ours: tuple[str, Path, float], theirs: tuple[str, Path, float]) -> Iterator[str]:
    """Where the extra client CPU per job goes: self time by package, µs/job, side by side."""
    a = read_profile(ours[1]).package_share(ours[2])
    b = read_profile(theirs[1]).package_share(theirs[2])
    if not a or not b:
        return
    yield f"Where {ours[0]} spends its extra CPU per job over {theirs[0]} (self time by package, ≈ µs/job):"
    yield ""
    yield f"| package | {ours[0]} | {theirs[0]} | difference |"
    yield "|---|---|---|---|"
    rows = sorted(set(a) | set(b), key=lambda k: a.get(k, 0.0) - b.get(k, 0.0), reverse=True)
    for pkg in rows:
        x, y = a.get(pkg, 0.0), b.get(pkg, 0.0)
        if max(x, y) >= 0.5:
            yield f"| {pkg} | {x:.1f} | {y:.1f} | {x - y:+.1f} |"
    yield f"| **total** | {sum(a.values()):.0f} | {sum(b.values()):.0f} | {sum(a.values()) - sum(b.values()):+.0f} |"
    yield ""


# ---------------------------------------------------------------------------------- main


def broker_root() -> BrokerSettings:
    subprocess.run(["bash", str(ROOT / "scripts/broker.sh"), "up"], capture_output=True, check=True)
    urls = subprocess.run(
        ["bash", str(ROOT / "scripts/broker.sh"), "url"], capture_output=True, text=True, check=True
    ).stdout.split()
    return broker_settings(urls[-2], urls[-1])


async def amain(args: argparse.Namespace) -> int:
    if args.url:
        root = broker_settings(args.url, args.management_url)
    else:
        root = await asyncio.to_thread(broker_root)
    with ManagementClient(root) as mgmt:
        overview = mgmt.overview()
    machine = Machine(
        os.cpu_count() or 0, cpu_model(), str(overview.get("rabbitmq_version")), str(overview.get("erlang_version"))
    )
    bench = Bench(args, root, machine)
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # clean up as on Ctrl-C
    try:
        text = await bench.run()
    finally:
        bench.stop_all()
        bench.delete_vhosts()
        if not args.keep:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    await asyncio.to_thread(Path(args.out).write_text, text)
    print(f"wrote {args.out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None, help="jobs per throughput run (default 20,000; 1,000 quick)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 3; 1 quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: small N, one repetition, no profile")
    parser.add_argument("--out", default=str(BENCH / "RESULTS.md"), help="where to write the results")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of missed targets")
    parser.add_argument("--profile", action="store_true", help="profile missed targets also with --quick")
    parser.add_argument("--keep", action="store_true", help="keep the records and logs under .broker/bench/")
    parser.add_argument("--url", help="AMQP URL of the broker (default: scripts/broker.sh's node)")
    parser.add_argument("--management-url", help="its management API URL (default: AMQP port + 10000)")
    parser.add_argument(
        "--only", type=lambda s: s.split(","), default=None,
        help="comma-separated sections to run: throughput,scaling,publish,latency,rss,retry,apply,profile",
    )  # fmt: skip
    parser.add_argument(
        "--contestants", type=lambda s: s.split(","), default=None,
        help="comma-separated contestant keys for the throughput table (default all): " + ",".join(
            c.key for c in contestants()),
    )  # fmt: skip
    args = parser.parse_args()
    sections = ("throughput", "scaling", "publish", "latency", "rss", "retry", "apply", "profile")
    keys = [c.key for c in contestants()]
    for option, given, known in (("--only", args.only, sections), ("--contestants", args.contestants, keys)):
        if given is not None:
            unknown = [x for x in given if x not in known]
            if unknown or not given:
                parser.error(
                    f"{option}: unknown {', '.join(map(repr, unknown)) or 'empty list'}; choose from {', '.join(known)}"
                )
    if args.contestants is not None:
        args.contestants = list(dict.fromkeys(args.contestants))
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.n is None:
        args.n = 1000 if args.quick else 20_000
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.quick and not args.profile:
        args.no_profile = True
    if args.n < 20:
        parser.error("--n must be at least 20")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
