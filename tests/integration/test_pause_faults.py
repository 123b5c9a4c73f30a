"""Pause and resume when something goes wrong (README "Flow control" → "Pause and resume"), real broker."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import aiormq
import pytest

from amqpjobs import App
from amqpjobs.errors import BrokerError, SignalNotSentError
from amqpjobs.jobs import crash, envelope
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.pausing import pause, resume
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.naming import rate_queue_names
from amqpjobs.wire.flags import read_flags
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import cli, depth, raw_channel, wait_until
from tests.integration.test_pause import _app_with_slow_job, _succeeded, _worker
from tests.integration.test_rate_limits import in_process_app, most_in_one_second
from tests.integration.test_worker_app_close import TOPOLOGY as WORK_AND_SIDE
from tests.integration.worker_env import Recorder, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def _mgmt(broker: BrokerSettings, method: str, path: str, **kw: Any) -> Any:
    with ManagementClient(broker) as mgmt:
        return mgmt.request(method, path, **kw)


async def _no_start_1s_after_pause(broker: BrokerSettings, starts: dict[int, list[float]]) -> None:
    """Pause ``work`` while its jobs run; no job may start more than 1.0 s after ``pause`` returned."""
    while len(starts) < 4:
        await asyncio.sleep(0.01)
    await pause(broker, "work", "fault test")
    returned = time.monotonic()
    await asyncio.sleep(2.0)
    late = sorted(round(s - returned, 2) for ss in starts.values() for s in ss if s > returned + 1.0)
    assert late == [], f"starts more than 1.0 s after pause returned: {late}"


async def test_pause_reaches_running_workers_whatever_exchange_a_user_deleted(broker: BrokerSettings, tmp_path: Path):
    """Deleting the old ``amqpjobs.control`` exchange by hand (or finding it absent) changes nothing."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.1)
    worker, rec = await _worker(app, broker)
    try:
        vhost = quote(broker.vhost, safe="")
        await asyncio.to_thread(_mgmt, broker, "DELETE", f"/exchanges/{vhost}/amqpjobs.control", allow_404=True)
        await _sixty_paused_then_resumed(app, broker, starts, rec)
    finally:
        await worker.shutdown()
        await app.close()
    assert all(len(s) == 1 for s in starts.values())
    assert sorted(starts) == list(range(60))


async def _sixty_paused_then_resumed(
    app: App, broker: BrokerSettings, starts: dict[int, list[float]], rec: Recorder
) -> None:
    """60 slow jobs enqueued, paused (no start 1 s after ``pause`` returned), resumed, all succeeded."""
    for i in range(60):
        await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
    await _no_start_1s_after_pause(broker, starts)
    assert await resume(broker, "work") is True
    await rec.wait_for(lambda _: len(_succeeded(rec)) >= 60, timeout=30)


async def test_a_deleted_listener_queue_is_declared_again_and_the_flags_read(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = await make_app(broker, tmp_path)
    caplog.set_level(logging.INFO, "amqpjobs")
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.1)
    worker, rec = await _worker(app, broker)
    try:
        signals = worker._pauses._signals
        assert signals is not None
        # an exclusive queue: only its own connection may delete it (the management API is refused on 3.10)
        assert worker._connection is not None
        channel = await worker._connection.channel()
        await channel.queue_delete(signals.name)
        await channel.close()
        # the worker hears its consumer cancelled (the broker's notice, in its own time), listens again and reads
        # the flags: wait for that, or the pause below could come before it and prove nothing about the new queue
        await wait_until(lambda: "pause flags read again" in caplog.text, 15, "the flags read after listening again")
        assert f"the queue for pause signals {signals.name} was deleted; declared it again" in caplog.text
        await _sixty_paused_then_resumed(app, broker, starts, rec)
    finally:
        await worker.shutdown()
        await app.close()
    assert all(len(s) == 1 for s in starts.values())
    assert sorted(starts) == list(range(60))


async def test_a_lost_signal_channel_reads_the_flags_again_at_once(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Only the listener's channel closes (the broker closes it on an error): it reopens, and the flags are read."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.01)
    caplog.set_level(logging.INFO, "amqpjobs.worker")
    worker, rec = await _worker(app, broker)
    try:
        signals = worker._pauses._signals
        assert signals is not None
        assert signals._channel is not None
        underlay = await signals._channel.get_underlay_channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):  # a 404 closes the channel: the point
            await underlay.queue_declare("no-such-queue-here", passive=True)
        deadline = time.monotonic() + 5
        while "pause flags read again" not in caplog.text:  # after the reopen, well before the 30 s recheck
            assert time.monotonic() < deadline, "the flags were not read again after the channel came back"
            await asyncio.sleep(0.05)
        for i in range(10):
            await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 10, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()


async def test_a_worker_started_while_paused_takes_no_delivery(broker: BrokerSettings, tmp_path: Path):
    """No consumer while paused: nothing handed back at start (the queue's order is kept), all run on resume."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.0)
    await pause(broker, "work", "before the worker")
    for i in range(10):
        await app.enqueue("slow", {"i": i}, job_id=f"job-{i}")
    worker, rec = await _worker(app, broker, concurrency=1)
    try:
        await asyncio.sleep(1.5)
        assert rec.outcomes == []  # nothing taken, nothing handed back
        ok, why = worker.readiness()
        assert ok
        assert why == "consuming nothing with 0 slot(s); paused: work", why
        assert await depth(broker, "work") == 10
        assert await resume(broker, "work") is True
        await rec.wait_for(lambda _: len(_succeeded(rec)) >= 10, timeout=30)
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(starts, key=lambda i: starts[i][0]) == list(range(10))  # in enqueue order


async def test_a_pause_stops_the_waiting_room_of_a_rate_limited_job(broker: BrokerSettings, tmp_path: Path):
    app = await in_process_app(broker, tmp_path, "4/s")
    room = rate_queue_names("work", "limited").waiting
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=2, grace=10), recorder)
    await worker.start()
    try:
        for i in range(16):
            await app.enqueue("limited", {}, job_id=f"limited-{i}")
        await recorder.wait_for(lambda outs: len(outs) >= 2, 15)
        await pause(broker, "work", "rooms too")
        await asyncio.sleep(1.0)  # the ones waiting for a token at the pause are handed back by then
        seen, waiting = len(recorder.outcomes), await depth(broker, room)
        assert waiting > 0
        await asyncio.sleep(3.0)
        assert recorder.outcomes[seen:] == []  # nothing taken from the room (no start, no hand-back)
        assert await depth(broker, room) == waiting
        assert await resume(broker, "work") is True
        await recorder.wait_for(lambda outs: len({o.job_id for o in outs if o.kind == "succeeded"}) >= 16, 30)
    finally:
        await worker.shutdown()
        await app.close()
    ran = [o.job_id for o in recorder.outcomes if o.kind == "succeeded"]
    assert sorted(ran) == sorted(f"limited-{i}" for i in range(16))  # each once


async def test_deliveries_waiting_for_a_token_at_a_pause_go_back_without_taking_one(
    broker: BrokerSettings, tmp_path: Path
):
    """Each token taken starts a job: a delivery waiting at the pause goes back without one, and after the
    resume the rate holds (2/s: at most count + 1 = 3 starts in any one second, none lost)."""
    app = await in_process_app(broker, tmp_path, "2/s")
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(concurrency=2, grace=10), recorder)
    await worker.start()
    assert worker._rates is not None
    gate = worker._rates.rooms["limited"].gate
    try:
        for i in range(10):
            await app.enqueue("limited", {}, job_id=f"limited-{i}")
        await recorder.wait_for(lambda outs: len(_succeeded(recorder)) >= 2, 15)
        await pause(broker, "work", "tokens")
        await asyncio.sleep(1.6)  # over three token intervals: a delivery still waiting would have taken one
        ran, back = len(_succeeded(recorder)), [o.job_id for o in recorder.outcomes if o.kind == "handed_back"]
        assert back, "no delivery waited for a token at the pause"
        assert (gate.taken, ran) == (ran, ran)  # no token taken by a delivery that then went back
        resumed = time.monotonic()
        assert await resume(broker, "work") is True
        await recorder.wait_for(lambda outs: len(_succeeded(recorder)) >= 10, 30)
    finally:
        await worker.shutdown()
        await app.close()
    ran_ids = [o.job_id for o in _succeeded(recorder)]
    assert sorted(ran_ids) == sorted(f"limited-{i}" for i in range(10))  # each once
    assert gate.taken == 10
    after = sorted(o.started for o in _succeeded(recorder) if o.started > resumed)
    assert most_in_one_second(after) <= 3
    assert after[-1] - after[0] <= (len(after) - 1) * 0.5 + 1.0, after  # one every 0.5 s: no token gone missing


@asynccontextmanager
async def _user(broker: BrokerSettings, **permissions: str) -> AsyncIterator[BrokerSettings]:
    """Settings for a new user of the test vhost with ``permissions`` (configure/write/read; ``.*`` when not given)."""
    user, password = f"limited-{time.monotonic_ns()}", "Pw9-secret"
    vhost = quote(broker.vhost, safe="")
    await asyncio.to_thread(_mgmt, broker, "PUT", f"/users/{user}", json={"password": password, "tags": "management"})
    try:
        await asyncio.to_thread(_mgmt, broker, "PUT", f"/permissions/{vhost}/{user}",
                                json={k: permissions.get(k, ".*") for k in ("configure", "write", "read")})  # fmt: skip
        parts = urlsplit(broker.nodes[0])
        url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
        yield broker_settings(url, broker.management_url)
    finally:
        await asyncio.to_thread(_mgmt, broker, "DELETE", f"/users/{user}", allow_404=True)


async def test_a_worker_refused_its_listener_says_which_permission_on_which_name(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    _app_with_slow_job(app, {}, 0.0)
    try:
        async with _user(broker, read=r"^(?!amq\.direct$).*") as limited:
            worker = Worker(app, limited, WorkerOptions(queues=("work",), concurrency=1, grace=1))
            with pytest.raises(BrokerError) as raised:
                await worker.run()
    finally:
        await app.close()
    message = str(raised.value)
    assert message.startswith("listening for pause signals failed: ACCESS_REFUSED")
    assert message.endswith("; give the worker's user configure, write and read permission on queues named "
                            "amqpjobs.pause-listener.* and read permission on exchange amq.direct")  # fmt: skip


async def test_pause_whose_signal_is_refused_says_so_and_the_flag_stays(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    await app.close()
    refuse = r"^(?!amq\.direct$|amqpjobs\.control$).*"  # every signal exchange, old and new
    async with _user(broker, write=refuse) as limited:
        with pytest.raises(SignalNotSentError) as raised:
            await pause(limited, "work", "no signal")
        assert "flag set, but the signal could not be sent" in str(raised.value)
        assert "ACCESS_REFUSED" in str(raised.value)
        assert list(await asyncio.to_thread(read_flags, broker, ["work"])) == ["work"]
        out = await asyncio.to_thread(cli, limited, "resume", "work")
        assert out.exit_code == 5, out.output
        assert "resumed job queue work: flag deleted, but the signal could not be sent" in out.output
        assert "workers notice within 30 s" in out.output
        assert await asyncio.to_thread(read_flags, broker, ["work"]) == {}


async def test_a_suspects_turn_of_another_job_queue_leaves_a_paused_ones_waiting_room_paused(
    broker: BrokerSettings, tmp_path: Path
):
    """The turn's end resumes the sources it stopped, not those an operator paused: a waiting room's queue
    (``work.rate-waiting.limited``) belongs to job queue ``work`` (README "Pause and resume"; found by a review)."""
    path = tmp_path / "two.toml"
    path.write_text(WORK_AND_SIDE)  # the same two job queues as the app-close tests
    await apply_topology(path, broker)
    app = App("turns", topology=load_topology(path).topology, url=broker.url)
    app.job("limited", queue="work", rate_limit="4/s")(lambda p, c: None)
    app.job("suspect", queue="side")(lambda p, c: None)
    room = rate_queue_names("work", "limited").waiting
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work", "side"), concurrency=2, grace=10), recorder)
    await worker.start()
    try:
        for i in range(16):
            await app.enqueue("limited", {}, job_id=f"limited-{i}")
        await recorder.wait_for(lambda outs: len(outs) >= 2, 15)
        await pause(broker, "work", "rooms stay paused")
        await asyncio.sleep(1.0)  # the ones waiting for a token at the pause are handed back by then
        seen, waiting = len(recorder.outcomes), await depth(broker, room)
        assert waiting > 0
        async with raw_channel(broker) as ch:  # a suspect of job queue side: its turn pauses and resumes sources
            headers: dict[str, Any] = {envelope.JOB: "suspect", crash.STARTS: 2, crash.WORK_QUEUE: "side"}
            message = aio_pika.Message(b"{}", message_id="s1", headers=headers, content_type="application/json")
            await ch.default_exchange.publish(message, "side.suspects")
        await recorder.wait_for(lambda outs: any(o.job_id == "s1" for o in outs), 15)
        await asyncio.sleep(2.0)
        assert [o.job_id for o in recorder.outcomes[seen:]] == ["s1"]  # nothing of work's room taken
        assert await depth(broker, room) == waiting
        assert await resume(broker, "work") is True
        await recorder.wait_for(lambda outs: len({o.job_id for o in outs if o.kind == "succeeded"}) >= 17, 30)
    finally:
        await worker.shutdown()
        await app.close()


async def test_a_worker_whose_vhost_is_deleted_says_so_and_what_to_do_then_comes_back_with_it(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Before: 'listening for pause signals failed: [Errno 320] CONNECTION_FORCED - vhost ... is deleted after its
    queue was deleted; pause flags are read every 30s meanwhile': no queue was deleted by anyone, and no flag can be
    read from a vhost that is gone."""
    app = await make_app(broker, tmp_path)
    starts: dict[int, list[float]] = {}
    _app_with_slow_job(app, starts, 0.01)
    caplog.set_level(logging.INFO, "amqpjobs")
    worker, _ = await _worker(app, broker)
    try:
        with ManagementClient(broker) as mgmt:
            mgmt.delete_vhost(broker.vhost)
        said = f"the vhost {broker.vhost!r} of this worker was deleted"
        await wait_until(lambda: said in caplog.text, 15, "the listener's warning")
        (line,) = [r.getMessage() for r in caplog.records if said in r.getMessage()]
        # the broker closes a connection of a vhost being deleted with "is deleted" or "is down" (3.10: either)
        assert line in (
            f"{said} (CONNECTION_FORCED - vhost {broker.vhost!r} is deleted): its queues went with it, the queue for "
            "pause signals too, and no job starts here; the worker reconnects on its own and listens again once the "
            "vhost is back: create it again and apply the topology (amqpjobs topology apply), or stop this worker",
            f"{said} or stopped (CONNECTION_FORCED - vhost {broker.vhost!r} is down): no job starts here; the worker "
            "reconnects on its own and listens again once the vhost is back: a deleted one, create it again and "
            "apply the topology (amqpjobs topology apply); a stopped one, restart it (rabbitmqctl restart_vhost); "
            "or stop this worker",
        ), line
        assert "after its queue was deleted" not in caplog.text
        with ManagementClient(broker) as mgmt:
            mgmt.create_vhost(broker.vhost)
        await apply_topology(tmp_path / "applied.toml", broker)
        await wait_until(lambda: "pause flags read again" in caplog.text, 30, "the flags read in the vhost again")
        await app.enqueue("slow", {"i": 7}, job_id="job-7")
        await wait_until(lambda: 7 in starts, 30, "a job run in the vhost again")
    finally:
        await worker.shutdown()
        await app.close()
