"""README "Quarantine and replay" and "amqpjobs status" options that had no test, driven through the CLI."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from amqpjobs import JobContext, RetryPolicy
from amqpjobs.cli import main
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, drain, raw_channel
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


async def test_show_json_error_type_and_since(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    recent = iso(datetime.now(UTC) - timedelta(minutes=30))
    await fill_quarantine(broker, 3, job="mail", error_type="ValueError")  # failed 2026-11-29T08:00Z
    await fill_quarantine(broker, 2, job="report", error_type="builtins.KeyError", reason="permanent", failed_at=recent)
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json", "--error-type", "KeyError")
    assert shown.exit_code == 0, shown.output
    docs = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(d["payload"], d["headers"][evidence.JOB], d["headers"][evidence.REASON]) for d in docs] == [
        ({"n": 0}, "report", "permanent"),
        ({"n": 1}, "report", "permanent"),
    ]
    assert docs[0]["headers"][evidence.ERROR_TYPE] == "builtins.KeyError"
    since = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--since", "2h")
    assert since.exit_code == 0, since.output
    assert since.stdout.count("--- job report") == 2
    assert "--- job mail" not in since.stdout
    assert "2 of 5 message(s) in work.quarantine shown (2 of the 5 looked at match the filters)" in since.stdout
    moved = await asyncio.to_thread(cli, broker, "replay", "work", "--since", "1h", "--rate", "1000")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout.startswith("replayed 2, skipped 3, left 3 in work.quarantine")
    assert sorted(str(m.message_id) for m in await drain(broker, "work")) == ["q-0", "q-1"]
    assert await depth(broker, "work.quarantine") == 3


def invoke(broker: BrokerSettings, *args: str, input: str | None = None) -> Any:
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url}
    return CliRunner().invoke(main, list(args), env=env, input=input, catch_exceptions=False)


async def test_purge_without_yes_asks_first(broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("amqpjobs.cli._census.stdin_is_terminal", lambda: True)  # an operator at a terminal
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 4)
    declined = await asyncio.to_thread(invoke, broker, "quarantine", "purge", "work", input="n\n")
    assert declined.exit_code == 1
    assert re.search(r"Delete every message in quarantine 'work' on amqp://guest:\*\*\*@\S+\? \[y/N\]", declined.output)
    assert "Aborted" in declined.output
    assert await depth(broker, "work.quarantine") == 4
    agreed = await asyncio.to_thread(invoke, broker, "quarantine", "purge", "work", input="y\n")
    assert agreed.exit_code == 0, agreed.output
    assert "purged 4 message(s) from work.quarantine" in agreed.output
    assert await depth(broker, "work.quarantine") == 0


async def test_replay_to_another_queue_with_provenance_headers(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        await ch.declare_queue("work.manual", durable=True)
    await fill_quarantine(broker, 3)
    result = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--to", "work.manual", "--rate", "1000")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("replayed 3, skipped 0, left 0 in work.quarantine")
    assert await depth(broker, "work") == 0
    moved = await drain(broker, "work.manual")
    assert sorted(m.message_id or "" for m in moved) == ["q-0", "q-1", "q-2"]  # a window of moves: order not kept
    headers = [dict(m.headers or {}) for m in moved]
    replay_ids = {h[q.REPLAY_ID] for h in headers}
    assert len(replay_ids) == 1  # one id for the whole run
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", str(replay_ids.pop()))
    for m, h in zip(moved, headers, strict=True):
        i = int((m.message_id or "q-x").removeprefix("q-"))  # arrival order is not the quarantine's
        assert h[q.REPLAY_COUNT] == 1
        assert h[envelope.ATTEMPT] == 1  # a fresh attempt budget
        assert (h[q.PREVIOUS_REASON], h[q.PREVIOUS_ERROR_TYPE]) == ("exhausted", "ValueError")
        assert h[q.PREVIOUS_ERROR_MESSAGE] == f"boom {i}"
        assert evidence.REASON not in h  # evidence removed
    again = await asyncio.to_thread(cli, broker, "replay", "work.quarantine", "--rate", "1000")
    assert again.stdout.startswith("replayed 0, skipped 0, left 0")


async def test_stop_after_failures_exits_1(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        raise KeyError("still broken")

    await fill_quarantine(broker, 30)
    async with running_worker(app, broker):
        result = await asyncio.to_thread(
            cli, broker, "replay", "work", "--rate", "20", "--stop-after-failures", "2"
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    m = re.match(r"replayed (\d+), skipped 0, left (\d+) in work.quarantine", result.stdout)
    assert m is not None, result.stdout
    assert 2 <= int(m.group(1)) < 30
    stopped = re.search(r"stopped: (\d+) replayed job\(s\) came back to quarantine \(--stop-after-failures 2\)",
                        result.stderr)  # fmt: skip
    assert stopped is not None, result.stderr
    assert int(stopped.group(1)) >= 2


async def test_stop_after_failures_moves_nothing_once_k_came_back(broker: BrokerSettings, tmp_path: Path):
    # at 2/s each failure is back well before the next move is due: the K-th one stops the run
    # there, not one move later (an outsider's --stop-after-failures 3 stopped after 4)
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        raise KeyError("still broken")

    await fill_quarantine(broker, 10)
    async with running_worker(app, broker):
        result = await asyncio.to_thread(
            cli, broker, "replay", "work", "--rate", "2", "--stop-after-failures", "3"
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("replayed 3, skipped 0, left 10 in work.quarantine"), result.stdout
    assert "stopped: 3 replayed job(s) came back to quarantine (--stop-after-failures 3)" in result.stderr


async def test_a_dry_run_and_a_run_cut_by_limit_say_so(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 5)
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--limit", "2", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.count("would replay q-") == 2
    assert dry.stdout.splitlines()[-1] == (
        "dry run: 2 would be replayed, 0 skipped, nothing moved; 5 in work.quarantine; "
        "stopped at --limit 2 (the rest were not looked at)"
    )
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--limit", "2", "--rate", "100")
    assert run.exit_code == 0, run.output
    assert re.match(r"replayed 2, skipped 0, left 3 in work\.quarantine \([0-9.]+s, [0-9.]+/s\); "
                    r"stopped at --limit 2 \(the rest were not looked at\)\n", run.stdout), run.stdout  # fmt: skip
    exact = await asyncio.to_thread(cli, broker, "replay", "work", "--limit", "3", "--dry-run")
    assert (
        exact.stdout.splitlines()[-1] == "dry run: 3 would be replayed, 0 skipped, nothing moved; 3 in work.quarantine"
    )


async def test_status_path_text_names_a_missing_queue(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    topology = tmp_path / "status.toml"
    topology.write_text(APPLIED_TOPOLOGY)
    async with raw_channel(broker) as ch:
        await ch.queue_delete("work.retry.400ms")
    result = await asyncio.to_thread(cli, broker, "status", str(topology))
    assert result.exit_code == 1, result.output
    assert re.search(r"^work\.retry\.400ms +missing$", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^work\.retry\.200ms +0 ", result.stdout, re.MULTILINE)
    assert "UNHEALTHY work: queue work.retry.400ms does not exist (apply the topology)" in result.stdout
    assert "\nhealthy\n" not in result.stdout
