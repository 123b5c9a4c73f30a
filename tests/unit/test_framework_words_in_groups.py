"""Only amqpjobs' own word makes a run a skip or a duplicate, bare or inside an exception group.

``Skipped`` counts when the overlap guard raised it before its handler ran, and ``DuplicateJobError`` when the
run's ctx.transaction() got it from the ledger. The same classes raised by the handler (its own raise, a guarded
function it awaited, a task of its ``asyncio.TaskGroup``) are its job's failure, judged as any other
(:func:`amqpjobs.jobs.failure.framework_word`). Worker logic, not the broker's: the in-memory double runs the
real worker.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, RetryPolicy
from amqpjobs.errors import DuplicateJobError
from amqpjobs.jobs import cron
from amqpjobs.jobs.outcome import Skipped
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.testing import TestBroker
from amqpjobs.testing.election import MemoryConnection
from amqpjobs.topology.loader import load_topology

TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\nretry_tiers = ["1s"]\n'
START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def make_app(tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("d", topology=load_topology(path).topology, ledger=SqliteLedger(tmp_path / "ledger.db"))


async def test_a_handlers_own_skipped_bare_or_in_a_task_group_is_its_jobs_failure(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    runs: list[str] = []

    @app.job("bare", queue="work")
    async def bare(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise Skipped("overlap", "schedule other")  # e.g. out of a guarded function it awaited

    async def skipping() -> None:
        raise Skipped("overlap", "schedule other")

    @app.job("grouped", queue="work")
    async def grouped(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        async with asyncio.TaskGroup() as group:
            group.create_task(skipping())

    async with TestBroker(app) as broker:
        await app.enqueue("bare", {}, job_id="b-1")
        await app.enqueue("grouped", {}, job_id="g-1")
        done = await broker.drain()
    assert sorted((p.job_id, p.kind) for p in done) == [
        ("b-1", "quarantined"), ("b-1", "retried"), ("g-1", "quarantined"), ("g-1", "retried"),
    ]  # fmt: skip
    assert sorted(runs) == ["b-1", "b-1", "g-1", "g-1"]
    assert sorted(p.headers["amqpjobs-error-type"] for p in broker.quarantine("work")) == [
        "ExceptionGroup", "amqpjobs.jobs.outcome.Skipped",
    ]  # fmt: skip


async def test_a_transaction_in_a_task_group_that_found_the_job_done_is_a_duplicate_never_run_again(
    tmp_path: Path,
) -> None:
    app = make_app(tmp_path)
    runs: list[str] = []

    def effect(ctx: JobContext) -> None:
        with ctx.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects (id TEXT)")
            db.execute("INSERT INTO effects VALUES (?)", (ctx.job_id,))

    @app.job("charge", queue="work", idempotent=True, retry=RetryPolicy(immediate_retries=2, immediate_wait=0))
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        if payload.get("done_elsewhere"):  # another run marks it done while this one runs
            await app.ledger.done(ctx.job_id, "another-run")  # type: ignore[union-attr]
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.to_thread(effect, ctx))

    async with TestBroker(app, ledger=app.ledger) as broker:
        await app.enqueue("charge", {"done_elsewhere": True}, job_id="c-1")
        done = await broker.drain()
    assert [p.kind for p in done] == ["duplicate"]
    assert runs == ["c-1"]  # before: the immediate retries ran it again after the ledger said done


async def test_a_handlers_own_duplicatejoberror_is_retried_at_once_like_any_failure(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    runs: list[str] = []

    @app.job("own", queue="work", idempotent=True, retry=RetryPolicy(max_attempts=1, immediate_retries=2,
                                                                      immediate_wait=0))  # fmt: skip
    async def own(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)
        raise DuplicateJobError("a library's word, not the ledger's")

    async with TestBroker(app, ledger=app.ledger) as broker:
        await app.enqueue("own", {}, job_id="o-1")
        done = await broker.drain()
    assert [p.kind for p in done] == ["quarantined"]
    assert runs == ["o-1", "o-1", "o-1"]  # a failure: its immediate retries run, as for any other error


async def test_only_the_jobs_own_overlap_guard_skips_a_run_never_a_guarded_function_its_handler_awaits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMQPJOBS_URL", "amqp://guest:guest@127.0.0.1:1/")  # the double's markers, never a broker
    app = make_app(tmp_path)
    ran: list[str] = []

    @app.cron("*/15 * * * *", name="quarter", overlap="skip")
    @app.job("tick", queue="work")
    async def tick(payload: Any, ctx: JobContext) -> None:
        ran.append(f"tick {ctx.job_id}")

    @app.job("caller", queue="work")  # a plain job awaiting the guarded function (its marker held elsewhere)
    async def caller(payload: Any, ctx: JobContext) -> None:
        ran.append(f"caller {ctx.job_id}")
        await tick(payload, ctx)

    @app.cron("*/30 * * * *", name="half", overlap="skip")
    @app.job("outer", queue="work")  # a guarded job awaiting itself: the inner guard finds the marker held
    async def outer(payload: Any, ctx: JobContext) -> None:
        ran.append(f"outer {ctx.job_id}")
        if not payload.get("inner"):
            await outer({"inner": True}, ctx)

    elsewhere = MemoryConnection("other-worker")
    async with TestBroker(app, start=START) as broker:
        assert await broker.tick_wire.hold_exclusive(elsewhere, cron.running_queue(app.name, "quarter"), {})
        for job, schedule in (("tick", "quarter"), ("caller", "quarter"), ("outer", "half")):
            headers = {cron.SCHEDULE_HEADER: schedule, cron.TICK_HEADER: "2026-03-01T12:45:00Z"}
            await broker.publish_raw("jobs", "work", b"{}", type=job, message_id=f"{job}-1", headers=headers)
        done = await broker.drain()
    assert sorted((p.job_id, p.kind) for p in done) == [
        ("caller-1", "quarantined"), ("caller-1", "retried"),  # the handler ran: its Skipped is a failure
        ("outer-1", "quarantined"), ("outer-1", "retried"),
        ("tick-1", "skipped"),  # its own guard left it unrun
    ]  # fmt: skip
    assert sorted(ran) == ["caller caller-1", "caller caller-1", "outer outer-1", "outer outer-1"]
