"""scripts/broker.sh's own decisions that need no broker: whether a pid is this checkout's node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.version_independent,
    pytest.mark.skipif(sys.platform != "linux", reason="scripts/broker.sh reads /proc"),
]


def test_a_node_with_a_large_environment_is_still_seen_as_running(tmp_path: Path):
    """``node_alive`` read the node's ``/proc/PID/environ`` through ``tr | grep -q`` under ``pipefail``: once grep
    had found the node's data dir and exited, tr's next write got SIGPIPE and the pipe failed, so a node whose
    environment is longer than one write of tr's was now and then taken for dead (CI: "node ... exited during
    startup" 190 ms after its "Server startup complete", and broker.sh stopped it). A stand-in process whose
    environment starts with the data dir and then holds about 1 MB must be seen every time."""
    broker = tmp_path / "b"
    broker.mkdir()
    (broker / "mode").write_text("local\n")
    env = {"RABBITMQ_MNESIA_BASE": f"{broker}/mnesia", "PATH": os.environ["PATH"]}
    env.update({f"FILLER_{i}": "x" * 120_000 for i in range(8)})
    node = subprocess.Popen(["sleep", "60"], env=env)
    try:
        (broker / "rabbitmq.pid").write_text(f"{node.pid}\n")
        run_env = {k: v for k, v in os.environ.items() if not k.startswith(("AMQPJOBS_", "RABBITMQ_"))}
        run_env.update(AMQPJOBS_BROKER_DIR=str(broker), AMQPJOBS_BROKER_MGMT_PORT="1")  # nothing answers there
        seen = 0
        for _ in range(5):
            out = subprocess.run(["bash", str(ROOT / "scripts" / "broker.sh"), "status"], env=run_env,
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            assert (out.returncode, out.stdout) == (3, "down\n")
            seen += f"(pid {node.pid}) runs, but RabbitMQ / the management API does not answer" in out.stderr
        assert seen == 5
    finally:
        node.kill()
        node.wait()
