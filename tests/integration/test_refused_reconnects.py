"""A worker whose reconnect the broker refuses at ``connection.open`` (a user's ``max-connections``) (README "Workers").

One rule with the hard closes (:mod:`amqpjobs.runtime.hard_closes`): a connection the worker needs (consuming,
publishing) refused again at its next reconnect stops it (exit 3) naming the limit and its fix; its outcome
events connection (events are best effort: no job waits for them) is said once, with the limit and the fix,
and the worker goes on. Measured before, on 3.10: either connection refused so logged two WARNING lines every
5 s for ever ("lost ..." and "could not reach ... (the broker refused connection.open (530 NOT_ALLOWED: the
vhost is gone, the user has no access to it, or a max-connections limit is reached ...))"); with the consuming
one refused the worker consumed nothing, for ever, without stopping.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, write_file
from tests.integration.test_channel_limits import _close_named
from tests.integration.test_processes_refused import _runs_again, _until_logged, limited_user
from tests.integration.test_worker_process import publisher
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def _limit_then_close(broker: BrokerSettings, user: str, name: str) -> None:
    """Set ``user``'s max-connections to one fewer than it holds (all of the worker's listed), then close ``name``.

    ``user`` gets the ``monitoring`` tag first: the management API then tells it its limits (the worker asks).
    """
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/users/{user}", {"password": "lim", "tags": "monitoring"})
    deadline, mine = time.monotonic() + 30, list[dict[str, object]]()
    while len(mine) < 3:  # the management API lists a new connection within a statistics interval
        assert time.monotonic() < deadline, mine
        await asyncio.sleep(0.3)
        with ManagementClient(broker) as mgmt:
            listed = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
        mine = [c for c in listed if c.get("user") == user]
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/user-limits/{user}/max-connections", {"value": len(mine) - 1})
    assert await asyncio.to_thread(_close_named, broker, name) == 1


async def test_the_events_connection_refused_at_each_reconnect_is_said_once_with_the_limit_and_jobs_run_on(
    broker: BrokerSettings, tmp_path: Path
):
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as url:
        user = str(urlsplit(url).username)
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            deadline = time.monotonic() + 40
            await _until_logged(log, proc, "worker consuming", deadline, 0.2)
            await _limit_then_close(broker, user, "procapp-worker-events")
            await asyncio.sleep(17)  # three more reconnect rounds (5 s apart)
            code = await _runs_again(app, record, log, proc, deadline + 30)  # jobs run on
    await app.close()
    out = log.read_text()
    said = [line for line in out.splitlines() if "outcome events are off" in line]
    refusals = [line for line in out.splitlines() if "refused connection.open" in line]
    assert code == 0, out[-3000:]
    assert len(said) == 1, out[-3000:]  # once (again after 60 s while it lasts), not every 5 s
    assert f"user '{user}' allows at most 2 connection(s) (max-connections): raise it" in said[0], said
    assert f"rabbitmqctl set_user_limits {user}" in said[0], said
    assert "jobs run as usual" in said[0], said
    assert len(refusals) <= 1, refusals  # before: 2 lines every 5 s ('lost ...', 'could not reach ...')


async def test_the_consuming_connection_refused_again_at_its_next_reconnect_stops_the_worker_naming_the_limit(
    broker: BrokerSettings, tmp_path: Path
):
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker) as url:
        user = str(urlsplit(url).username)
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            await _until_logged(log, proc, "worker consuming", time.monotonic() + 40, 0.2)
            await _limit_then_close(broker, user, "procapp-worker")
            cut_at = time.monotonic()
            while proc.poll() is None and time.monotonic() - cut_at < 30:
                await asyncio.sleep(0.3)
            code, took = proc.poll(), time.monotonic() - cut_at
    out = log.read_text()
    last = out.strip().splitlines()[-1]
    # before: still running 30 s later (None), consuming nothing, two WARNING lines every 5 s
    assert code == 3, (code, out[-3000:])
    assert took < 20, took  # measured: the second refusal 5 s after the first, then the drain
    assert last.startswith("broker error: the broker refused the reconnect of connection procapp-worker"), last
    assert f"user '{user}' allows at most 2 connection(s) (max-connections): raise it" in last, last
    assert "again 5s later" in last, last
