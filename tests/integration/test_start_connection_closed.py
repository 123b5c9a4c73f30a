"""A worker whose connections the broker closes while it starts (README "Workers": the first connect).

Before, a close at one moment of a worker's start ended the process with a traceback
(``RuntimeError: <Connection ...> closed``, exit 1) or a bare ``broker error: [Errno 320]
CONNECTION_FORCED``, exit 3, naming nothing to do; nothing hung. Now the start begins again by
itself (within ``--connect-timeout``), says so, and the worker consumes. A scheduler replica's
(``schedule run``) likewise: before, ``broker error: could not open a channel: [Errno 320]
CONNECTION_FORCED``, exit 3.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, depth, process_running, write_file
from tests.integration.test_worker_process import exit_code, publisher, read_record, wait_until
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("at", ["pauses", "consumer"])
async def test_a_start_whose_connections_the_broker_closes_starts_again_and_consumes(
    broker: BrokerSettings, tmp_path: Path, at: str
):
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(record), "CLOSEAPP_AT": at}  # fmt: skip
    began = time.monotonic()
    with consume_subprocess("tests.integration.closeapp:app", env, ("--grace", "5s"), log) as proc:
        await app.enqueue("sleep", {"seconds": 0}, job_id="after-close")
        await wait_until(lambda: "closeapp: closed procapp-worker" in log.read_text() or proc.poll() is not None,
                         30, "the close")  # fmt: skip
        await wait_until(lambda: any(r[:2] == ["done", "after-close"] for r in read_record(record))
                         or proc.poll() is not None, 30, "the job's run")  # fmt: skip
        out = log.read_text()
        assert proc.poll() is None, out  # before: exit 1, "RuntimeError: <Connection: ...> closed" (or exit 3)
        took = time.monotonic() - began
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log.read_text()
    await app.close()
    assert code == 0, out
    assert "Traceback" not in out, out
    assert "lost while starting" in out, out
    assert "starting again" in out, out
    assert [r[1] for r in read_record(record) if r[0] == "done"] == ["after-close"]
    assert await depth(broker, "work") == 0
    assert took < 30, took


async def test_a_scheduler_start_whose_connection_the_broker_closes_starts_again_and_leads(
    broker: BrokerSettings, tmp_path: Path
):
    await publisher(broker, tmp_path)  # applies the work queue
    topo, log = tmp_path / "sched.toml", tmp_path / "replica.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "SCHEDAPP_TOPOLOGY": str(topo)}  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    with process_running([str(exe), "schedule", "run", "tests.integration.closesched:app"], env, log) as proc:
        await wait_until(lambda: " leads " in log.read_text() or proc.poll() is not None, 40, "a leader")
        out = log.read_text()
        assert proc.poll() is None, out  # before: exit 3, "broker error: could not open a channel: [Errno 320] ..."
        deadline = time.monotonic() + 20
        while await depth(broker, "work") < 2:  # the leader enqueues a tick each second
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log.read_text()
    assert code == 0, out
    assert "closeapp: closed schedapp-scheduler" in out, out
    assert "lost while starting" in out, out
    assert "starting again" in out, out


async def test_a_child_whose_start_the_broker_cuts_starts_again_itself_not_by_a_restart(
    broker: BrokerSettings, tmp_path: Path
):
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(record), "CLOSEAPP_AT": "consumer"}  # fmt: skip
    args = ("--processes", "2", "--grace", "5s")
    with consume_subprocess("tests.integration.closeapp:app", env, args, log) as proc:
        await wait_until(lambda: "closeapp: closed procapp-worker-publisher" in log.read_text()
                         or proc.poll() is not None, 40, "the close")  # fmt: skip
        await wait_until(lambda: "child 1 ready" in log.read_text().split("closeapp: closed")[-1]
                         or proc.poll() is not None, 40, "child 1 ready after the close")  # fmt: skip
        for i in range(4):
            await app.enqueue("sleep", {"seconds": 0}, job_id=f"child-{i}")
        await wait_until(lambda: len([r for r in read_record(record) if r[0] == "done"]) == 4
                         or proc.poll() is not None, 40, "the jobs' runs")  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log.read_text()
    await app.close()
    assert code == 0, out
    assert "closeapp: closed procapp-worker" in out, out
    assert "Traceback" not in out, out  # before: child 1 died of 'RuntimeError: <Connection ...> closed'
    assert "restarting it in" not in out, out  # ... and the supervisor restarted it (a crash-loop count)
    assert "[child 1] amqpjobs.worker: a connection to the broker was lost while starting" in out, out
    assert sorted(r[1] for r in read_record(record) if r[0] == "done") == [f"child-{i}" for i in range(4)]


def leadership(out: str) -> list[str]:
    """The replica's leadership lines in order: "leads" or "no longer leads"."""
    return ["no longer leads" if "no longer leads" in line else "leads" for line in out.splitlines()
            if "amqpjobs.scheduler" in line and " leads" in line]  # fmt: skip


@pytest.mark.version_independent  # the order of our own log lines
async def test_a_replica_that_leads_again_after_a_close_says_so_last(broker: BrokerSettings, tmp_path: Path):
    """Three broker-side closes of a leading ``schedule run``'s connection, 3 s apart: aio-pika reconnects in
    milliseconds and the replica takes the token again. Its lines alternate and the last is "leads" (was, each
    time: "leads" then "no longer leads" 1 ms later, the superseded leadership's end logged last while this
    replica went on sending ticks)."""
    from tests.integration.test_reconnect import force_close

    await (await publisher(broker, tmp_path)).close()  # the topology applied
    topo, log = tmp_path / "sched.toml", tmp_path / "replica.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "SCHEDAPP_TOPOLOGY": str(topo)}  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    with process_running([str(exe), "schedule", "run", "tests.integration.schedapp:app"], env, log) as proc:
        for closes in range(4):
            await wait_until(lambda n=closes: leadership(log.read_text()).count("leads") == n + 1
                             or proc.poll() is not None, 40, "leading")  # fmt: skip
            if closes < 3:
                await asyncio.sleep(5)
                assert await force_close(broker, "schedapp-scheduler") == 1
        await asyncio.sleep(1)  # a superseded leadership's end, were it said after the new one's start
        lines = leadership(log.read_text())
        proc.send_signal(signal.SIGTERM)
        code = await exit_code(proc)
    out = log.read_text()
    assert code == 0, out
    assert lines == ["leads", "no longer leads"] * 3 + ["leads"], out


def _refused(broker: BrokerSettings, what: str) -> tuple[str, str]:
    """A URL of ``broker`` the broker refuses at its handshake, and the error's words for it."""
    parts = urlsplit(broker.url)
    if what == "password":
        url = urlunsplit(parts._replace(netloc=f"{broker.username}:not-its-password@{parts.hostname}:{parts.port}"))
        return url, f"refused the credentials (user {broker.username!r})"
    url = urlunsplit(parts._replace(path="/no-such-vhost-199"))
    return url, "vhost 'no-such-vhost-199' does not exist: create it (rabbitmqctl add_vhost no-such-vhost-199)"


@pytest.mark.parametrize("command", ["consume", "schedule run"])
@pytest.mark.parametrize("what", ["password", "vhost"])
def test_a_start_the_broker_refuses_at_its_handshake_fails_at_once(
    broker: BrokerSettings, tmp_path: Path, command: str, what: str
):
    """Refused credentials or a missing vhost exit 3 at once, never taken for a lost connection (README)."""
    url, words = _refused(broker, what)
    topo, log = tmp_path / "proc.toml", tmp_path / "out.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "SCHEDAPP_TOPOLOGY": str(topo)}  # fmt: skip
    app = "tests.integration.procapp:app" if command == "consume" else "tests.integration.schedapp:app"
    exe = Path(sys.executable).with_name("amqpjobs")
    began = time.monotonic()
    with process_running([str(exe), *command.split(), app, "--connect-timeout", "20s"], env, log) as proc:
        code = proc.wait(40)
    took, out = time.monotonic() - began, log.read_text()
    assert code == 3, out
    assert words in out, out
    assert "lost while starting" not in out, out  # before: retried for 20 s, "starting again in 1s", 3 times
    assert took < 10, (took, out)


async def test_a_start_the_broker_closes_for_what_it_asked_fails_at_once(broker: BrokerSettings, tmp_path: Path):
    """A connection-level error the start causes (530 at a channel past channel_max) is no loss: exit 3 at once."""
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    topo, log = tmp_path / "proc.toml", tmp_path / "out.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "CHANMAXAPP_MAX": "2"}  # fmt: skip
    exe = Path(sys.executable).with_name("amqpjobs")
    began = time.monotonic()
    command = [str(exe), "consume", "tests.integration.chanmaxapp:app", "--connect-timeout", "20s"]
    with process_running(command, env, log) as proc:
        code = await asyncio.to_thread(proc.wait, 40)
    took, out = time.monotonic() - began, log.read_text()
    assert code == 3, out
    assert "has reached the negotiated channel_max (2)" in out.splitlines()[-1], out
    assert "lost while starting" not in out, out  # before: begun again for 20 s, then "Look in the broker's log"
    assert took < 10, (took, out)
