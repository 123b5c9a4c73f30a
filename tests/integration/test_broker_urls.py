"""Several broker URLs against a real broker: a dead node in the list is skipped, every URL is redacted."""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs import App
from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import ROOT, depth
from tests.integration.worker_env import APPLIED_TOPOLOGY, FAST_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def closed_port() -> int:
    """A loopback port nothing listens on (nor on port + 10000: the derived management API)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port + 10000)) != 0:
                    return port


def dead_and_live(broker: BrokerSettings) -> tuple[str, str]:
    """A URL of a node that isn't there (same credentials and vhost), and the test broker's URL."""
    live = urlsplit(broker.nodes[0])
    dead = live._replace(netloc=f"{live.username}:{live.password}@127.0.0.1:{closed_port()}")
    return urlunsplit(dead), broker.nodes[0]


async def test_a_dead_node_in_the_list_is_skipped_whatever_the_shuffled_order(broker: BrokerSettings, tmp_path: Path):
    dead, live = dead_and_live(broker)
    listed = broker_settings(f"{dead},{live}", broker.management_url)
    for _ in range(6):  # 6 shuffles: both orders, but for a chance of 1/32
        connection = await connect(listed, wait=5, name="listed")
        assert isinstance(connection, ClusterConnection)
        assert connection.node.url == live
        await connection.close()
    applied = await make_app(broker, tmp_path)  # the topology, applied to the test vhost
    app = App("test", topology=applied.topology(), url=listed.url)
    app.job("echo", queue="work")(lambda p, c: None)
    await app.enqueue("echo", {}, job_id="via-list")
    await app.close()
    assert await depth(broker, "work") == 1


def test_the_management_client_moves_to_a_node_that_answers(broker: BrokerSettings):
    dead, live = dead_and_live(broker)
    listed = broker_settings(f"{dead},{live}")
    assert len(listed.management_urls) == 2
    with ManagementClient(listed) as mgmt:
        assert mgmt.queue(broker.vhost, "nothing-here") is None
        assert mgmt.base_url == listed.management_urls[1]


def run(args: list[str], url: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMQPJOBS_")} | extra
    if url is not None:
        env["AMQPJOBS_URL"] = url
    exe = Path(sys.executable).with_name("amqpjobs")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def test_the_cli_takes_the_url_repeated_or_a_list_and_never_prints_a_password(broker: BrokerSettings, tmp_path: Path):
    dead, live = dead_and_live(broker)
    topo = tmp_path / "t.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    repeated = run(["topology", "plan", str(topo), "--url", dead, "--url", live])
    assert repeated.returncode == 0, repeated.stderr
    dead_port, live_port = urlsplit(dead).port, urlsplit(live).port
    vhost = urlsplit(live).path
    assert f"broker amqp://guest:***@127.0.0.1:{dead_port}{vhost},amqp://guest:***@127.0.0.1:{live_port}{vhost}" in (
        repeated.stdout
    )
    listed = run(["topology", "plan", str(topo)], url=f"{live}, {dead}")
    assert listed.returncode == 0, listed.stderr
    other_vhost = urlunsplit(urlsplit(dead)._replace(path="/elsewhere"))
    refused = run(["topology", "plan", str(topo)], url=f"{live},{other_vhost}")
    assert refused.returncode == 2
    assert "broker URL 2 (amqp://guest:***@127.0.0.1:" in refused.stderr
    assert f"names vhost 'elsewhere' but broker URL 1 names '{broker.vhost}'" in refused.stderr
    for out in (repeated, listed, refused):
        assert "guest:guest" not in out.stdout + out.stderr


@pytest.mark.serial  # wall-clock bound: CPU contention from parallel tests would break it (< 8 s)
def test_connect_timeout_covers_every_node_with_one_line_per_node_naming_it(tmp_path: Path):
    """Issue 21's --connect-timeout over issue 23's list: each attempt one node, its line naming it, redacted."""
    ports = [closed_port(), closed_port()]
    url = ",".join(f"amqp://guest:s3cret@127.0.0.1:{port}/jobs" for port in ports)
    topo = tmp_path / "t.toml"
    topo.write_text(FAST_TOPOLOGY)
    consume = ["consume", "tests.integration.procapp:app"]
    started = time.monotonic()
    out = run([*consume, "--connect-timeout", "1s"], url=url, PROCAPP_TOPOLOGY=str(topo))
    took = time.monotonic() - started
    assert out.returncode == 3, out.stderr
    lines = out.stderr.strip().splitlines()
    attempts = [line for line in lines if "not reachable (attempt" in line]
    assert lines == [*attempts, lines[-1]], out.stderr  # only our lines, then the error
    assert len(attempts) == 2, out.stderr  # each node's first failure; the next rounds' paced (one a minute)
    named = [
        re.search(r"broker at amqp://guest:\*\*\*@127\.0\.0\.1:(\d+)/jobs not reachable", line) for line in attempts
    ]
    assert all(named), attempts
    tried = [int(m.group(1)) for m in named if m]
    assert set(tried[:2]) == set(ports)  # the first round tries each node once, in a shuffled order
    assert all(a != b for a, b in itertools.pairwise(tried))  # then the next node, in turn
    assert f"trying amqp://guest:***@127.0.0.1:{tried[1]}/jobs in 0.0s" in attempts[0]
    assert "unreachable after 1s (each node tried; the last, amqp://guest:***@127.0.0.1:" in lines[-1]
    assert "s3cret" not in out.stdout + out.stderr
    assert "aiormq" not in out.stderr
    assert 1 <= took < 8, took


async def test_a_zero_connect_timeout_still_tries_every_node_once(caplog: pytest.LogCaptureFixture):
    ports = [closed_port(), closed_port()]
    listed = broker_settings(",".join(f"amqp://guest:s3cret@127.0.0.1:{port}/jobs" for port in ports))
    caplog.set_level(logging.WARNING, "amqpjobs.wire")
    with pytest.raises(BrokerUnavailableError, match=r"unreachable after 0s \(each node tried; the last, "):
        await connect(listed, wait=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.wire"]
    assert len(lines) == 1, lines  # the first node's line; the second's failure is the error
    assert "(attempt 1, " in lines[0]


def test_a_derived_management_url_per_node_says_so_naming_each_node(tmp_path: Path):
    ports = [closed_port(), closed_port()]
    listed = broker_settings(",".join(f"amqp://guest:s3cret@127.0.0.1:{port}/jobs" for port in ports))
    with ManagementClient(listed, timeout=2) as mgmt, pytest.raises(BrokerUnavailableError) as caught:
        mgmt.overview()
    message = str(caught.value)
    assert message.startswith(
        "management API unreachable on each of 2 nodes (derived from each node's AMQP URL: its host, port + 10000; "
        "give the right one with --management-url or $AMQPJOBS_MANAGEMENT_URL): "
    ), message
    for port in ports:
        assert f"http://127.0.0.1:{port + 10000}: ConnectError" in message
    given = broker_settings(listed.url, f"http://127.0.0.1:{ports[0] + 10000}")
    with ManagementClient(given, timeout=2) as mgmt, pytest.raises(BrokerUnavailableError) as caught:
        mgmt.overview()
    assert str(caught.value).startswith(f"management API at http://127.0.0.1:{ports[0] + 10000} unreachable: ")


@pytest.mark.parametrize("nodes", [1, 2])
async def test_a_first_connect_retried_says_each_node_once_at_once_then_paced_as_a_reconnect(
    caplog: pytest.LogCaptureFixture, nodes: int
) -> None:
    """Before: one WARNING per attempt up to the connect timeout (0.2 s doubling to 2 s between rounds: 5 lines in
    4 s for one node, 30-odd in a worker's 30 s), where a reconnect says its first failure at once, then a line a
    minute at most (DOWN_EVERY). Now the first connect follows the reconnect's rule, per node."""
    caplog.set_level(logging.INFO, "amqpjobs.wire")
    ports = [closed_port() for _ in range(nodes)]
    settings = broker_settings(",".join(f"amqp://guest:s3cret@127.0.0.1:{port}/jobs" for port in ports))
    with pytest.raises(BrokerUnavailableError, match=r"unreachable after 4s"):
        await connect(settings, wait=4.0)
    lines = [r.getMessage() for r in caplog.records if "not reachable (attempt" in r.getMessage()]
    assert len(lines) == nodes, lines
    said = sorted(int(m.group(1)) for line in lines if (m := re.search(r"127\.0\.0\.1:(\d+)/jobs not reach", line)))
    assert said == sorted(ports), lines
    for line in lines:
        assert line.endswith(" (said again in 60s while it lasts)"), line
        assert "s3cret" not in line
