"""A connect the broker refuses at ``connection.open`` names which of its three reasons holds (README "Workers").

Before, a worker on a vhost whose ``max-connections`` its connections reach exited 3 with ``refused
the connection: vhost '...' does not exist or user 'guest' has no access to it (or the vhost's connection
limit is reached)``: three causes, no fix. The management API tells them apart.
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
from tests.integration.helpers import consume_subprocess, limited_user, raw_channel, write_file
from tests.integration.test_worker_process import exit_code, publisher
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = pytest.mark.broker


async def _worker_run(broker: BrokerSettings, tmp_path: Path, url: str) -> tuple[int, str, float]:
    """procapp's worker started on AMQP ``url`` (the work queue applied first): its exit code (it must end
    within 40 s), its log, and the seconds it ran."""
    topo, log = tmp_path / "proc.toml", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
           "PROCAPP_RECORD": str(tmp_path / "record.txt")}  # fmt: skip
    began = time.monotonic()
    with consume_subprocess("tests.integration.procapp:app", env, (), log) as proc:
        code = await exit_code(proc, 40)
    return code, log.read_text(), time.monotonic() - began


async def _run_past_the_vhosts_limit(broker: BrokerSettings, tmp_path: Path, url: str) -> tuple[int, str, float]:
    """:func:`_worker_run` with the test vhost's max-connections 1 (lifted after)."""
    path = f"/vhost-limits/{quote(broker.vhost, safe='')}/max-connections"
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", path, {"value": 1})
    try:
        return await _worker_run(broker, tmp_path, url)
    finally:
        with ManagementClient(broker) as mgmt:
            mgmt.request("DELETE", path, allow_404=True)


async def test_a_worker_past_its_vhosts_max_connections_names_the_limit_and_its_fix(
    broker: BrokerSettings, tmp_path: Path
):
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    code, out, took = await _run_past_the_vhosts_limit(broker, tmp_path, broker.url)
    assert code == 3, out
    last = out.strip().splitlines()[-1]
    # before: "... refused the connection: vhost '...' does not exist or user 'guest' has no access to it (or the
    # vhost's connection limit is reached)"
    assert f"refused the connection: vhost {broker.vhost!r} allows at most 1 connection(s) (max-connections)" in last
    # before: "(rabbitmqctl set_vhost_limits -p VHOST ...)", where a user's limit's fix names the user
    assert f"(rabbitmqctl set_vhost_limits -p {shlex.quote(broker.vhost)} '{{\"max-connections\": N}}')" in last, out
    assert "user 'guest'" not in last, out
    assert took < 20, (took, out)


async def test_a_worker_of_a_user_without_permissions_on_the_vhost_names_the_fix_with_both(
    broker: BrokerSettings, tmp_path: Path
):
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    with limited_user(broker, "administrator") as (user, url):  # the API tells an administrator whose the fault is
        with ManagementClient(broker) as mgmt:
            mgmt.request("DELETE", f"/permissions/{quote(broker.vhost, safe='')}/{user}")
        code, out, _ = await _worker_run(broker, tmp_path, url)
    assert code == 3, out
    last = out.strip().splitlines()[-1]
    assert f"user {user!r} has no permissions on vhost {broker.vhost!r}: give them" in last, out
    # before: "(rabbitmqctl set_permissions -p VHOST USER '.*' '.*' '.*')"
    assert f"(rabbitmqctl set_permissions -p {shlex.quote(broker.vhost)} {user} '.*' '.*' '.*')" in last, out


@pytest.mark.parametrize("tags", ["", "monitoring"])
async def test_a_worker_past_its_users_max_connections_names_the_users_limit(
    broker: BrokerSettings, tmp_path: Path, tags: str
):
    """A user's own max-connections: named with its fix by a monitoring user, among the causes by one without tags.

    Before: both read `refused the connection: vhost '...' does not exist or user 'lim-...' has no access to it (or
    the vhost's connection limit is reached)`: the vhost exists, the user has access, and the limit reached is
    the user's, named nowhere (the API's checks of the vhost and the permissions need an administrator).
    """
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    with limited_user(broker, tags, {"max-connections": 1}) as (user, url):
        code, out, _ = await _worker_run(broker, tmp_path, url)
    assert code == 3, out
    last = out.strip().splitlines()[-1]
    if tags:
        assert f"refused the connection: user {user!r} allows at most 1 connection(s) (max-connections)" in last, out
    else:
        assert "or a max-connections limit is reached, the vhost's or the user's" in last, out
    assert f"set_user_limits {user} '{{\"max-connections\": N}}'" in last, out
    assert "lim-secret" not in out, out


async def test_of_a_vhosts_and_a_users_limit_only_the_one_reached_is_named(broker: BrokerSettings, tmp_path: Path):
    """The vhost's max-connections 1 is held by another connection; the user's own limit (50) is far off.

    Before, both were named, each with "raise it": `vhost '...' allows at most 1 connection(s) (max-connections):
    raise it (...) and user 'lim-...' allows at most 50 connection(s) (max-connections): raise it (...)`.
    """
    await (await publisher(broker, tmp_path)).close()  # applies the work queue
    with limited_user(broker, "monitoring", {"max-connections": 50}) as (user, url):
        async with raw_channel(broker):  # guest's connection holds the vhost's one
            deadline = time.monotonic() + 30
            while not await asyncio.to_thread(_listed, broker):  # the API lists it within a statistics interval
                assert time.monotonic() < deadline
                await asyncio.sleep(0.3)
            code, out, _ = await _run_past_the_vhosts_limit(broker, tmp_path, url)
    assert code == 3, out
    last = out.strip().splitlines()[-1]
    assert f"refused the connection: vhost {broker.vhost!r} allows at most 1 connection(s) (max-connections)" in last
    assert f"user {user!r} allows at most" not in last, last
    assert "set_user_limits" not in last, last


def _listed(broker: BrokerSettings) -> bool:
    """Whether the management API lists a connection in the test vhost."""
    with ManagementClient(broker) as mgmt:
        return bool(mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections"))
