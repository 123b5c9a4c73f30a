"""Bench sections 1-5: throughput, scaling to two workers, publish rate, the sync publisher, latency."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable

import aio_pika
import sync_publish
from common import EXCHANGE, JOB, QUEUE, count, read_records
from harness import Contestant, Harness, _noop, contestants, percentile
from publishers import raw_message
from report import BENCH, GOALS, PY, Stat, per_cpu_second, ratio

from amqpjobs import App
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings

#: Seconds of sends at the start of each latency run that are not counted (section 5).
WARM_UP = 0.5


def one_at_a_time(n: int) -> int:
    """Publishes per contestant where each waits for its confirm (sections 3 and 4): a tenth of ``--n``, 50-2,000."""
    return max(50, min(n // 10, 2000))


class LoadScenarios(Harness):
    """Sections 1-5."""

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

        def judged(label: str, key: str, value: float, quiet: str, detail: str) -> list[str]:
            goal = GOALS[key]
            self.goal(key, value, detail)
            return [label, goal.fmt(value), quiet, goal.target_text(), goal.verdict(value)]

        def jobs(a: str, b: str) -> str:
            return f"{rates[a].median:,.0f} vs {rates[b].median:,.0f} jobs/s"

        self.report.table(
            ["ratio", "as shipped (log lines on)", "log lines off", "target", "verdict (as shipped)"],
            [
                judged("amqpjobs 16 slots / raw aio-pika prefetch 16", "aj16/raw16", r["raw16"], f"{rq['raw16']:.2f}×",
                       jobs("aj16", "raw16")),
                judged("amqpjobs 1 slot / raw aio-pika prefetch 1", "aj1/raw1", r1, "–", jobs("aj1", "raw1")),
                judged("amqpjobs 16 slots / Dramatiq 8 threads", "aj16/dramatiq", r["dramatiq"],
                       f"{rq['dramatiq']:.2f}×", jobs("aj16", "dramatiq")),
                judged("amqpjobs 16 slots / Celery -c 2", "aj16/celery", r["celery"], f"{rq['celery']:.2f}×",
                       jobs("aj16", "celery")),
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
        self.header("2. `amqpjobs consume --processes 2` vs `--processes 1` (16 slots each)")
        shipped = next(c for c in contestants() if c.key == "aj16")  # --processes 1 is the default: same command
        one = Contestant("aj16p1", "amqpjobs consume --processes 1, 16 slots", [*shipped.argv, "--processes", "1"],
                         "amqpjobs", 1)  # fmt: skip
        two = Contestant("aj16p2", "amqpjobs consume --processes 2, 16 slots each", [*shipped.argv, "--processes", "2"],
                         "amqpjobs", 2)  # fmt: skip
        rate1, cpu1, rate2, cpu2 = Stat(), Stat(), Stat(), Stat()
        for rep in range(reps):  # the two take turns within each repetition (table 1's figures are not reused)
            for c, rate, cpu in ((one, rate1, cpu1), (two, rate2, cpu2)):
                d = await self.drain(c, n, rep)
                rate.add(d.rate)
                cpu.add(d.cpu_us)
                print(f"  rep {rep + 1}/{reps} {c.key:<6} {d.rate:8.0f} jobs/s {d.cpu_us:7.0f} µs CPU/job", flush=True)
        self.report.table(
            ["workers", "jobs/s median (min–max)", "client CPU µs/job (supervisor + children)",
             "jobs/s per client CPU-second"],
            [["--processes 1", rate1.fmt(), cpu1.fmt(), per_cpu_second(cpu1)],
             ["--processes 2", rate2.fmt(), cpu2.fmt(), per_cpu_second(cpu2)]],
        )  # fmt: skip
        per_cpu = cpu1.median / cpu2.median if cpu2.median else float("nan")
        speed = self.goal("p2/p1", ratio(rate2, rate1), f"{rate2.median:,.0f} vs {rate1.median:,.0f} jobs/s")
        per_second = [f"{1e6 / c.median:,.0f}" if c.median else "–" for c in (cpu2, cpu1)]
        thrift = self.goal("p2/p1.cpu", per_cpu, f"{per_second[0]} vs {per_second[1]} jobs per client CPU-second")
        self.report.add(
            f"`--processes 2` / `--processes 1`: jobs/s {speed}; jobs per client CPU-second {thrift}. 2 cores "
            "shared by the workers, the broker and the harness: the ideal is well below 2×.",
            "",
        )
        self.results.update({"rate.aj16p1": rate1, "cpu.aj16p1": cpu1, "rate.aj16p2": rate2, "cpu.aj16p2": cpu2})

    async def publish(self) -> None:
        n, reps = self.args.n, self.args.reps
        single = one_at_a_time(n)
        self.header(f"3. Publish rate with publisher confirms ({single:,} one by one, {n:,} batched 500 at a time)")
        settings = await self.vhost("publish")
        cases = [
            ("aj1", "amqpjobs `enqueue`, one by one", "amqpjobs", "one", single),
            ("raw1", "raw aio-pika publish, one by one", "raw", "one", single),
            ("ajb", "amqpjobs `enqueue`, batched (gather 500)", "amqpjobs", "batch", n),
            ("rawb", "raw aio-pika publish, batched (gather 500)", "raw", "batch", n),
        ]
        rates = {key: Stat() for key, *_ in cases}
        cpus = {key: Stat() for key, *_ in cases}
        for rep in range(reps):
            # fresh processes each repetition: where the scheduler puts a process beside the broker's
            # threads on 2 cores held for a whole run (run P: every aj1 slower, run O: every raw1);
            # who goes first alternates
            order = cases if rep % 2 == 0 else [cases[1], cases[0], cases[3], cases[2]]
            procs = {who: await self.publisher(who, settings) for who in dict.fromkeys(c[2] for c in order)}
            try:
                for key, _, who, mode, k in order:
                    await self.purge(settings)
                    got = await self.ask(procs[who], f"{mode} {k}")
                    rates[key].add(got["rate"])
                    cpus[key].add(got["cpu_us"])
                    print(f"  rep {rep + 1}/{reps} {key:<5} {got['rate']:8.0f} msg/s", flush=True)
            finally:
                await self.close_publishers(procs.values())
        await self.purge(settings)
        self.report.table(
            ["publisher (a process of its own)", "msg/s median (min–max)", "client CPU µs/msg"],
            [[label, rates[key].fmt(), cpus[key].fmt()] for key, label, *_ in cases],
        )
        batched = self.goal("enqueueb/rawb", ratio(rates["ajb"], rates["rawb"]),
                            f"{rates['ajb'].median:,.0f} vs {rates['rawb'].median:,.0f} msg/s")  # fmt: skip
        one_by_one = self.goal("enqueue1/raw1", ratio(rates["aj1"], rates["raw1"]),
                            f"{rates['aj1'].median:,.0f} vs {rates['raw1'].median:,.0f} msg/s")  # fmt: skip
        self.report.add(
            f"enqueue / raw aio-pika: one by one {one_by_one}; batched {batched}. Each publisher runs in a process "
            "of its own (bench/publishers.py): amqpjobs replaces aiormq's frame reader for every connection of "
            "its process, so a raw aio-pika publisher beside it would read its confirms with amqpjobs' code. Both "
            "processes are started afresh each repetition and who goes first alternates: a process's place beside "
            "the broker's threads on these 2 cores otherwise holds for the whole run.",
            "",
        )
        self.results.update({f"pub.{k}": v for k, v in rates.items()})
        self.results.update({f"cpu.pub.{k}": v for k, v in cpus.items()})

    async def publisher(self, who: str, settings: BrokerSettings) -> asyncio.subprocess.Process:
        """A section-3 publisher process (bench/publishers.py), connected and warmed up."""
        topology = str(self.tmp / "bench.toml")
        argv = [PY, str(BENCH / "publishers.py"), who, "--url", settings.url, "--topology", topology]
        path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=BENCH, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"publisher {who} did not start (exit {await proc.wait()}): {line!r}")
        return proc

    @staticmethod
    async def close_publishers(procs: Iterable[asyncio.subprocess.Process]) -> None:
        """End section-3 publisher processes: stdin closed, then killed if still running after 15 s."""
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 15)
            if proc.returncode is None:
                proc.kill()

    @staticmethod
    async def ask(proc: asyncio.subprocess.Process, command: str) -> dict[str, float]:
        """Send one command to a publisher process and read its JSON answer."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(command.encode() + b"\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), 600)
        if not line:
            raise RuntimeError(f"publisher process ended (exit {await proc.wait()}) on {command!r}")
        answer: dict[str, float] = json.loads(line)
        return answer

    async def sync_publish(self) -> None:
        reps = self.args.reps
        k = one_at_a_time(self.args.n)
        self.header(f"4. Sync publisher: {k:,} jobs one at a time, each confirmed, vs Dramatiq's `send`")
        aj = await self.vhost("sync-aj")
        dq = await self.vhost("sync-dramatiq", topology=False)
        got = await asyncio.to_thread(sync_publish.measure, aj, dq, self.tmp / "bench.toml", k, reps)
        rates = {key: Stat([r for r, _ in values]) for key, values in got.items()}
        cpus = {key: Stat([c for _, c in values]) for key, values in got.items()}
        labels = {
            "amqpjobs": "amqpjobs `sync_publisher().enqueue`",
            "dramatiq": "Dramatiq `send` (confirm_delivery=True)",
            "hand-off": "the sync publisher's thread hand-off alone (a call that publishes nothing)",
        }
        self.report.table(
            ["publisher (one call at a time)", "calls/s median (min–max)", "client CPU µs/call"],
            [[labels[key], rates[key].fmt(), cpus[key].fmt()] for key in sync_publish.KEYS],
        )
        r = self.goal("sync/dramatiq", ratio(rates["amqpjobs"], rates["dramatiq"]),
                      f"{rates['amqpjobs'].median:,.0f} vs {rates['dramatiq'].median:,.0f} msg/s")  # fmt: skip
        self.report.add(
            f"`sync_publisher().enqueue` / Dramatiq `send`: {r}. Client CPU is this whole process's (the sync "
            "publisher's loop thread included); the contestants take turns within each repetition, each into a "
            "purged queue of its own vhost (bench/sync_publish.py, also runnable alone).",
            "",
        )
        self.results.update({f"sync.{key}": v for key, v in rates.items()})
        self.results.update({f"cpu.sync.{key}": v for key, v in cpus.items()})

    async def latency(self) -> None:
        reps = self.args.reps
        m = max(100, min(self.args.n // 10, 2000))
        rate = 200.0
        self.header(f"5. Latency, enqueue → handler start, {m:,} jobs at a steady {rate:.0f} jobs/s")
        cs = {c.key: c for c in contestants()}
        keys = ("aj16", "raw16")
        stats = {(mode, k, q): Stat() for mode in ("turns", "once") for k in keys for q in ("p50", "p99", "max")}
        for rep in range(reps):
            order = [cs[k] for k in (keys if rep % 2 == 0 else keys[::-1])]  # who goes (sends) first alternates
            runs = {("turns", c.key): (await self.paced([c], m, rate, rep))[0] for c in order}
            together = await self.paced(order, m, rate, rep)
            runs.update({("once", c.key): lat for c, lat in zip(order, together, strict=True)})
            for (mode, key), lat in runs.items():
                for q, value in (("p50", percentile(lat, 0.50)), ("p99", percentile(lat, 0.99)), ("max", lat[-1])):
                    stats[mode, key, q].add(value)
                print(f"  rep {rep + 1}/{reps} {mode:<5} {key:<6} p50 {percentile(lat, 0.5) * 1e3:6.2f} ms "
                      f"p99 {percentile(lat, 0.99) * 1e3:6.2f} ms", flush=True)  # fmt: skip
        modes = {"once": "both at once", "turns": "in turns"}
        self.report.table(
            ["consumer (publisher)", "runs", "p50 ms", "p99 ms", "max ms"],
            [
                [f"{cs[k].label} ({'App.enqueue' if k == 'aj16' else 'raw aio-pika publish'})", modes[mode],
                 *(stats[mode, k, q].fmt(".2f", 1e3) for q in ("p50", "p99", "max"))]
                for mode in modes for k in keys
            ],
        )  # fmt: skip
        p99 = {(mode, k): stats[mode, k, "p99"] for mode in modes for k in keys}
        turns = ratio(p99["turns", "aj16"], p99["turns", "raw16"])
        ours, raw = p99["once", "aj16"], p99["once", "raw16"]
        r = self.goal("p99/raw", ratio(ours, raw), f"{ours.median * 1e3:.2f} vs {raw.median * 1e3:.2f} ms")
        self.report.add(
            f"p99 amqpjobs / raw, both at once: {r}; in turns: {turns:.2f}× "
            f"({p99['turns', 'aj16'].median * 1e3:.2f} vs {p99['turns', 'raw16'].median * 1e3:.2f} ms). "
            "*Both at once*: the two consumers run side by side, each fed at the steady rate, the sends half a "
            "period apart (who sends first alternates by repetition), so a stall of the broker or the machine "
            "meets both; *in turns*: one after the other (who goes first alternates too), where a burst of "
            "stalls decides the 20th worst of 2,000 samples of whichever contestant it meets. The goal is judged "
            "on *both at once*.",
            "",
        )
        self.results["lat.p99.aj16"], self.results["lat.p99.raw16"] = ours, raw

    async def paced(self, cs: list[Contestant], m: int, rate: float, rep: int) -> list[list[float]]:
        """Feed each consumer of ``cs`` ``m`` jobs at ``rate`` jobs/s, all at once, the sends evenly apart.

        Returns each consumer's latencies (handler start - sent, seconds), sorted. The first
        :data:`WARM_UP` seconds of sends are not counted (both processes' first jobs, lazy
        imports), and the harness freezes its heap first, as a worker process does (its full
        collections would delay the sends of whichever contestant runs then).
        """
        gc.collect()
        gc.freeze()
        tag = "+".join(c.key for c in cs)
        stack = contextlib.AsyncExitStack()
        procs, outs, senders = [], [], []
        try:
            for c in cs:
                settings = await self.vhost(c.key)
                await self.purge(settings)
                out = self.tmp / f"lat-{tag}-{c.key}-{rep}.rec"
                procs.append(self.spawn(c.argv, settings, out, f"lat-{tag}-{c.key}-{rep}"))
                outs.append(out)
                senders.append(await self._sender(c, settings, stack))
            for c, proc in zip(cs, procs, strict=True):
                await self.wait_ready(self.vhosts[c.key], c.consumers, [proc])
            tasks: set[asyncio.Task[None]] = set()
            step = 1 / (rate * len(cs))
            warm = int(WARM_UP * rate) * len(cs)
            t0 = time.monotonic()
            for i in range(warm + m * len(cs)):
                if i == warm:
                    counted_from = time.time()
                delay = t0 + i * step - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(senders[i % len(cs)]())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            deadline = time.monotonic() + 60
            while any(count(out) < m + warm // len(cs) for out in outs) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await stack.aclose()
            self.stop(procs)
        return [sorted(start - sent for start, sent in read_records(out) if sent >= counted_from) for out in outs]

    async def _sender(
        self, c: Contestant, settings: BrokerSettings, stack: contextlib.AsyncExitStack
    ) -> Callable[[], Coroutine[None, None, None]]:
        """A coroutine function that sends one job stamped with the time: App.enqueue for amqpjobs, else raw."""
        if c.key == "aj16":
            app = App("bench", topology=load_topology(self.tmp / "bench.toml").topology, url=settings.url)
            app.job(JOB, queue=QUEUE)(_noop)
            await app.connect()
            stack.push_async_callback(app.close)

            async def enqueue() -> None:
                await app.enqueue(JOB, {"t": time.time()})

            return enqueue
        connection = await aio_pika.connect_robust(settings.url)
        stack.push_async_callback(connection.close)
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)

        async def publish() -> None:
            await exchange.publish(raw_message(time.time()), QUEUE)

        return publish
