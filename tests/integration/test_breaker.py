"""Circuit breakers across workers, on the real broker (README "Flow control" -> "Circuit breaker").

Times are wall-clock (``time.time()``): the handler stamps its starts and ends, the
breaker stamps its opening; both in this process. The fast topology's first tier is
200 ms: it bounds how late after the cool-down the probe starts (the next delivery).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, Breaker, JobContext, Worker, WorkerOptions
from amqpjobs.runtime.breakers import Breakers
from amqpjobs.runtime.worker import Outcome
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


class Runs:
    """What the handlers saw: (start, end, job, job id, attempt, failed), and whether they fail now."""

    def __init__(self) -> None:
        self.failing = True
        self.rows: list[tuple[float, float, str, str, int, bool]] = []

    def starts(self, job: str, after: float = 0.0) -> list[tuple[float, float, str, str, int, bool]]:
        return sorted(r for r in self.rows if r[2] == job and r[0] >= after)


def breaker_app(broker: BrokerSettings, base: App, runs: Runs, flaky: Breaker, other: Breaker | None = None) -> App:
    app = App("breakers", topology=base.topology(), url=broker.url)

    async def run(payload: dict[str, Any], ctx: JobContext) -> None:
        start = time.time()
        failed = ctx.job == "flaky" and runs.failing
        await asyncio.sleep(0.02)
        runs.rows.append((start, time.time(), ctx.job, ctx.job_id, ctx.attempt, failed))
        if failed:
            raise ConnectionError("the payment provider is down")

    app.job("flaky", queue="work", breaker=flaky)(run)
    app.job("other", queue="work", breaker=other)(run)  # a breaker of its own (or none)
    app.job("steady", queue="work")(run)
    return app


def board(worker: Worker) -> Breakers:
    breakers = worker._breakers
    assert breakers is not None
    return breakers


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def status_json(broker: BrokerSettings) -> dict[str, Any]:
    """``amqpjobs status --json --queues work``: the job queue's entry."""
    shown = (await asyncio.to_thread(cli, broker, "status", "--json", "--queues", "work")).output
    entry: dict[str, Any] = json.loads(shown)["job_queues"][0]
    return entry


def done(outcomes: list[Outcome], job: str) -> list[str]:
    return [o.job_id for o in outcomes if o.job == job and o.kind == "succeeded"]


@pytest.mark.serial
async def test_open_cool_down_one_probe_then_all_run_once(broker: BrokerSettings, tmp_path: Path) -> None:
    runs = Runs()
    app = breaker_app(broker, await make_app(broker, tmp_path), runs, Breaker(failures=5, window="10s", cool_down="5s"),
                      other=Breaker(failures=1, window="10s", cool_down="5s"))  # fmt: skip
    second = Recorder()
    async with running_worker(app, broker) as (first, rec):
        worker2 = Worker(app, broker, WorkerOptions(queues=("work",), grace=10), second)
        await worker2.start()
        try:
            for i in range(5):
                await app.enqueue("flaky", {}, job_id=f"f{i}")
            await until(lambda: board(first).state("flaky") == board(worker2).state("flaky") == "open")
            runs.failing = False
            opened = board(first).machine("flaky").opened_at
            assert board(worker2).machine("flaky").opened_at == opened  # both counted the same notices
            for i in range(10):
                await app.enqueue("flaky", {}, job_id=f"g{i}")
            for i in range(3):
                await app.enqueue("other", {}, job_id=f"o{i}")
                await app.enqueue("steady", {}, job_id=f"s{i}")

            def outcomes() -> list[Outcome]:
                return [*rec.outcomes, *second.outcomes]

            await until(lambda: len(done(outcomes(), "flaky")) == 15, timeout=30)
            await until(lambda: len(done(outcomes(), "other")) == len(done(outcomes(), "steady")) == 3)
            assert board(first).state("flaky") == board(worker2).state("flaky") == "closed"
        finally:
            await worker2.shutdown()
    await app.close()
    failed = [r for r in runs.rows if r[5]]
    assert len(failed) == 5
    assert max(r[1] for r in failed) <= opened + 0.05
    after = runs.starts("flaky", after=opened)
    probe, rest = after[0], after[1:]
    assert 5.0 <= probe[0] - opened <= 5.5, probe[0] - opened  # no start for the cool-down, then the probe
    assert all(r[0] >= probe[1] for r in rest)  # exactly one probe: the others start after it ended
    ids = sorted(r[3] for r in after)
    assert ids == sorted([f"f{i}" for i in range(5)] + [f"g{i}" for i in range(10)])  # none lost, none twice
    assert {r[3]: r[4] for r in after} == {**{f"f{i}": 2 for i in range(5)}, **{f"g{i}": 1 for i in range(10)}}
    everything = [*rec.outcomes, *second.outcomes]
    waits = [o for o in everything if o.job == "flaky" and o.kind == "deferred"]
    assert waits
    assert all(o.attempt == (2 if o.job_id.startswith("f") else 1) for o in waits)
    assert not [o for o in everything if o.kind == "quarantined"]  # ~25 waits each: no attempt used up
    # other jobs: "other" (a breaker of its own, failures=1) and "steady" (none) ran during the cool-down
    for job in ("other", "steady"):
        assert all(opened < r[0] < opened + 5.0 for r in runs.starts(job)), job
    assert all(j == "flaky" for w in (first, worker2) for j, _ in board(w).history)
    states = [t.state for j, t in board(first).history]
    assert states == ["open", "half-open", "closed"]


@pytest.mark.serial
async def test_failed_probe_reopens_and_a_late_worker_starts_nothing(broker: BrokerSettings, tmp_path: Path) -> None:
    runs = Runs()
    app = breaker_app(broker, await make_app(broker, tmp_path), runs, Breaker(failures=2, window=10, cool_down=2))
    async with running_worker(app, broker) as (first, rec):
        for i in range(2):
            await app.enqueue("flaky", {}, job_id=f"f{i}")
        await until(lambda: board(first).state("flaky") == "open")
        opened = board(first).machine("flaky").opened_at
        await until(lambda: [t.state for _, t in board(first).history] == ["open", "half-open", "open"])
        reopened = board(first).machine("flaky")
        probe = runs.starts("flaky", after=opened)
        assert len(probe) == 1
        assert probe[0][5]
        assert reopened.opened_at >= probe[0][1]
        assert reopened.until == reopened.opened_at + 2
        # open again: the record says so to a worker started now, and to status
        second = Recorder()
        worker2 = Worker(app, broker, WorkerOptions(queues=("work",), grace=10), second)
        await worker2.start()
        try:
            assert board(worker2).state("flaky") == "open"
            assert board(worker2).machine("flaky").until == pytest.approx(reopened.until, abs=0.002)
            [entry] = (await status_json(broker))["breakers"]
            assert (entry["job"], entry["state"], entry["failures"]) == ("flaky", "open", 0)
            text = (await asyncio.to_thread(cli, broker, "status", "--queues", "work")).output
            assert "circuit breaker of job 'flaky' is open (after a failed probe" in text
            plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(tmp_path / "applied.toml"))
            assert plan.exit_code == 0, plan.output
            assert "ORPHAN" not in plan.output
            assert "breaker" not in plan.output  # the record is no object of the topology, nor an orphan
            runs.failing = False
            await app.enqueue("flaky", {}, job_id="late")
            await until(lambda: len(done([*rec.outcomes, *second.outcomes], "flaky")) == 3, timeout=15)
            assert board(worker2).state("flaky") == board(first).state("flaky") == "closed"
        finally:
            await worker2.shutdown()
    await app.close()
    later = runs.starts("flaky", after=probe[0][0] + 0.001)
    assert later[0][0] >= reopened.until  # nobody, the late worker neither, started it while open again
    assert all(r[0] >= later[0][1] for r in later[1:])  # one probe, then the rest
    assert sorted(r[3] for r in later) == ["f0", "f1", "late"]
    assert (await status_json(broker))["breakers"] == []  # closed: no record left


async def test_one_worker_runs_no_failing_start_past_the_count(broker: BrokerSettings, tmp_path: Path) -> None:
    """One worker, one slot: the start after the ``failures``-th failure waits (its notice is not back yet).

    Before: the worker counted its own failure only when the notice came back through the broker, so the
    next delivery started in that moment: 4 failed runs for ``failures=3``, 5 rounds in 5.
    """
    runs = Runs()
    app = breaker_app(broker, await make_app(broker, tmp_path), runs, Breaker(failures=3, window="10s", cool_down="3s"))
    async with running_worker(app, broker) as (worker, rec):
        for i in range(10):
            await app.enqueue("flaky", {}, job_id=f"f{i}")
        await until(lambda: board(worker).state("flaky") == "open")
        opened = board(worker).machine("flaky").opened_at
        await until(lambda: len([o for o in rec.outcomes if o.kind == "deferred"]) >= 7)  # all the rest told to wait
    await app.close()
    failed = [r for r in runs.rows if r[5]]
    assert len(failed) == 3, [(round(r[0] - opened, 3), r[3]) for r in failed]
    assert max(r[0] for r in runs.rows) <= opened  # no start between the opening failure and the cool-down's end
