"""Job status when an older copy of a job moves after the job succeeded (unpark, park again, replay), SQLite and
PostgreSQL stores, against the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.parking import park, unpark
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.whereabouts import where_now
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli
from tests.integration.test_job_status import (  # noqa: F401 (store_url: the fixture)
    app_module,
    quarantined_then_succeeded,
    states,
    store_for,
    store_url,
)
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_an_older_copy_unparked_after_the_job_succeeded_leaves_it_succeeded(
    broker: BrokerSettings,
    tmp_path: Path,
    store_url: str,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
):
    """A copy quarantined before the job succeeded, parked, then unparked (``quarantine unpark --app``): its
    ``quarantined`` record came after the success and counted as current (a retest: ``job show`` said
    ``quarantined``, ``result()`` raised ``JobFailedError``, and parked again it read ``parked``). A replay of that
    copy without the store runs it again: that run's outcome is the job's state."""
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)
    ref = app_module(tmp_path, store_url, monkeypatch)

    await quarantined_then_succeeded(app, broker)
    assert (await park(broker, "work.quarantine", results=app.results)).taken == 1
    assert (await unpark(broker, "work.parked", results=app.results)).taken == 1
    status = await app.job_status("m-1")
    assert [s for s, _ in states(status.history)] == ["queued", "running", "quarantined", "queued", "running",
                                                      "succeeded", "parked", "quarantined"]  # fmt: skip
    assert (status.state, status.note) == (
        "succeeded", "an older copy, quarantined before the success, was unparked to work.quarantine"
    )  # fmt: skip
    assert await app.result("m-1", timeout=2) == "sent"
    assert await where_now(broker, app, status) == (
        "nowhere: it succeeded and was acked; an older copy, quarantined before the success, is in "
        "work.quarantine (found by browsing)"
    )
    shown = await asyncio.to_thread(cli, broker, "job", "show", "m-1", "--app", ref)
    assert shown.exit_code == 0, shown.output
    assert "job m-1: succeeded (an older copy, quarantined before the success, was unparked to work.quarantine)" in (
        shown.stdout
    ), shown.stdout
    assert 'result: "sent"' in shown.stdout
    # parked once more: still the older copy, the success stands
    assert (await park(broker, "work.quarantine", results=app.results)).taken == 1
    again = await app.job_status("m-1")
    assert (again.state, again.note) == ("succeeded", "an older copy, quarantined before the success, was parked "
                                                      "in work.parked")  # fmt: skip
    # a replay with the store leaves it (its job succeeded since it failed); one without runs it again (it is
    # asked to): that run's outcome is the job's state
    async with running_worker(app, broker) as (_, recorder):
        kept = await replay(broker, "work.parked", ReplayOptions(rate=100), results=app.results)
        assert (kept.replayed, kept.done_since) == (0, 1)
        assert (await replay(broker, "work.parked", ReplayOptions(rate=100))).replayed == 1
        await recorder.wait_for(lambda o: len(o) == 1, 20)
    rerun = await app.job_status("m-1")
    assert [s for s, _ in states(rerun.history)][-3:] == ["parked", "running", "quarantined"]
    assert (rerun.state, rerun.note, rerun.current and rerun.current.detail) == ("quarantined", "", "rejected")
    await app.close()


async def test_a_replay_with_the_results_store_leaves_a_copy_of_a_job_done_since_it_failed(
    broker: BrokerSettings,
    tmp_path: Path,
    store_url: str,  # noqa: F811 (the fixture imported above)
):
    """A copy quarantined before its job succeeded (the same id enqueued again, or a replay's original whose ack was
    lost) is a stale one: replayed, a job that is not idempotent ran its effect a second time (a retest: ``charges ==
    ['c-1', 'c-1']``, though the store the replay records into said ``succeeded``). With the store (``--app``) such
    a copy stays, named, exit 1 as for the other messages that stay; the others are replayed."""
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)
    broken = [True]
    charges: list[str] = []

    @app.job("charge", queue="work")
    def charge(payload: dict[str, Any], ctx: JobContext) -> str:
        if broken[0]:
            raise Reject("card service down")
        charges.append(ctx.job_id)
        return "charged"

    await app.enqueue("charge", {}, job_id="c-1")
    await app.enqueue("charge", {}, job_id="c-2")
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) == 2, 20)
        broken[0] = False
        await app.enqueue("charge", {}, job_id="c-1")  # done again by hand: it succeeds
        await recorder.wait_for(lambda o: len(o) == 3, 20)
        dry = await replay(broker, "work.quarantine", ReplayOptions(rate=100, dry_run=True), results=app.results)
        run = await replay(broker, "work.quarantine", ReplayOptions(rate=100), results=app.results)
        await recorder.wait_for(lambda o: len(o) >= 4, 20)
        await asyncio.sleep(0.5)  # a second run of c-1, if one was replayed, has come by now
    assert sorted(charges) == ["c-1", "c-2"]  # c-1 once
    assert (dry.replayed, dry.moves, run.replayed, run.skipped) == (1, [("c-2", "work")], 1, 1)
    (line,) = run.not_moved
    assert line.startswith("job 'charge' id 'c-1': it succeeded at "), line
    assert "after this copy failed at " in line
    assert line.endswith("(amqpjobs job show c-1): replayed, it would run once more; purge it, or replay it "
                         "without --app to run it again"), line  # fmt: skip
    assert dry.not_moved == run.not_moved
    assert run.partial
    assert "; 1 skipped: done since they failed (amqpjobs job show names them), still in work.quarantine" in (
        run.summary(False)
    )
    status = await app.job_status("c-1")
    assert (status.state, status.note) == ("succeeded", "")
    await app.close()
