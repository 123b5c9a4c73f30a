"""Bench sections 1-4: throughput, scaling to two workers, publish rate, latency."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

import aio_pika
from common import EXCHANGE, JOB, QUEUE, count, read_records
from harness import Contestant, Harness, _noop, contestants, own_cpu, percentile, raw_message
from report import Stat, per_cpu_second, ratio, verdict

from amqpjobs import App
from amqpjobs.topology.loader import load_topology


class LoadScenarios(Harness):
    """Sections 1-4."""

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
        self.header("2. `amqpjobs consume --processes 2` vs `--processes 1` (16 slots each)")
        one = next(c for c in contestants() if c.key == "aj16")
        two = Contestant("aj16p2", "amqpjobs consume --processes 2, 16 slots each", [*one.argv, "--processes", "2"],
                         "amqpjobs", 2)  # fmt: skip
        have = "rate.aj16" in self.results
        rate1, cpu1 = self.results.get("rate.aj16") or Stat(), self.results.get("cpu.aj16") or Stat()
        rate2, cpu2 = Stat(), Stat()
        for rep in range(reps):  # the two take turns within each repetition
            if not have:
                d = await self.drain(one, n, rep)
                rate1.add(d.rate)
                cpu1.add(d.cpu_us)
            d = await self.drain(two, n, rep)
            rate2.add(d.rate)
            cpu2.add(d.cpu_us)
            print(f"  rep {rep + 1}/{reps} --processes 2 {d.rate:8.0f} jobs/s", flush=True)
        self.report.table(
            ["workers", "jobs/s median (min–max)", "client CPU µs/job (supervisor + children)"],
            [["--processes 1", rate1.fmt(), cpu1.fmt()], ["--processes 2", rate2.fmt(), cpu2.fmt()]],
        )
        per_cpu = cpu1.median / cpu2.median if cpu2.median else float("nan")
        self.report.add(
            f"Scaling --processes 2 vs 1: {ratio(rate2, rate1):.2f}× jobs/s (target ≥ 1.35×); jobs per client "
            f"CPU-second {per_cpu:.2f}× that of 1 process (target ≥ 0.9×). 2 cores shared by the workers, the "
            "broker and the harness: the ideal is well below 2×.",
            "",
        )
        self.results["rate.aj16p2"] = rate2
        self.results["cpu.aj16p2"] = cpu2

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
