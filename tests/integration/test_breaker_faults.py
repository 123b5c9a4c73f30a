"""A circuit breaker under load and faults, on the real broker (README "Flow control" -> "Circuit breaker").

Waiting deliveries of an open breaker (how many times they cycle), a plain-function probe
that hangs, a prober whose connection (and so its probe lock) drops mid-probe. Counts and
orders are asserted, not timings.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, Breaker, JobContext
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.worker import Outcome
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.naming import breaker_queue_name
from amqpjobs.wire.breakers import OpenRecord, ProbeHolder
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, raw_channel
from tests.integration.test_breaker import board, status_json, until
from tests.integration.test_pause import _cut_worker_connection
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: Tiers of the parking test: about doubling, as real tiers (1s, 5s, 30s...) grow.
PARKING_TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["250ms", "500ms", "1s", "2s", "4s"]
"""


def deferred(outcomes: list[Outcome], job: str) -> int:
    return sum(1 for o in outcomes if o.job == job and o.kind == "deferred")


async def test_waiting_deliveries_park_in_the_longest_tier_that_fits(broker: BrokerSettings, tmp_path: Path) -> None:
    """100 deliveries wait out a 6 s cool-down: a few waits each, not one per 250 ms first tier (24 each)."""
    topo = tmp_path / "parking.toml"
    topo.write_text(PARKING_TOPOLOGY)
    await apply_topology(topo, broker)
    app = App("parking", topology=load_topology(topo).topology, url=broker.url)
    failing, started = [True], []

    async def run(payload: dict[str, Any], ctx: JobContext) -> None:
        started.append((time.time(), ctx.job, ctx.job_id))
        if ctx.job == "flaky" and failing[0]:
            raise ConnectionError("the payment provider is down")

    app.job("flaky", queue="work", breaker=Breaker(failures=1, window=10, cool_down=6))(run)
    app.job("steady", queue="work")(run)
    n = 100
    async with running_worker(app, broker, concurrency=4) as (worker, rec):
        await app.enqueue("flaky", {}, job_id="first")
        await until(lambda: board(worker).state("flaky") == "open")
        machine = board(worker).machine("flaky")
        opened, ends = machine.opened_at, machine.until
        for i in range(n):
            await app.enqueue("flaky", {}, job_id=f"w{i}")
        sent = time.time()
        await app.enqueue("steady", {}, job_id="steady")
        failing[0] = False
        await until(lambda: sum(1 for o in rec.outcomes if o.job == "flaky" and o.kind == "succeeded") == n + 1, 30)
        during = deferred(rec.outcomes, "flaky")
    await app.close()
    steady = [t for t, job, _ in started if job == "steady"]
    print(f"{n} waiting, cool-down 6s: {during} deferrals; steady started {steady[0] - sent:.3f}s after its enqueue")
    # each waits at most 5 times within the cool-down (4s 1s 500ms 250ms 250ms: the longest tier that fits
    # what is left), and at most twice more until the probe's success is heard; before: about 24 each
    assert n <= during <= n * 7
    assert min(t for t, job, i in started if job == "flaky" and i != "first") >= ends  # none started while open
    assert opened < ends


def hanging_app(
    broker: BrokerSettings, base: App, script: list[str], release: threading.Event, calls: list[tuple[float, str, str]]
) -> App:
    """Job ``flaky`` (plain function, timeout 2 s): each run takes the next step of ``script``, then "ok"."""
    app = App("hanging", topology=base.topology(), url=broker.url)

    def run(payload: dict[str, Any], ctx: JobContext) -> None:
        step = script.pop(0) if script else "ok"
        calls.append((time.time(), ctx.job_id, step))
        if step == "fail":
            raise ConnectionError("down")
        if step == "hang":
            release.wait(30)

    app.job("flaky", queue="work", timeout=2, breaker=Breaker(failures=1, window=10, cool_down=1))(run)
    return app


async def test_a_hanging_thread_probe_fails_at_its_timeout(broker: BrokerSettings, tmp_path: Path) -> None:
    """The probe hangs past its 2 s timeout: it failed then (open again, lock freed); its late success closes none."""
    release, calls = threading.Event(), list[tuple[float, str, str]]()
    app = hanging_app(broker, await make_app(broker, tmp_path), ["fail", "hang", "fail"], release, calls)
    try:
        async with running_worker(app, broker, concurrency=2) as (worker, rec):
            await app.enqueue("flaky", {}, job_id="f0")  # fails: open for 1 s, then runs as the probe and hangs
            await until(lambda: [c[2] for c in calls] == ["fail", "hang"], 15)
            shown = await status_json(broker)
            [entry] = shown["breakers"]
            assert entry["state"] == "half-open"
            assert entry["probe"]["job_id"] == "f0"
            assert entry["probe"]["by"] == board(worker).origin
            text = "\n".join(shown["notes"])
            assert "a probe runs (id 'f0', since " in text, text
            await app.enqueue("flaky", {}, job_id="g0")  # the next probe, once the hung one is given up
            await until(lambda: len(calls) == 3, 15)  # probe 2 ran (and failed) while probe 1 still hangs
            assert [c[1:] for c in calls] == [("f0", "fail"), ("f0", "hang"), ("g0", "fail")]
            assert calls[2][0] - calls[1][0] >= 2 + 1  # probe 1's timeout, then another cool-down
            expected = ["open", "half-open", "open", "half-open", "open"]  # probe 2's failure opens it again
            await until(lambda: len(board(worker).history) >= len(expected))
            assert [t.state for _, t in board(worker).history] == expected
            release.set()  # probe 1 returns now: succeeded, too late
            await until(lambda: any(o.job_id == "f0" and o.kind == "succeeded" for o in rec.outcomes), 10)
            await asyncio.sleep(0.2)
            assert board(worker).state("flaky") == "open"  # its success closed nothing
            await until(lambda: board(worker).state("flaky") == "closed", 15)  # g0 again: the probe that closes it
            assert [c[1:] for c in calls][3:] == [("g0", "ok")]
    finally:
        release.set()
        await app.close()


async def test_a_prober_that_lost_its_lock_ignores_its_probe(broker: BrokerSettings, tmp_path: Path) -> None:
    """The prober's connection drops mid-probe: the lock is gone, so the probe's success closes nothing."""
    app = App("cutting", topology=(await make_app(broker, tmp_path)).topology(), url=broker.url)
    script, calls, cut = ["fail", "slow"], list[tuple[float, str, str]](), asyncio.Event()

    async def run(payload: dict[str, Any], ctx: JobContext) -> None:
        step = script.pop(0) if script else "ok"
        calls.append((time.time(), ctx.job_id, step))
        if step == "fail":
            raise ConnectionError("down")
        if step == "slow":  # until the test has cut the connection
            await asyncio.wait_for(cut.wait(), 30)

    app.job("flaky", queue="work", breaker=Breaker(failures=1, window=10, cool_down=1))(run)
    async with running_worker(app, broker, concurrency=2) as (worker, rec):
        await app.enqueue("flaky", {}, job_id="f0")
        await until(lambda: [c[2] for c in calls] == ["fail", "slow"], 15)
        await _cut_worker_connection(broker, "cutting-worker-publisher")  # the probe lock goes with it
        await until(lambda: not board(worker)._probing["flaky"].lock.held)  # the worker saw it drop
        cut.set()
        await until(lambda: any(o.job_id == "f0" and o.kind == "succeeded" for o in rec.outcomes), 10)
        await asyncio.sleep(0.3)
        assert board(worker).state("flaky") == "half-open"  # the stale probe's success closed nothing
        await app.enqueue("flaky", {}, job_id="g0")  # the next delivery probes, on the reconnected connection
        await until(lambda: board(worker).state("flaky") == "closed", 20)
    await app.close()
    assert [c[1:] for c in calls] == [("f0", "fail"), ("f0", "slow"), ("g0", "ok")]
    assert [t.state for _, t in board(worker).history] == ["open", "half-open", "closed"]


async def _parking_app(broker: BrokerSettings, tmp_path: Path, name: str) -> App:
    """The parking topology applied, and an app named ``name`` on it."""
    topo = tmp_path / "parking.toml"
    topo.write_text(PARKING_TOPOLOGY)
    await apply_topology(topo, broker)
    return App(name, topology=load_topology(topo).topology, url=broker.url)


async def _write_record(broker: BrokerSettings, record: OpenRecord) -> None:
    """Job flaky's breaker record on queue work as a worker would write it (replacing one there)."""
    async with raw_channel(broker) as channel:
        await channel.queue_delete(breaker_queue_name("work", "flaky"))
        await channel.declare_queue(
            breaker_queue_name("work", "flaky"),
            durable=True,
            arguments={"x-queue-type": "classic", **record.arguments()},
        )


async def test_a_record_from_a_clock_far_ahead_is_probed_after_one_cool_down(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """A record saying 'open until next year' waits one cool-down here, then one probe closes it and deletes it."""
    app = await _parking_app(broker, tmp_path, "ahead")
    started: list[float] = []

    async def run(payload: dict[str, Any], ctx: JobContext) -> None:
        started.append(time.time())

    app.job("flaky", queue="work", breaker=Breaker(failures=5, window=10, cool_down=2))(run)
    year = 365 * 86400.0
    await _write_record(broker, OpenRecord(time.time() + year, time.time() + year + 2, 5))  # a clock a year ahead
    try:
        async with running_worker(app, broker, concurrency=2) as (worker, _):
            assert board(worker).state("flaky") == "open"  # read at start, cut to one cool-down from now
            began = time.time()
            for i in range(3):
                await app.enqueue("flaky", {}, job_id=f"a{i}")
            await until(lambda: len(started) == 3, 15)  # before the fix: cut again at every probe, none ran
            assert started[0] - began <= 2 + 1.5  # the cool-down, then the first tier at most (and a start)
            assert board(worker).state("flaky") == "closed"
            await until(lambda: _record_gone(broker, breaker_queue_name("work", "flaky")), 5)
    finally:
        await app.close()


async def test_a_record_dated_ahead_over_an_opening_counted_here_adds_no_second_cool_down(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """This worker opened the breaker from the failures it counted; then a worker whose clock runs a
    year ahead wrote its record of the same opening over this one's. The probe comes one cool-down
    after the opening, not a second cool-down after this worker first reads that record."""
    app = await _parking_app(broker, tmp_path, "ahead2")
    started: list[float] = []

    async def run(payload: dict[str, Any], ctx: JobContext) -> None:
        started.append(time.time())
        if len(started) <= 3:
            raise RuntimeError("the service is down")

    app.job("flaky", queue="work", breaker=Breaker(failures=3, window=10, cool_down=4))(run)
    name = breaker_queue_name("work", "flaky")
    try:
        async with running_worker(app, broker, concurrency=1) as (worker, _):
            for i in range(3):
                await app.enqueue("flaky", {}, job_id=f"f{i}")
            await until(lambda: board(worker).state("flaky") == "open", 10)
            opened = next(t.at for _, t in board(worker).history if t.state == "open")
            await until(lambda: not _record_gone(broker, name), 5)  # this worker's own record
            year = 365 * 86400.0
            ahead = OpenRecord(opened + year, opened + year + 4, 3)  # the same opening, by a clock a year ahead
            await _write_record(broker, ahead)
            assert time.time() - opened < 4  # replaced within the cool-down (4 s: slack for a loaded CI)
            await until(lambda: len(started) >= 4, 15)
            assert started[3] - opened <= 4 + 1.0, started[3] - opened  # one cool-down, then a 250 ms tier at most
            await until(lambda: board(worker).state("flaky") == "closed", 5)
    finally:
        await app.close()


def _record_gone(broker: BrokerSettings, name: str) -> bool:
    with ManagementClient(broker) as mgmt:
        return all(q["name"] != name for q in mgmt.queues(broker.vhost))


async def test_status_says_a_record_dated_ahead_waits_one_cool_down_not_until_its_date(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """A record written by a clock years ahead: status flags it, and tells what workers do (no 'until 2030')."""
    app = await _parking_app(broker, tmp_path, "dated")
    await app.close()  # only its topology: status reads the queues
    opened = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    await _write_record(broker, OpenRecord(opened, opened + 2, 5))  # a 2 s cool-down, by a clock in 2030
    text = (await asyncio.to_thread(cli, broker, "status", "--queues", "work")).output
    assert "no starts until 2030" not in text
    [entry] = (await status_json(broker))["breakers"]
    assert entry == {  # not "open": no worker takes its date at its word (one rule for --json and the text)
        "job": "flaky", "state": "dated-ahead", "opened_at": "2030-01-01T00:00:00.000Z",
        "until": "2030-01-01T00:00:02.000Z", "failures": 5, "cool_down": 2.0, "dated_ahead": True,
    }  # fmt: skip
    assert (
        "note work: circuit breaker of job 'flaky' is dated ahead (after 5 failure(s)); its record is dated ahead of "
        "this host's clock (opened 2030-01-01T00:00:00.000Z, until 2030-01-01T00:00:02.000Z): a worker waits one "
        "cool-down (2s) from when it reads it, then one delivery runs as the probe"
    ) in text


async def test_status_says_a_probe_runs_over_a_record_dated_ahead(broker: BrokerSettings, tmp_path: Path) -> None:
    """A worker probes a record dated ahead (it never adopts its date): status says half-open, a probe runs,
    in --json and in the text alike (not 'open ... no starts until 2030' beside a running probe)."""
    app = await _parking_app(broker, tmp_path, "dated-probe")
    await app.close()
    opened = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    await _write_record(broker, OpenRecord(opened, opened + 2, 5))
    since = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    async with raw_channel(broker) as channel:  # the probe lock, as a prober holds it (its holder in the arguments)
        await channel.declare_queue(
            "work.breaker-probe.flaky", exclusive=True, arguments=ProbeHolder("p-1", "h:1:w", since).arguments()
        )
        text = (await asyncio.to_thread(cli, broker, "status", "--queues", "work")).output
        [entry] = (await status_json(broker))["breakers"]
    assert (entry["state"], entry["dated_ahead"], entry["probe"]["job_id"]) == ("half-open", True, "p-1")
    assert "no starts until 2030" not in text
    assert (
        "note work: circuit breaker of job 'flaky' is half-open (opened after 5 failure(s) at "
        "2030-01-01T00:00:00.000Z): a probe runs (id 'p-1', since 2026-01-01T00:00:00.000Z, on h:1:w)"
    ) in text
