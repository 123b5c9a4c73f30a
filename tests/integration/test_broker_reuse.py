"""``scripts/broker.sh`` in a second checkout while another checkout's node runs on the same ports.

A new user's ``make demo`` in a second clone: the node of the first clone (``amqpjobs@localhost``
on 5682/15682) already answers with guest/guest. ``up`` uses it and says so in one line;
``down`` leaves it alone (this checkout did not start it). The second checkout is a fresh
``AMQPJOBS_BROKER_DIR``; the shared node is only read (its overview), never stopped or restarted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
import uuid
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import ROOT
from tests.integration.own_node import BROKER, free_ports

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

PORT, MGMT_PORT = 5682, 15682  # scripts/broker.sh's defaults: where the first checkout's node runs


def overview(mgmt_port: int = MGMT_PORT) -> dict[str, Any] | None:
    request = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}/api/overview")
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            doc: dict[str, Any] = json.load(answer)
            return doc
    except OSError:
        return None


def node_pid(node: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{MGMT_PORT}/api/nodes/{node}")
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        return int(json.load(answer)["os_pid"])


def second_checkout(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh clone's broker.sh: its own .broker folder, every default left as is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMQPJOBS_", "RABBITMQ_"))}
    env["AMQPJOBS_BROKER_DIR"] = str(tmp_path / "broker")
    env.update(extra)
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "mode").write_text("local\n")  # never Docker, as on this machine
    return env


def broker_sh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BROKER, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def first_node() -> dict[str, Any]:
    doc = overview()
    listeners = (doc or {}).get("listeners", [])
    if not any(one["protocol"] == "amqp" and one["port"] == PORT for one in listeners):
        pytest.skip(f"no RabbitMQ node answers with guest/guest on 127.0.0.1:{MGMT_PORT} with AMQP on {PORT}")
    assert doc is not None
    return doc


def test_a_second_checkout_uses_the_node_already_running_and_never_stops_it(
    tmp_path: Path, first_node: dict[str, Any]
) -> None:
    node, version = first_node["node"], first_node["rabbitmq_version"]
    pid = node_pid(node)
    env = second_checkout(tmp_path)

    up = broker_sh(env, "up")
    assert up.returncode == 0, up.stderr
    assert up.stdout == f"amqp://guest:***@127.0.0.1:{PORT}/\nhttp://127.0.0.1:{MGMT_PORT}/\n"
    assert up.stderr == (
        f"broker: using the RabbitMQ node already running on 127.0.0.1:{PORT} ({node}, RabbitMQ {version}); "
        "this checkout did not start it, so `make broker-down` leaves it alone\n"
    )
    assert broker_sh(env, "url").stdout == f"amqp://guest:guest@127.0.0.1:{PORT}/\nhttp://127.0.0.1:{MGMT_PORT}/\n"
    status = broker_sh(env, "status")
    assert (status.returncode, status.stdout) == (
        0,
        f"up (RabbitMQ node {node} on 127.0.0.1:{PORT}, not started by this checkout, RabbitMQ {version})\n",
    )
    again = broker_sh(env, "up")  # twice is harmless
    assert (again.returncode, again.stderr) == (0, up.stderr)

    ctl = broker_sh(env, "ctl", "list_queues")
    assert ctl.returncode == 1
    assert ctl.stderr.startswith(f"broker: error: node {node} was not started by this checkout")

    down = broker_sh(env, "down")
    assert down.returncode == 0, down.stderr
    assert down.stderr == (
        f"broker: leaving node {node} running: this checkout did not start it "
        f"(it was already answering on 127.0.0.1:{PORT})\n"
    )
    assert node_pid(node) == pid  # the same OS process: neither stopped nor restarted
    assert broker_sh(env, "status").stdout == "down\n"  # this checkout has no broker any more


def test_a_port_held_by_something_else_is_still_refused(tmp_path: Path) -> None:
    """Not a RabbitMQ answering with guest/guest: nothing to use, nothing started; the message says what to set."""
    amqp_port, dist_port = free_ports(2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", amqp_port))
        listener.listen()
        env = second_checkout(
            tmp_path,
            AMQPJOBS_BROKER_PORT=str(amqp_port),
            AMQPJOBS_BROKER_MGMT_PORT=str(amqp_port + 10000),
            AMQPJOBS_BROKER_DIST_PORT=str(dist_port),
            AMQPJOBS_BROKER_NODE=f"amqpjobs-busy-{uuid.uuid4().hex[:6]}",
        )
        up = broker_sh(env, "up")
    assert up.returncode == 1
    assert up.stdout == ""
    assert f"port 127.0.0.1:{amqp_port} is already in use by another process" in up.stderr
    assert "AMQPJOBS_BROKER_PORT" in up.stderr
    assert not (tmp_path / "broker" / "launcher.pid").exists()  # no node was started


def test_the_4x_script_uses_a_node_already_answering_without_building_and_never_stops_it(
    tmp_path: Path, first_node: dict[str, Any]
) -> None:
    """scripts/broker4.sh (and broker43.sh) in a second clone: no chroot build, no node started, none stopped.

    The script runs from a copy (its folder is <copy>/.broker4); the node already answering is the
    3.10 node on its ports. debootstrap, chroot, mount and epmd are stubs that record any call.
    """
    node, version = first_node["node"], first_node["rabbitmq_version"]
    pid = node_pid(node)
    (tmp_path / "scripts").mkdir()
    for name in ("broker4.sh", "broker43.sh", "other-node.sh"):
        source = ROOT / "scripts" / name
        if source.exists():
            (tmp_path / "scripts" / name).write_text(source.read_text())
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls"
    for tool in ("debootstrap", "chroot", "mount", "umount", "mountpoint", "epmd", "apt-get"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>{calls}\nexit 1\n')
        (stubs / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMQPJOBS_", "RABBITMQ_"))}
    env.update(
        PATH=f"{stubs}:{env['PATH']}", AMQPJOBS_BROKER4_PORT=str(PORT), AMQPJOBS_BROKER4_MGMT_PORT=str(MGMT_PORT)
    )
    script = ("bash", str(tmp_path / "scripts" / "broker4.sh"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, *args], env=env, capture_output=True, text=True, timeout=60)

    up = run("up")
    assert (up.returncode, up.stdout) == (0, f"amqp://guest:***@127.0.0.1:{PORT}/\nhttp://127.0.0.1:{MGMT_PORT}/\n"), (
        up.stderr
    )
    assert up.stderr == (
        f"broker4: using the RabbitMQ node already running on 127.0.0.1:{PORT} ({node}, RabbitMQ {version}); "
        "this checkout did not start it, so `scripts/broker4.sh down` leaves it alone\n"
    )
    status = run("status")
    assert (status.returncode, status.stdout) == (
        0,
        f"up (RabbitMQ node {node} on 127.0.0.1:{PORT}, not started by this checkout, RabbitMQ {version})\n",
    )
    assert run("ctl", "list_queues").stderr.startswith(f"broker4: error: node {node} was not started by this checkout")
    down = run("down")
    assert (down.returncode, down.stderr) == (
        0,
        f"broker4: leaving node {node} running: this checkout did not start it "
        f"(it was already answering on 127.0.0.1:{PORT})\n",
    )
    assert not calls.exists(), calls.read_text()  # nothing built, started, mounted or killed
    assert node_pid(node) == pid
