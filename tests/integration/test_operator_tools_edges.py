"""The operator tools at their edges (helper-203's review), on the real broker.

A replay with ``--app`` leaves a job that app does not serve where it is (its workers would only
quarantine it again as ``unknown-job``), and the quarantine tools work with AMQP alone when the
management API can't be reached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.mover_names import acting_as
from amqpjobs.runtime.quarantine import browse, mover_lock, session
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import (
    BASE,
    CSRF,
    Handler,
    client,
    failing_app,
    quarantine_jobs,
    quarantine_six,
    wait_done,
)
from tests.integration.helpers import cli, depth
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: Management APIs that can't be used: nobody listens (port 9), a path where no API answers, not HTTP (the AMQP port).
NO_MANAGEMENT = ["http://127.0.0.1:9/", "wrong-path", "amqp-port"]


def write_app(tmp_path: Path, module: str, jobs: dict[str, str]) -> str:
    """Write an app module serving ``jobs`` (name -> job queue) on tmp_path/app.toml; its MODULE:APP."""
    lines = ["from amqpjobs import App", f"app = App('h203', topology={str(tmp_path / 'app.toml')!r})"]
    for n, (job, queue) in enumerate(jobs.items()):
        lines += [f"@app.job({job!r}, queue={queue!r})", f"async def job_{n}(payload, ctx):", "    return None"]
    (tmp_path / f"{module}.py").write_text("\n".join(lines) + "\n")
    return f"{module}:app"


async def test_replay_with_an_app_that_lacks_the_job_leaves_it_in_quarantine_named(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    await make_app(broker, tmp_path)  # job queues "work" and "ghost"
    app_ref = write_app(tmp_path, "h203lacks", {"mail": "work", "moved": "ghost"})
    monkeypatch.syspath_prepend(str(tmp_path))
    await fill_quarantine(broker, 2)  # q-0, q-1: job mail, served from work
    await fill_quarantine(broker, 1, job="report")  # q-0 again, job report: no such job in the app
    await fill_quarantine(broker, 1, job="moved")  # job moved, served from ghost, failed on work
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--app", app_ref, "--dry-run")
    assert dry.exit_code == 1, dry.output
    assert "would not replay job 'report' id 'q-0': app 'h203' has no job 'report'" in dry.stderr, dry.stderr
    assert "would not replay job 'moved' id 'q-0': app 'h203' serves job 'moved' from job queue 'ghost', not " \
           "from 'work' where its evidence sends it: its workers would quarantine it again as unknown-job; replay " \
           "it with --job moved --to ghost" in dry.stderr, dry.stderr  # fmt: skip
    assert "dry run: 2 would be replayed, 2 skipped" in dry.stdout, dry.stdout
    result = await asyncio.to_thread(cli, broker, "replay", "work", "--app", app_ref)
    assert result.exit_code == 1, result.output
    assert (
        "not replayed job 'report' id 'q-0': app 'h203' has no job 'report': its workers would quarantine it "
        "again as unknown-job; replay it with --app of the app that runs it, or without --app; it stays in "
        "work.quarantine"
    ) in result.stderr, result.stderr
    assert "replayed 2, skipped 2, left 2 in work.quarantine" in result.stdout, result.stdout
    assert "; 2 skipped: the app does not serve them from the job queue they would go back to (each named with " \
           "its fix), still in work.quarantine" in result.stdout, result.stdout  # fmt: skip
    assert await depth(broker, "work") == 2
    assert await depth(broker, "work.quarantine") == 2


@pytest.mark.parametrize("management", NO_MANAGEMENT)
async def test_quarantine_tools_work_with_amqp_alone_when_the_management_api_is_unreachable(
    broker: BrokerSettings, tmp_path: Path, management: str
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 4)
    parts = urlsplit(broker.management_url)
    if management == "wrong-path":
        management = parts._replace(path="/wrong/").geturl()
    elif management == "amqp-port":
        management = parts._replace(netloc=urlsplit(broker.url).netloc.rpartition("@")[2]).geturl()
    alone = dataclasses.replace(broker, management_url=management)
    steps = [
        ("quarantine", "list", "work"),
        ("quarantine", "show", "work", "--limit", "1"),
        ("quarantine", "export", "work", str(tmp_path / "out.jsonl")),
        ("quarantine", "park", "work", "--job", "mail", "--limit", "2", "--yes"),
        ("quarantine", "unpark", "work", "--limit", "1", "--yes"),
        ("replay", "work", "--limit", "1", "--dry-run"),
        ("replay", "work", "--limit", "1"),
        ("quarantine", "purge", "work", "--job", "mail", "--yes"),
        ("quarantine", "purge", "work.parked", "--yes"),
    ]
    for args in steps:
        result = await asyncio.to_thread(cli, alone, *args)
        assert result.exit_code == 0, (args, result.output)
    assert await depth(broker, "work") == 1
    assert await depth(broker, "work.parked") == 0


def test_a_mover_refused_by_the_consoles_lock_is_told_the_console_holds_it(broker: BrokerSettings, tmp_path: Path):
    quarantine_six(broker, tmp_path)
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "1", "canary": ""}
    with client(broker, tmp_path) as c:
        started = c.post("/actions/replay", data=form)
        assert started.status_code == 303, started.text
        run = started.headers["location"].replace(BASE, "")
        for _ in range(200):  # 1 per second: the first move at once, and the lock held until the last
            if c.get(run + ".json").json()["moved"] >= 1:
                break
            asyncio.run(asyncio.sleep(0.02))
        refused = cli(broker, "replay", "work")
        stop_form = re.search(r'<form[^>]*action="([^"]*)"[^>]*id="stop-form"', c.get(run).text)
        assert stop_form is not None
        c.post(stop_form.group(1), data={"csrf_token": CSRF})
        wait_done(c, run)

        # the other way round: the console's action refused by a shell's mover, which it names
        async def hold_and_try() -> dict[str, Any]:
            async with session(broker) as connection:
                with acting_as("amqpjobs replay"):
                    async with mover_lock(connection, broker, "work.quarantine", "replay"):
                        busy = await asyncio.to_thread(c.post, "/actions/park", data={**form, "rate": ""})
                        return await asyncio.to_thread(wait_done, c, busy.headers["location"])

        blocked = asyncio.run(hold_and_try())
    assert refused.exit_code == 4, refused.output
    run_id = run.rsplit("/", 1)[-1]
    # its connection is said once the management API knows it (its stats come every 5 s; not a lock just taken)
    conn = r"(; connection '127\.0\.0\.1:\d+ -> 127\.0\.0\.1:\d+')?"
    held = r"is busy: replay \(pid \d+ on [^,]+, since [0-9T:-]+Z; by "
    said = re.search(rf"{held}amqpjobs console: action {run_id}, started by .+ from testclient{conn}\) holds its lock",
                     refused.stderr)  # fmt: skip
    assert said, refused.stderr
    assert blocked["state"] == "failed", blocked
    assert re.search(rf"{held}amqpjobs replay{conn}\) holds its lock", blocked["summary"]), blocked


async def test_a_replay_while_a_worker_quarantines_new_failures_into_the_same_queue_moves_each_original_once(
    broker: BrokerSettings, tmp_path: Path
):
    """The run looks at the messages there at its start, once: the worker's new failures (at the tail) and
    the replayed jobs failing again (this run's replay id) stay, none replayed twice, none lost."""
    app = await failing_app(broker, tmp_path, Handler())
    await quarantine_jobs(broker, app, 100)  # m-0 .. m-99
    async with running_worker(app, broker, concurrency=4) as (_, rec):
        started = asyncio.Event()

        async def new_failures() -> None:
            await started.wait()  # the run counted the queue's 100 at its start
            for i in range(100):
                await app.enqueue("mail", {"n": i}, job_id=f"new-{i}")
                await asyncio.sleep(0.002)

        feeding = asyncio.create_task(new_failures())
        report = await replay(broker, "work", ReplayOptions(rate=500), lambda _: started.set())
        await feeding
        await rec.wait_for(lambda o: sum(x.kind == "quarantined" for x in o) >= 200, timeout=60)
        kinds = Counter(x.kind for x in rec.outcomes)
    await app.close()
    _, found = await browse(broker, "work.quarantine")
    counts = Counter((m.item.job_id.split("-")[0], m.item.replay_count) for m in found)
    assert report.replayed == 100, report
    assert counts == {("m", 1): 100, ("new", 0): 100}, counts
    assert len({m.item.job_id for m in found}) == 200
    assert kinds == {"quarantined": 200}, kinds


def test_the_consoles_replay_with_an_app_that_lacks_the_job_leaves_it_named(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    quarantine_six(broker, tmp_path)  # m-0 .. m-5, job mail from work
    ref = write_app(tmp_path, "h203console", {"other": "work"})  # on tmp_path/app.toml, which quarantine_six wrote
    monkeypatch.syspath_prepend(str(tmp_path))
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "100", "canary": ""}
    with client(broker, tmp_path, app_ref=ref) as c:
        started = c.post("/actions/replay", data=form)
        done = wait_done(c, started.headers["location"])
    assert (done["state"], done["moved"], done["left"]) == ("done", 0, 6), done
    assert done["details"][0] == (
        "not replayed job 'mail' id 'm-0': app 'h203' has no job 'mail': its workers would quarantine it again "
        "as unknown-job; replay it with --app of the app that runs it, or without --app"
    ), done["details"]
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
