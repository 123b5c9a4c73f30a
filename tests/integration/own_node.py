"""A dedicated local RabbitMQ node for one test module: a scripts/broker.sh node of its own.

For what the shared test broker can't serve: listeners that need files at boot (TLS) or
node-wide changes (resource alarms). The node has its own name, free loopback ports and
data dir under the test's tmp folder, is never Docker, and is stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT
from tests.integration.test_chaos import cluster_unavailable

BROKER = ("bash", str(ROOT / "scripts" / "broker.sh"))


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports, each free together with port + 10000 (the derived management port)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 < 65536 and port not in ports:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port + 10000)) != 0:
                    ports.append(port)
    return ports


@dataclass(frozen=True)
class OwnNode:
    """A running dedicated node: AMQP on ``port``, management on ``port + 10000``; ``env`` for broker.sh."""

    port: int
    env: dict[str, str]

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl ARGS`` against the node; its output."""
        out = subprocess.run([*BROKER, "ctl", *args], env=self.env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)} failed: {out.stderr[-2000:]}")
        return out.stdout


@contextmanager
def own_node(folder: Path, what: str, extra_conf: str = "", ports: tuple[int, int] | None = None) -> Iterator[OwnNode]:
    """Start a node of its own in ``folder`` (``extra_conf``: rabbitmq.conf lines), stop it at the end.

    ``ports``: its AMQP and Erlang distribution ports (free ones are picked otherwise). Skips where Debian's
    rabbitmq-server can't run (see :func:`~tests.integration.test_chaos.cluster_unavailable`).
    """
    reason = cluster_unavailable()
    if reason is not None:
        pytest.skip(reason.replace("scripts/cluster.sh", f"the {what} node (scripts/broker.sh)"))
    amqp_port, dist_port = ports or free_ports(2)
    (folder / "extra.conf").write_text(extra_conf)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMQPJOBS_", "RABBITMQ_"))}
    env.update(
        AMQPJOBS_BROKER_DIR=str(folder / "node"),
        AMQPJOBS_BROKER_NODE=f"amqpjobs-{what}-{uuid.uuid4().hex[:6]}@localhost",
        AMQPJOBS_BROKER_PORT=str(amqp_port),
        AMQPJOBS_BROKER_MGMT_PORT=str(amqp_port + 10000),
        AMQPJOBS_BROKER_DIST_PORT=str(dist_port),
        AMQPJOBS_BROKER_EXTRA_CONF=str(folder / "extra.conf"),
    )
    (folder / "node").mkdir()
    (folder / "node" / "mode").write_text("local\n")  # never Docker: the node needs our files
    up = subprocess.run([*BROKER, "up"], env=env, capture_output=True, text=True, timeout=300)
    try:
        if up.returncode != 0:
            pytest.fail(f"the {what} node did not start:\n{up.stderr[-3000:]}")
        yield OwnNode(amqp_port, env)
    finally:
        kill_node(folder / "node")
        subprocess.run([*BROKER, "down"], env=env, capture_output=True, timeout=300)  # epmd, pid files


def kill_node(node_dir: Path) -> None:
    """SIGKILL the throwaway node whose broker.sh directory is ``node_dir`` (its pid files), and wait until gone.

    Its data is thrown away, so no graceful stop: ``rabbitmqctl stop`` took 15-18 s per node under CI load.
    """
    pids = []
    for name in ("rabbitmq.pid", "launcher.pid"):
        text = (node_dir / name).read_text().strip() if (node_dir / name).exists() else ""
        if text.isdigit():
            pids.append(int(text))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
