"""``consume --processes 2`` when the broker refuses the children at run time (README "Worker processes").

A user's ``max-channels`` limit set while both children consume (``rabbitmqctl set_user_limits``), then
their connections lost (closed through the management API, as a broker restart would): each child's
reconnect meets ``530 NOT_ALLOWED``, its run-time guard stops it (two hard closes within 60 s, exit 3).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import pytest

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import (
    cli_subprocess,
    close_connections,
    consume_subprocess,
    depth,
    drain,
    limited_user,
    write_file,
)
from tests.integration.test_worker_process import publisher, read_record
from tests.integration.test_worker_processes import get, metrics_port
from tests.integration.worker_env import APPLIED_TOPOLOGY
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def _health(port: int, path: str) -> tuple[int, str]:
    """The supervisor's ``path`` (status, text); (0, why) once it no longer answers."""
    try:
        return get(port, path)
    except OSError as exc:
        return 0, str(exc)


def _counts(broker: BrokerSettings, queue: str) -> tuple[int, int]:
    """(ready, unacked) of ``queue`` by the management API."""
    with ManagementClient(broker) as mgmt:
        doc = mgmt.queue(broker.vhost, queue) or {}
    return int(doc.get("messages_ready") or 0), int(doc.get("messages_unacknowledged") or 0)


async def test_children_a_users_max_channels_refuses_at_run_time_stop_every_child_exit_3(
    broker: BrokerSettings, tmp_path: Path
):
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as (user, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        args = ("--processes", "2", "--concurrency", "2", "--metrics-port", "0")
        health: list[tuple[float, int, str, int, str]] = []
        with consume_subprocess("tests.integration.procapp:app", env, args, log) as proc:
            port = await metrics_port(tmp_path)
            deadline = time.monotonic() + 40
            while get(port, "/readyz")[0] != 200:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.3)
            for i in range(20):
                await app.enqueue("sleep", {"seconds": 2}, job_id=f"j-{i}")
            while sum(1 for r in read_record(record) if r[0] == "start") < 4:  # 2 slots in each child: all busy
                assert time.monotonic() < deadline + 20, log.read_text()
                await asyncio.sleep(0.2)
            with ManagementClient(broker) as mgmt:
                mgmt.request("PUT", f"/user-limits/{user}/max-channels", {"value": 4})  # one child's start
            cut_at = time.monotonic()
            while not await asyncio.to_thread(close_connections, broker, "procapp-worker"):
                await asyncio.sleep(0.3)
            while proc.poll() is None and time.monotonic() - cut_at < 90:
                status, text = await asyncio.to_thread(_health, port, "/healthz")
                ready_status, ready_text = await asyncio.to_thread(_health, port, "/readyz")
                health.append((round(time.monotonic() - cut_at, 1), status, text[:90], ready_status, ready_text[:200]))
                await asyncio.sleep(0.5)
            code, took = proc.poll(), time.monotonic() - cut_at
        out = log.read_text()
    await app.close()
    done = [r[1] for r in read_record(record) if r[0] == "done"]
    exact, settle = await depth(broker, "work"), time.monotonic() + 15
    while (counts := _counts(broker, "work")) != (exact, 0) and time.monotonic() < settle:
        await asyncio.sleep(0.5)  # the management API's counts lag a statistics interval
    ready, unacked = counts
    starts = re.findall(r"child \d started", out)
    # before: each child stopped by its guard (exit 3, 7 s after the cut) was restarted; child 1 got in, child 2's
    # restart was refused 5 times ('exited before it was ready 5 times within 60s', 23 s after the cut), no fix named
    assert code == 3, (code, took, out[-3000:])
    assert len(starts) == 2, out[-3000:]  # no child restarted
    last = out.strip().splitlines()[-1]
    assert last.startswith("broker error: worker child "), last
    assert "stopped with an error no restart can change" in last, last
    assert "number of channels opened for user" in last, last
    assert "rabbitmqctl set_user_limits" in last, last
    assert took < 30, (took, out[-3000:])  # measured on 3.10: 11 s (two refusals 5 s apart, then the drain)
    # the child's exit code, as the supervisor saw it, is the one its stop line says (one home: amqpjobs.exit_codes)
    final = re.search(r"child (\d) stopped \(exit code (-?\d+)\) with an error no restart can change", out)
    assert final is not None, out[-3000:]
    stops = re.findall(r"\[child (\d)\] amqpjobs\.worker: worker stopped: [^\n]*; exit (\d+)", out)
    assert (final[1], "3") in stops, (stops, out[-3000:])
    assert final[2] == "3", final[0]  # before: "child 1 stopped (exit code 1)" after "[child 1] ... exit 3"
    waiting = [m.message_id for m in await drain(broker, "work")]
    assert unacked == 0, unacked
    assert len(waiting) == len(set(waiting)) == ready, (waiting, ready)
    assert set(waiting) | set(done) == {f"j-{i}" for i in range(20)}, (waiting, done)  # none lost
    assert all(h[3] in (0, 503) for h in health), health  # /readyz: "not connected to the broker (reconnecting)"


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_a_start_a_users_max_channels_refuses_says_the_fix_wherever_it_meets_it(
    broker: BrokerSettings, tmp_path: Path, limit: int
):
    """The worker needs 4 channels: a limit of 1, 2 or 3 refuses a channel open at another step of its start."""
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    topo, log = tmp_path / "proc.toml", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as (user, url):
        with ManagementClient(broker) as mgmt:
            mgmt.request("PUT", f"/user-limits/{user}/max-channels", {"value": limit})
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(tmp_path / "record.txt")}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, (), log) as proc:
            code = await asyncio.to_thread(proc.wait, 30)
    out = log.read_text()
    last = out.strip().splitlines()[-1]
    assert code == 3, out
    assert re.search(rf"has reached the maximum allowed user limit of \(?{limit}\)?", last), out  # 4.x: no ()
    # before, limit 2: "broker error: looking for queues and exchanges failed: NOT_ALLOWED - number of channels
    # opened for user '...' has reached the maximum allowed user limit of (2)" (1 and 3 named the fix)
    assert "; fix: raise or clear the user's max-channels limit (rabbitmqctl set_user_limits" in last, out


async def _until_logged(log: Path, proc: subprocess.Popen[str], words: str, deadline: float, step: float) -> None:
    """Wait until ``log`` holds ``words``; fail if ``proc`` ends or ``deadline`` (monotonic) passes first."""
    text = log.read_text  # a small file, read between sleeps
    while words not in text():
        assert proc.poll() is None, text()
        assert time.monotonic() < deadline, text()
        await asyncio.sleep(step)


async def _runs_again(app: App, record: Path, log: Path, proc: subprocess.Popen[str], deadline: float) -> int:
    """Enqueue job ``after``, wait until ``proc``'s worker ran it (by ``deadline``), then SIGTERM; its exit code."""
    await app.enqueue("sleep", {"seconds": 0}, job_id="after")
    text = log.read_text
    while not any(r[:2] == ["done", "after"] for r in read_record(record)):
        assert proc.poll() is None, text()[-3000:]
        assert time.monotonic() < deadline, text()[-3000:]
        await asyncio.sleep(0.2)
    proc.terminate()
    return await asyncio.to_thread(proc.wait, 30)


async def test_connections_refused_together_in_one_reconnect_round_do_not_stop_a_worker(
    broker: BrokerSettings, tmp_path: Path
):
    """A refusal lifted after one round (an operator's fix, a limit briefly reached): the worker consumes again."""
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as (user, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            deadline = time.monotonic() + 40
            await _until_logged(log, proc, "worker consuming", deadline, 0.2)
            app.job("nosuch", queue="work")(lambda p, c: None)
            await app.enqueue("nosuch", {}, job_id="unknown")  # quarantined: the publisher's connection holds channels
            while "unknown-job" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.2)
            with ManagementClient(broker) as mgmt:
                mgmt.request("PUT", f"/user-limits/{user}/max-channels", {"value": 0})  # every channel refused
            while await asyncio.to_thread(close_connections, broker, None, user) < 3:  # worker, publisher, events
                await asyncio.sleep(0.3)
            await _until_logged(log, proc, "for what it sent", deadline, 0.05)
            with ManagementClient(broker) as mgmt:
                mgmt.request("DELETE", f"/user-limits/{user}/max-channels")
            # before: exit 3 at once, "... (NOT_ALLOWED - number of channels opened for user '...' has reached
            # the maximum allowed user limit of (0)), again 0s later: every reconnect meets the same refusal"
            code = await _runs_again(app, record, log, proc, deadline + 30)
    await app.close()
    out = log.read_text()
    assert code == 0, out[-3000:]
    assert "stopped (what it held unacked" not in out, out[-3000:]


async def test_a_refusal_met_at_run_time_and_at_the_immediate_reconnect_is_one_round(
    broker: BrokerSettings, tmp_path: Path
):
    """A channel the running worker opens is refused (a limit briefly reached), and so is aio-pika's reconnect
    a few ms later: one round. Lifted before the next round (5 s), the worker consumes again."""
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as (user, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            deadline = time.monotonic() + 40
            await _until_logged(log, proc, "worker consuming", deadline, 0.2)
            await asyncio.sleep(6)  # aio-pika reconnects at once when its last attempt is over 5 s old
            with ManagementClient(broker) as mgmt:
                mgmt.request("PUT", f"/user-limits/{user}/max-channels", {"value": 0})  # every new channel refused
            paused = await asyncio.to_thread(cli_subprocess, broker, "pause", "work", "--reason", "test")
            assert paused.returncode == 0, paused.stdout + paused.stderr
            # the worker reads the flags on a new channel: 530
            await _until_logged(log, proc, "for what it sent", deadline, 0.05)
            await asyncio.sleep(0.5)
            with ManagementClient(broker) as mgmt:
                mgmt.request("DELETE", f"/user-limits/{user}/max-channels")
            resumed = await asyncio.to_thread(cli_subprocess, broker, "resume", "work")
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            # before: exit 3 at once, "the broker closed a connection of this worker for what it sent (NOT_ALLOWED
            # ... user limit of (0)), again 0s later": the close and aio-pika's reconnect a few ms after it
            code = await _runs_again(app, record, log, proc, deadline + 30)
    await app.close()
    out = log.read_text()
    assert code == 0, out[-3000:]


async def test_a_childs_start_a_users_max_channels_refuses_at_a_rate_limits_step_is_a_broker_error_with_its_fix(
    broker: BrokerSettings, tmp_path: Path
):
    """A rate-limited job's queues are declared on channels of their own: a limit of 4 refuses one there. A child
    says it as one process does (``broker error: ...; fix: ...``, exit 3), never a client library's traceback."""
    topo, log = tmp_path / "topology.toml", tmp_path / "worker.log"
    write_file(topo, work_topology())
    await apply_topology(topo, broker)
    with limited_user(broker, limits={"max-channels": 4}) as (_, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
               "RATEAPP_TOPOLOGY": str(topo), "RATEAPP_RECORD": str(tmp_path / "record.txt")}  # fmt: skip
        with consume_subprocess("tests.integration.rateapp:app", env, ("--processes", "2"), log) as proc:
            code = await asyncio.to_thread(proc.wait, 90)
    out = log.read_text()
    last = out.strip().splitlines()[-1]
    # before: each child's exit printed aiormq's traceback ('aiormq.exceptions.ConnectionNotAllowed: NOT_ALLOWED
    # ...'), exit 2: "error: worker child 2 exited before it was ready 5 times within 60s; every child was stopped.
    # Its error: no error message (see its log lines above)"
    assert "Traceback" not in out, out[-3000:]
    assert code == 3, out[-3000:]
    assert last.startswith("broker error: worker child "), last
    assert re.search(r"has reached the maximum allowed user limit of \(?4\)?", last), last  # 4.x: no ()
    assert "; fix: raise or clear the user's max-channels limit (rabbitmqctl set_user_limits" in last, last


async def test_children_a_users_max_connections_refuses_at_run_time_name_the_limit_and_its_fix(
    broker: BrokerSettings, tmp_path: Path
):
    """A user's ``max-connections`` set while two children consume, their connections then lost: every reconnect
    is refused ``connection.open`` (530). The children go on trying (a limit may be lifted, or others' connections
    go), and say which limit refuses them and how to raise it, asked of the management API as at a start."""
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker, tags="monitoring") as (user, url):  # a monitoring user may read its limits (README)
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        args = ("--processes", "2", "--grace", "5s")
        with consume_subprocess("tests.integration.procapp:app", env, args, log, terminate=True) as proc:
            deadline = time.monotonic() + 40
            await _until_logged(log, proc, "child 2 ready", deadline, 0.2)
            await _until_logged(log, proc, "child 1 ready", deadline, 0.2)
            with ManagementClient(broker) as mgmt:
                mgmt.request("PUT", f"/user-limits/{user}/max-connections", {"value": 2})
            while await asyncio.to_thread(close_connections, broker, None, user) < 3:
                await asyncio.sleep(0.3)
            # before: only "could not reach ... (the broker refused connection.open (530 NOT_ALLOWED: the vhost is
            # gone, the user has no access to it, or a max-connections limit is reached, ...))" every 5 s, no fix
            await _until_logged(log, proc, "allows at most 2 connection(s) (max-connections): raise it", deadline, 0.3)
            with ManagementClient(broker) as mgmt:
                mgmt.request("DELETE", f"/user-limits/{user}/max-connections")
            code = await _runs_again(app, record, log, proc, deadline + 40)
    await app.close()
    out = log.read_text()
    said = [line for line in out.splitlines() if "allows at most 2 connection(s)" in line]
    assert f"rabbitmqctl set_user_limits {user} " in said[0], said[0]
    assert "lim-secret" not in out, "a password in the log"
    assert code == 0, out[-3000:]
