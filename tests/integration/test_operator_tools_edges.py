"""The operator tools at their edges (helper-203's review), on the real broker.

A replay with ``--app`` leaves a job that app does not serve where it is (its workers would only
quarantine it again as ``unknown-job``), and the quarantine tools work with AMQP alone when the
management API can't be reached.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: Management APIs that can't be used: nobody listens (port 9), refused credentials, not HTTP (the AMQP port).
NO_MANAGEMENT = ["http://127.0.0.1:9/", "wrong-password", "amqp-port"]


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
    if management == "wrong-password":
        management = parts._replace(netloc=f"guest:wrong@{parts.netloc}").geturl()
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
