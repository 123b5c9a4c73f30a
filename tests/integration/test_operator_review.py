"""Issue 21 review (a tired operator's findings on main at 7d63d45), on the real broker."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs import JobContext
from amqpjobs.jobs.events import decode_events, event_messages
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.connection import connect
from amqpjobs.wire.events import MAX_PENDING, OutcomeEvents, subscribe_outcomes
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import ROOT, cli, depth, raw_channel, until
from tests.integration.test_operator_papercuts import EXE, env_for, replay_signalled
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.test_topology_holes import delete
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_events_of_replayed_deliveries_are_never_dropped_over_the_cap(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    connection = await connect(broker)
    heard: list[bytes] = []
    watch = await subscribe_outcomes(connection, heard.append)
    events = await OutcomeEvents.open(connection, event_messages)
    for n in range(MAX_PENDING + 500):  # a burst of fast jobs: the plain events beyond the cap are dropped
        events.emit("work.succeeded", json.dumps({"outcome": "succeeded", "id": f"plain-{n}"}).encode())
    for n in range(20):  # replayed deliveries (bounded by the replay's rate) are kept, ahead of the rest
        events.emit("work.succeeded", json.dumps({"outcome": "succeeded", "id": f"canary-{n}"}).encode(), keep=True)
    assert events.dropped == 500
    await until(lambda: events.published == MAX_PENDING + 20, timeout=30)

    def ids() -> list[str]:
        return [e.id for body in heard for e in decode_events(body)]

    await until(lambda: len(ids()) >= MAX_PENDING + 20, timeout=10)
    heard_ids = ids()
    assert heard_ids[:20] == [f"canary-{n}" for n in range(20)]  # sent ahead of the plain backlog
    assert sorted(heard_ids[20:]) == sorted(f"plain-{n}" for n in range(MAX_PENDING))  # each once
    await events.close()
    await watch.close()
    await connection.close()


async def test_events_come_back_on_after_the_exchange_is_re_applied(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    async with running_worker(app, broker) as (worker, rec):
        delete(broker, "exchanges", EVENTS_EXCHANGE)
        await app.enqueue("mail", {"n": 0})
        await rec.wait_for(lambda o: len(o) >= 1)
        await make_app(broker, tmp_path)  # topology apply declares the exchange again
        connection = await connect(broker)
        heard: list[bytes] = []
        watch = await subscribe_outcomes(connection, heard.append)
        assert worker._events is not None
        worker._events.recheck_after = 0.2
        for n in range(1, 30):
            await app.enqueue("mail", {"n": n})
            await asyncio.sleep(0.1)
        await rec.wait_for(lambda o: len(o) >= 30)
        await until(lambda: len(heard) >= 1, timeout=10)
        await watch.close()
        await connection.close()
    await app.close()


async def test_a_canary_nobody_took_says_where_it_waits_and_does_not_advise_park(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 5)
    result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "1", "--canary-timeout", "1s")
    assert result.exit_code == 1, result.output
    assert (
        "q-0 (mail): no outcome event within 1s: no worker took it (still in work, which has no consumer)"
        in result.stderr
    )
    assert "quarantine park" not in result.stderr
    assert await depth(broker, "work") == 1


async def test_a_canary_a_worker_took_without_an_event_is_not_called_failed(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await fill_quarantine(broker, 5)
    async with running_worker(app, broker) as (worker, rec):
        assert worker._events is not None
        worker._events.emit = lambda *a, **k: None  # type: ignore[method-assign]  # every event lost on the way
        result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "1", "--canary-timeout", "1s")
        await rec.wait_for(lambda o: len(o) >= 1)
    assert result.exit_code == 1, result.output
    assert "q-0 (mail): no outcome event within 1s: not in work nor back in work.quarantine" in result.stderr
    assert "events may have been dropped: see amqpjobs_events_dropped_total" in result.stderr
    assert "quarantine park" not in result.stderr


async def test_a_passing_canary_names_the_next_command_and_counts_only_what_moved(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await fill_quarantine(broker, 3)
    async with running_worker(app, broker) as (_, rec):
        result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "50", "--rate", "200")
        await rec.wait_for(lambda o: len(o) >= 3)
    assert result.exit_code == 0, result.output
    assert "canary: moving up to 3 job(s) first" in result.stdout
    assert "canary passed: 3 of 3 succeeded" in result.stdout
    assert "50 of 50" not in result.stdout
    assert "replayed 3, skipped 0, left 0 in work.quarantine" in result.stdout
    assert "including the canary wait" not in result.stdout  # every move was a canary's: no wait between moves
    assert result.stdout.rstrip().splitlines()[-1] == "next: amqpjobs status (the quarantine is empty)"


async def test_without_the_events_exchange_a_canary_checks_before_it_says_anything(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    delete(broker, "exchanges", EVENTS_EXCHANGE)
    result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "2")
    assert result.exit_code == 2, result.output
    assert "moving" not in result.stdout
    status = await asyncio.to_thread(cli, broker, "status", "--queues", "work")
    assert f"exchange {EVENTS_EXCHANGE!r} does not exist" in status.stdout
    assert "canary replays need it" in status.stdout


def _in_vhost(broker: BrokerSettings, vhost: str) -> BrokerSettings:
    parts = urlsplit(broker.url)
    return broker_settings(urlunsplit(parts._replace(path="/" + vhost)), broker.management_url)


@pytest.mark.parametrize(
    "args", [["quarantine", "list", "work"], ["replay", "work"], ["quarantine", "park", "work", "--yes"]]
)
async def test_a_missing_vhost_is_named(broker: BrokerSettings, args: list[str]):
    result = await asyncio.to_thread(cli, _in_vhost(broker, "no-such-vhost-21"), *args)
    assert result.exit_code == 3, result.output
    said = "vhost 'no-such-vhost-21' does not exist: create it (rabbitmqctl add_vhost no-such-vhost-21)"
    assert said in result.stderr, result.stderr
    assert "InvalidFrameError" not in result.output


async def test_park_and_purge_without_yes_off_a_terminal_refuse(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    for verb in ("park", "purge"):
        result = await asyncio.to_thread(cli, broker, "quarantine", verb, "work")
        assert result.exit_code == 2, result.output
        assert f"refusing to {verb} without --yes when stdin is not a terminal" in result.stderr
    assert await depth(broker, "work.quarantine") == 2


async def test_an_unknown_jobs_event_carries_the_raw_name(broker: BrokerSettings, tmp_path: Path):
    import aio_pika

    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    connection = await connect(broker)
    heard: list[bytes] = []
    watch = await subscribe_outcomes(connection, heard.append)
    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            await ch.default_exchange.publish(
                aio_pika.Message(b"{}", content_type="application/json", message_id="u-1", type="ma\nil"), "work"
            )
        await rec.wait_for(lambda o: len(o) >= 1)
        await until(lambda: len(heard) >= 1)
    (event,) = decode_events(heard[0])
    assert event.job == "ma\nil"
    assert "'ma\nil'" in event.error
    assert "\\n" not in event.error
    await watch.close()
    await connection.close()
    await app.close()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_a_signal_during_park_prints_what_was_parked_and_left(
    broker: BrokerSettings, tmp_path: Path, sig: signal.Signals, code: int
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 3000)
    proc = await asyncio.create_subprocess_exec(
        EXE, "quarantine", "park", "work", "--yes", env=env_for(broker), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while await depth(broker, "work.parked") < 50 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    proc.send_signal(sig)
    out_bytes, err_bytes = await asyncio.wait_for(proc.communicate(), 20)
    err = err_bytes.decode()
    assert proc.returncode == code, (out_bytes, err)
    found = re.search(r"interrupted: parked (\d+) in work\.parked, left (\d+) in work\.quarantine", err)
    assert found, err
    parked, left = map(int, found.groups())
    in_parked = await depth(broker, "work.parked")
    assert parked <= in_parked <= parked + 1  # the one in flight: its copy sent (uncounted: no confirm yet)
    assert left == await depth(broker, "work.quarantine")
    assert 3000 <= in_parked + left <= 3001  # ... and its original back: in both, as the summary says
    assert 50 <= parked < 3000
    assert "the one job in flight at the interrupt may now be in both work.quarantine and work.parked" in err
    assert "WARNING" not in err
    assert "Traceback" not in err


async def test_sigterm_during_replay_prints_the_summary_and_exits_143(broker: BrokerSettings, tmp_path: Path):
    code, _, err = await replay_signalled(broker, tmp_path, 3, signal.SIGTERM)
    assert code == 143, err
    found = re.search(r"interrupted: moved (\d+), skipped 0, left (\d+) in work\.quarantine", err)
    assert found, err
    moved, left = map(int, found.groups())
    assert 20 <= moved + left <= 21  # the one in flight may be in both (test_operator_papercuts)
    assert left == await depth(broker, "work.quarantine")


async def test_an_idle_workers_stop_counts_no_job(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    caplog.set_level("INFO", logger="amqpjobs.worker")
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("mail", {})
        await rec.wait_for(lambda o: len(o) >= 1)
    await app.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]
    assert "draining: no job in flight" in lines, lines
    assert "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered); exit 0" in lines, lines


async def test_replay_to_a_queue_whose_workers_do_not_handle_the_jobs_is_refused(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    await make_app(broker, tmp_path)  # writes tmp_path/app.toml: job queues "work" and "ghost"
    (tmp_path / "review21app.py").write_text(
        "from amqpjobs import App\n"
        f"app = App('r21', topology={str(tmp_path / 'app.toml')!r})\n"
        "@app.job('mail', queue='work')\n"
        "async def mail(payload, ctx):\n"
        "    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    await fill_quarantine(broker, 3)
    async with raw_channel(broker) as ch:
        await ch.declare_queue("ghost", durable=True)
    for dry in (["--dry-run"], []):
        args = ["replay", "work", "--to", "ghost", "--app", "review21app:app", *dry]
        result = await asyncio.to_thread(cli, broker, *args)
        assert result.exit_code == 2, result.output
        assert "'ghost' workers do not handle job(s) 'mail' (3 message(s)): job queue 'work' does" in result.stderr
        assert "would replay" not in result.stdout
    assert await depth(broker, "ghost") == 0
    assert await depth(broker, "work.quarantine") == 3
    unchecked = await asyncio.to_thread(cli, broker, "replay", "work", "--to", "ghost", "--dry-run")
    assert unchecked.exit_code == 0, unchecked.output
    assert "without --app MODULE:APP the CLI cannot tell which jobs 'ghost' workers handle" in unchecked.stderr


async def test_only_names_we_would_create_are_orphans_and_a_stray_shard_hides_nothing(
    broker: BrokerSettings, tmp_path: Path
):
    import aio_pika

    from amqpjobs.runtime.deploy import apply_topology, plan_topology

    topo = tmp_path / "mail.toml"
    topo.write_text('[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "mail"\nexchange = "jobs"\n')
    await apply_topology(topo, broker)
    async with raw_channel(broker) as ch:
        for name in ("mail.retry.5s.bak", "mail.retry.1s.shard-0", "mail.retry.9s", "mail.shard-1"):
            await ch.declare_queue(name, durable=True)
            await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key=name)
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="mail")
    result = await plan_topology(topo, broker)
    assert sorted(result.orphans) == [("mail.retry.9s", 1), ("mail.shard-1", 1)]
    status = await asyncio.to_thread(cli, broker, "status", "--queues", "mail")
    rows = [line.split()[0] for line in status.stdout.splitlines()]
    assert "mail" in rows, status.stdout
    assert "queue mail does not exist" not in status.stdout


async def test_a_message_of_events_larger_than_a_frame_arrives_whole(broker: BrokerSettings, tmp_path: Path):
    """256 events of ~1 KB on one routing key: one message over frame_max (131,072), split into body frames."""
    await make_app(broker, tmp_path)
    connection = await connect(broker)
    heard: list[bytes] = []
    watch = await subscribe_outcomes(connection, heard.append)
    events = await OutcomeEvents.open(connection, event_messages)
    for n in range(256):
        events.emit("work.retried", json.dumps({"outcome": "retried", "id": f"big-{n}", "error": "E" * 1000}).encode())
    await until(lambda: sum(len(decode_events(b)) for b in heard) >= 256, timeout=10)
    await events.close()
    await watch.close()
    await connection.close()
    assert len(heard) == 1 and len(heard[0]) > 131_072  # noqa: PT018
    assert [e.id for e in decode_events(heard[0])] == [f"big-{n}" for n in range(256)]
