"""A worker whose reconnect the broker refuses at ``connection.open`` (a ``max-connections``) (README "Workers").

Not a hard close (:mod:`amqpjobs.runtime.hard_closes`): a connection limit passes when other connections go,
so a refused connection tries again every 5 s and says once a minute which limit holds and its fix (the
management API asked, as at a start); lifted, the worker consumes again. Its outcome events connection (events
are best effort: no job waits for them) says that its events are dropped meanwhile. Measured before, on 3.10:
either connection refused so logged two WARNING lines every 5 s for ever ("lost ..." and "could not reach ...
(the broker refused connection.open (530 NOT_ALLOWED: the vhost is gone, the user has no access to it, or a
max-connections limit is reached ...))"); with the consuming one refused the worker consumed nothing, for ever.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import close_connections, consume_subprocess, limited_user, write_file
from tests.integration.test_processes_refused import _runs_again, _until_logged
from tests.integration.test_worker_process import publisher
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def _limit_path(broker: BrokerSettings, user: str, whose: str) -> str:
    """The management API's path of ``user``'s (``whose`` "user") or the test vhost's ("vhost") max-connections."""
    owner = f"user-limits/{user}" if whose == "user" else f"vhost-limits/{quote(broker.vhost, safe='')}"
    return f"/{owner}/max-connections"


async def _limit_then_close(broker: BrokerSettings, user: str, name: str, whose: str) -> None:
    """Set ``user``'s (``whose`` "user") or the vhost's ("vhost") max-connections to one fewer than it holds (all of
    the worker's listed), then close ``name``.

    ``user`` has the ``monitoring`` tag: the management API tells it its limits and its vhost's (the worker asks).
    """
    deadline, mine, listed = time.monotonic() + 30, list[dict[str, object]](), list[dict[str, object]]()
    vhost = quote(broker.vhost, safe="")
    while len(mine) < 3:  # the management API lists a new connection within a statistics interval
        assert time.monotonic() < deadline, mine
        await asyncio.sleep(0.3)
        with ManagementClient(broker) as mgmt:
            listed = mgmt.request("GET", f"/vhosts/{vhost}/connections") or []
        mine = [c for c in listed if c.get("user") == user]
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", _limit_path(broker, user, whose), {"value": len(mine if whose == "user" else listed) - 1})
    assert await asyncio.to_thread(close_connections, broker, name) == 1


async def _refused_run(
    broker: BrokerSettings, tmp_path: Path, name: str, lift: bool, whose: str = "user"
) -> tuple[str, str, int | None, int]:
    """A worker whose connection ``name`` is refused at each reconnect for 17 s (three rounds), the limit then
    lifted when ``lift``; a job after it, then SIGTERM: (the user, the worker's log, its exit code at 17 s
    (None: running), its exit code at the end)."""
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker, tags="monitoring") as (user, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            await _until_logged(log, proc, "worker consuming", time.monotonic() + 40, 0.2)
            try:
                await _limit_then_close(broker, user, name, whose)
                await asyncio.sleep(17)  # three more reconnect rounds (5 s apart), all refused
                running = proc.poll()
                if lift:  # the next reconnect goes through
                    with ManagementClient(broker) as mgmt:
                        mgmt.request("DELETE", _limit_path(broker, user, whose))
                code = await _runs_again(app, record, log, proc, time.monotonic() + 40)
            finally:  # a vhost's limit would outlive the test (a user's goes with the user)
                with ManagementClient(broker) as mgmt:
                    mgmt.request("DELETE", _limit_path(broker, user, whose), allow_404=True)
    await app.close()
    return user, log.read_text(), running, code


async def test_the_events_connection_refused_at_each_reconnect_is_said_once_with_the_limit_and_jobs_run_on(
    broker: BrokerSettings, tmp_path: Path
):
    user, out, running, code = await _refused_run(broker, tmp_path, "procapp-worker-events", lift=False)
    said = [line for line in out.splitlines() if "outcome events are off" in line]
    refusals = [line for line in out.splitlines() if "refused connection.open" in line]
    assert running is None, out[-3000:]
    assert code == 0, out[-3000:]  # jobs run on, the limit still in place
    assert len(said) == 1, out[-3000:]  # once (again after 60 s while it lasts), not every 5 s
    assert f"user '{user}' allows at most 2 connection(s) (max-connections): raise it" in said[0], said
    assert f"rabbitmqctl set_user_limits {user}" in said[0], said
    assert "jobs run as usual" in said[0], said
    assert len(refusals) <= 1, refusals  # before: 2 lines every 5 s ('lost ...', 'could not reach ...')


async def test_the_consuming_connection_refused_at_each_reconnect_names_the_limit_once_and_consumes_once_lifted(
    broker: BrokerSettings, tmp_path: Path
):
    user, out, running, code = await _refused_run(broker, tmp_path, "procapp-worker", lift=True)
    said = [line for line in out.splitlines() if "connection procapp-worker: the broker refuses its reconnect" in line]
    assert running is None, out[-3000:]  # a refusal that may pass stops nothing
    assert code == 0, out[-3000:]  # consumed again once lifted: the job after it ran, then SIGTERM
    assert len(said) == 1, out[-3000:]  # once a minute, not every 5 s
    assert f"user '{user}' allows at most 2 connection(s) (max-connections): raise it" in said[0], said
    assert f"rabbitmqctl set_user_limits {user}" in said[0], said
    assert "refused connection.open" not in out, out[-3000:]  # the general words, every 5 s before


async def test_the_vhosts_max_connections_refusing_a_reconnect_is_said_as_the_vhosts_with_its_own_fix(
    broker: BrokerSettings, tmp_path: Path
):
    """The vhost's limit, not the user's, is named, with a fix naming the vhost, as a user's limit's names the user."""
    user, out, running, code = await _refused_run(broker, tmp_path, "procapp-worker", lift=True, whose="vhost")
    said = [line for line in out.splitlines() if "connection procapp-worker: the broker refuses its reconnect" in line]
    assert running is None, out[-3000:]
    assert code == 0, out[-3000:]  # consumed again once lifted
    assert len(said) == 1, out[-3000:]
    assert f"vhost {broker.vhost!r} allows at most" in said[0], said
    assert "(max-connections): raise it" in said[0], said
    assert f"user {user!r}" not in said[0].split("refuses its reconnect")[1].split(";")[0], said
    assert f"rabbitmqctl set_vhost_limits -p {shlex.quote(broker.vhost)} '{{\"max-connections\": N}}'" in said[0], said
