"""Fresh-user review 17 on the real broker: a canary right after ``topology apply``, a lone surrogate in quarantine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.events import RECHECK_AFTER
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, cli_subprocess, depth, raw_channel
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.test_topology_holes import delete
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.mark.parametrize("recheck_due", [True, False], ids=["recheck-due", "recheck-not-due"])
async def test_a_canary_right_after_topology_apply_passes(broker: BrokerSettings, tmp_path: Path, recheck_due: bool):
    """The worker started without the events exchange (events off); apply declares it; the canary's event is heard."""
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await fill_quarantine(broker, 2)
    delete(broker, "exchanges", EVENTS_EXCHANGE)
    async with running_worker(app, broker) as (worker, rec):
        events = worker._events
        assert events is not None
        assert events._channel is None  # events off from the start
        if recheck_due:  # the review's case: the canary's event is the one that finds the recheck due
            events.recheck_after = 0.2
            await asyncio.sleep(0.4)
        else:
            assert events.recheck_after == RECHECK_AFTER
        await make_app(broker, tmp_path)  # amqpjobs topology apply: the exchange is back
        result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "1", "--canary-timeout", "10s")
        await rec.wait_for(lambda o: len(o) >= 2)
        assert events.dropped == 0
    assert result.exit_code == 0, result.output + result.stderr
    assert "canary passed: 1 of 1 succeeded" in result.stdout
    assert "replayed 2, skipped 0, left 0 in work.quarantine" in result.stdout
    assert await depth(broker, "work.quarantine") == 0


async def test_a_kept_event_while_the_exchange_is_still_missing_is_dropped_and_counted(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await fill_quarantine(broker, 1)
    delete(broker, "exchanges", EVENTS_EXCHANGE)
    async with running_worker(app, broker) as (worker, rec):
        events = worker._events
        assert events is not None
        result = await asyncio.to_thread(cli, broker, "replay", "work")  # a canary refuses without the exchange
        await rec.wait_for(lambda o: len(o) >= 1)
        for _ in range(50):  # the recheck found no exchange: the kept event is dropped, counted
            if events.dropped:
                break
            await asyncio.sleep(0.05)
        assert (events.dropped, events.published, events._channel) == (1, 0, None)
    assert result.exit_code == 0, result.output


SURROGATE_BODY = b'{"msg": "bad \\ud800 end"}'


async def test_a_lone_surrogate_in_a_quarantined_body_is_shown_and_exported_with_a_question_mark(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)

    @app.job("boom", queue="work")
    async def boom(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError("boom")

    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            exchange = await ch.get_exchange("jobs")
            message = aio_pika.Message(SURROGATE_BODY, message_id="bm-surr", type="boom")
            await exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: any(type(x.decision).__name__ == "Quarantine" for x in o))
    plain = await asyncio.to_thread(cli_subprocess, broker, "quarantine", "show", "work.quarantine")
    assert plain.returncode == 0, plain.stderr
    assert '    payload:    {"msg": "bad ? end"}' in plain.stdout.splitlines()
    as_json = await asyncio.to_thread(cli_subprocess, broker, "quarantine", "show", "work.quarantine", "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert (doc["message_id"], doc["payload"]) == ("bm-surr", {"msg": "bad ? end"})
    out = tmp_path / "q.jsonl"
    export = await asyncio.to_thread(cli_subprocess, broker, "quarantine", "export", "work.quarantine", str(out))
    assert export.returncode == 0, export.stderr
    assert "exported 1 message(s)" in export.stdout
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["payload"] for line in lines] == [{"msg": "bad ? end"}]
    assert await depth(broker, "work.quarantine") == 1
