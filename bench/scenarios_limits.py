"""Bench sections 6-8: worker RSS, retry-tier and replay timing, ``topology apply`` time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

import psutil
from common import JOB, QUEUE, count
from harness import BenchError, Contestant, Harness, contestants, fill_sync, percentile
from report import AMQPJOBS_CLI, Stat, verdict

from amqpjobs import App, JobContext, Retry, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology


class LimitScenarios(Harness):
    """Sections 6-8."""

    async def rss(self) -> None:
        total = 200_000 if not self.args.quick else max(2000, self.args.n * 5)
        first = 10_000 if not self.args.quick else max(200, self.args.n // 2)
        marks = sorted({first, total // 4, total // 2, 3 * total // 4, total})
        self.header(f"6. Worker RSS while it runs {total:,} jobs (amqpjobs consume, 16 slots; one run)")
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
        most = self.goal("rss", max(a, b), f"{a:.1f} MB after {first:,} jobs, {b:.1f} MB after {total:,}")
        flat = self.goal("rss.growth", abs(b - a), f"{b - a:+.1f} MB from {first:,} to {total:,} jobs")
        self.report.add(f"amqpjobs worker RSS: the larger {most}; growth {flat}.", "")

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
        self.header(f"7. Retry-tier timing error ({jobs} jobs failing twice: tiers 1 s then 5 s) and replay rate error")
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
            f"8. `amqpjobs topology apply` for {queues} job queues with 3 retry tiers each ({len(d.exchanges):,} "
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
