"""The bench's figures, machine line and profile tables: everything that turns measurements into RESULTS.md text."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

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


# ---------------------------------------------------------------------------------- goals


@dataclass(frozen=True)
class Goal:
    """One target of the bench: a figure (a ratio unless ``unit`` says otherwise) against ``target``."""

    text: str  # what the goal asks, as the closing table names it
    target: float
    unit: str = "×"
    higher_is_better: bool = True
    issue: int = 22

    def fmt(self, value: float) -> str:
        if value != value:
            return "–"
        return f"{value:.2f}×" if self.unit == "×" else f"{value:.1f} {self.unit}"

    def target_text(self) -> str:
        """``≥ 1.0×``, ``≥ 1.35×``, ``≤ 60 MB``: a ratio keeps at least one decimal, as issue 22 writes them."""
        sign = "≥" if self.higher_is_better else "≤"
        if self.unit != "×":
            return f"{sign} {self.target:g} {self.unit}"
        digits = f"{self.target:.2f}".rstrip("0")
        return f"{sign} {digits}{'0' if digits.endswith('.') else ''}×"

    def verdict(self, value: float) -> str:
        return verdict(value, self.target, self.higher_is_better)

    def missed(self, value: float) -> bool:
        return self.verdict(value) == "**missed**"


#: Every target the bench judges, by key: the goals of issue 22 (the closing table lists them, in this order)
#: and issue 9's that table 1 still shows. Sections and the profile read their targets here only.
GOALS: dict[str, Goal] = {
    "aj16/dramatiq": Goal("16 slots (`amqpjobs consume` defaults) / Dramatiq 8 threads, jobs/s", 2.2),
    "aj16/raw16": Goal("16 slots (`amqpjobs consume` defaults) / raw aio-pika prefetch 16, jobs/s", 1.3),
    "p2/p1": Goal("`consume --processes 2` / `--processes 1`, jobs/s (2 cores)", 1.35),
    "p2/p1.cpu": Goal("jobs per client CPU-second, `--processes 2` / `--processes 1`", 0.9),
    "sync/dramatiq": Goal("`sync_publisher().enqueue` one at a time / Dramatiq `send` (confirm_delivery=True)", 1.2),
    "enqueue1/raw1": Goal("async `enqueue` one at a time / raw aio-pika publish, confirms awaited", 1.0),
    "enqueueb/rawb": Goal("batched `enqueue` (gather 500) / raw aio-pika batched", 0.9),
    "p99/raw": Goal("p99 latency enqueue → handler start, amqpjobs / raw aio-pika", 1.0, higher_is_better=False),
    "rss": Goal("worker RSS per process (the larger of after 10k and after 200k jobs)", 60, "MB", False),
    "rss.growth": Goal("worker RSS flat to 200k jobs: growth after 10k jobs (either way)", 2, "MB", False),
    "aj1/raw1": Goal("1 slot / raw aio-pika prefetch 1, jobs/s", 0.9, issue=9),
    "aj16/celery": Goal("16 slots / Celery -c 2, jobs/s", 3.0, issue=9),
}


def goals_table(figures: dict[str, tuple[float, str]], issue: int = 22, judged: bool = True) -> list[list[str]]:
    """Rows goal | figure | target | verdict of ``issue``'s goals; "not measured" for those without a figure.

    ``judged`` False (a ``--quick`` smoke run: small runs, one repetition): the verdict column
    says "not judged (--quick)", since such figures say nothing about a goal.
    """
    rows = []
    for key, goal in GOALS.items():
        if goal.issue != issue:
            continue
        if key not in figures:
            rows.append([goal.text, "not measured in this run", goal.target_text(), "–"])
            continue
        value, detail = figures[key]
        figure = goal.fmt(value) + (f" ({detail})" if detail else "")
        rows.append([goal.text, figure, goal.target_text(), goal.verdict(value) if judged else "not judged (--quick)"])
    return rows


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


#: Everything after this line of RESULTS.md is written by other scripts or by hand, and kept.
KEPT_MARKER = "<!-- kept: sections below are not written by bench/run.py -->"


def kept_sections(out: Path) -> str:
    """The part of ``out`` from :data:`KEPT_MARKER` on ("" when the file or the marker is absent)."""
    try:
        old = out.read_text()
    except FileNotFoundError:
        return ""
    at = old.find(KEPT_MARKER)
    return "" if at < 0 else "\n" + old[at:]
