"""Every benchmark of issue 9 and the goals of issue 22, side by side with the peers, written to bench/RESULTS.md.

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
2. ``amqpjobs consume --processes 2`` vs ``--processes 1``, in turns: jobs/s and jobs per client CPU-second;
3. publish rate: enqueue one by one and batched vs raw aio-pika with confirms;
4. the sync publisher: ``sync_publisher().enqueue`` one at a time vs Dramatiq's ``send`` (bench/sync_publish.py);
5. latency enqueue → handler start at a steady 200 jobs/s, amqpjobs vs raw aio-pika, in turns and both at once
   (the p99 goal is judged on both at once: a stall of the broker or the machine meets both);
6. worker RSS after 10k and after 200k jobs;
7. retry-tier timing error and replay rate error;
8. ``amqpjobs topology apply`` time for 200 job queues, first and second run;
then, always, a closing table "Goals of issue 22": each goal's figure from this run, its target and
met/missed (the targets have one home: bench/report.py ``GOALS``). Targets are printed beside the
figures; the run does not fail on a missed one. Where the amqpjobs worker misses a throughput target,
its hot path is profiled with py-spy and the top functions written into the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from harness import contestants
from report import (
    AMQPJOBS_CLI,
    BENCH,
    GOALS,
    PY,
    ROOT,
    Machine,
    Stat,
    _version,
    ceiling_note,
    cpu_model,
    git_revision,
    goals_table,
    kept_sections,
    package_diff,
    profile_tables,
    ratio,
    read_profile,
)
from scenarios_limits import LimitScenarios
from scenarios_load import LoadScenarios

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings


class Bench(LoadScenarios, LimitScenarios):
    """Every section, the profile of missed targets, and the run that writes the report."""

    # -- profile
    def py_spy(self) -> str | None:
        return shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")

    async def no_profile(self) -> None:
        self.header("Where the time goes (py-spy, amqpjobs worker hot path)")
        self.report.add("Not profiled in this run (--quick or --no-profile).", "")

    async def profile(self) -> None:
        missed = []
        got = self.results

        def misses(ours: str, theirs: str) -> bool:
            return GOALS[f"{ours}/{theirs}"].missed(
                ratio(got.get(f"rate.{ours}", Stat()), got.get(f"rate.{theirs}", Stat()))
            )

        if misses("aj16", "raw16"):
            missed.append(("aj16", "raw16"))
        if misses("aj1", "raw1"):
            missed.append(("aj1", "raw1"))
        peers_missed = [(key, GOALS[f"aj16/{key}"].target) for key in ("dramatiq", "celery") if misses("aj16", key)]
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
        if GOALS["enqueueb/rawb"].missed(
            ratio(self.results.get("pub.ajb", Stat()), self.results.get("pub.rawb", Stat()))
        ):
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

    # -- the closing table
    async def goals(self) -> None:
        self.header("Goals of issue 22")
        self.report.add(
            "Each goal is a ratio (or RSS in MB) from the sections above of this run, against its target "
            "(bench/report.py `GOALS`); the issue stays open while one is missed.",
            "",
        )
        if self.args.quick:
            self.report.add("A smoke run (`--quick`): small runs of one repetition, so no goal is judged here.", "")
        self.report.table(
            ["goal", "figure (this run)", "target", "verdict"], goals_table(self.figures, judged=not self.args.quick)
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
            ("sync", self.sync_publish),
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
        sections.append(("goals", self.goals))  # always: what was not run shows as not measured
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
    out = Path(args.out)
    await asyncio.to_thread(out.write_text, text + kept_sections(out))
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
        help="comma-separated sections to run: throughput,scaling,publish,sync,latency,rss,retry,apply,profile "
             "(the closing table of issue 22's goals is always written)",
    )  # fmt: skip
    parser.add_argument(
        "--contestants", type=lambda s: s.split(","), default=None,
        help="comma-separated contestant keys for the throughput table (default all): " + ",".join(
            c.key for c in contestants()),
    )  # fmt: skip
    args = parser.parse_args()
    sections = ("throughput", "scaling", "publish", "sync", "latency", "rss", "retry", "apply", "profile")
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
