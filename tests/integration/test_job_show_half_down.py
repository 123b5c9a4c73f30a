"""``amqpjobs job show`` with one half of the broker out of reach: AMQP answers and the management API not, or the
reverse (README "Job status"; 79ef779 covered the broker fully down)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject, SqliteResults
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli_subprocess
from tests.integration.test_job_status import app_module, wait_state
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

DEAD = "127.0.0.1:9"  # the discard port: nothing listens on loopback


async def _quarantined(broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(job id, MODULE:APP) of a job rejected into work.quarantine, its record in a SQLite results store."""
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(str(tmp_path / "results.db"))

    @app.job("picky", queue="work")
    async def picky(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("bad input")

    async with running_worker(app, broker):
        job_id = await app.enqueue("picky", {})
        await wait_state(app, job_id, "quarantined", 20)
    await app.close()
    picky_stub = "@app.job('picky', queue='work')\ndef picky(payload: dict, ctx: object) -> None: ...\n"
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'results.db'}", monkeypatch, picky_stub)
    return job_id, ref


def _with(broker: BrokerSettings, *, amqp: bool, management: bool) -> BrokerSettings:
    url = broker.url if amqp else broker.url.replace(broker.url.split("@")[1].split("/")[0], DEAD)
    mgmt = broker.management_url if management else f"http://guest:guest@{DEAD}/"
    return broker.__class__(**{**broker.__dict__, "url": url, "management_url": mgmt})


@pytest.mark.parametrize("half", ["management-down", "amqp-down"])
async def test_job_show_with_half_the_broker_down_prints_the_record_and_says_what_is_true(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, half: str
):
    job_id, ref = await _quarantined(broker, tmp_path, monkeypatch)
    up = await asyncio.to_thread(cli_subprocess, broker, "job", "show", job_id, "--app", ref)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "now: work.quarantine (found by browsing)" in up.stdout, up.stdout
    settings = _with(broker, amqp=half != "amqp-down", management=half != "management-down")
    shown = await asyncio.to_thread(
        cli_subprocess, settings, "job", "show", job_id, "--app", ref, "--connect-timeout", "2s"
    )
    assert f"job {job_id}: quarantined" in shown.stdout, shown.stdout  # the results store's record, always
    assert "quarantined attempt 1  rejected" in shown.stdout, shown.stdout
    last = shown.stdout.strip().splitlines()[-1]
    if half == "management-down":  # the browse is AMQP's: the answer holds, nothing said of the API
        assert (shown.returncode, last) == (0, "now: work.quarantine (found by browsing)"), shown
        assert "Traceback" not in shown.stderr, shown.stderr
    else:  # measured on 3.10: exit 3, the record, then where it is said unknown (not "not in ... (browsed)")
        assert shown.returncode == 3, shown
        assert last.startswith("now: not known: broker at amqp://guest:***@127.0.0.1:9/"), last  # the wire's words
        assert "unreachable after 2s: AMQPConnectionError" in last, last
        assert last.endswith("; the state above is the results store's record"), last
        assert "guest:guest" not in shown.stdout + shown.stderr
