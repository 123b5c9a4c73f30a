"""The test fixtures' own decisions (which need no broker)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.test_chaos import cluster_unavailable

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="scripts/cluster.sh is Linux only")


def everything(tool: str) -> str:
    return f"/usr/bin/{tool}"


def test_cluster_skips_without_rabbitmq_server_unless_root_can_install_it(tmp_path: Path):
    reason = cluster_unavailable(tmp_path, is_root=False, which=everything)
    assert reason is not None
    assert f"{tmp_path}/rabbitmq-server is missing" in reason
    assert "sudo apt-get install -y rabbitmq-server" in reason
    assert cluster_unavailable(tmp_path, is_root=True, which=everything) is None  # broker.sh installs it
    assert cluster_unavailable(tmp_path, is_root=True, which=lambda t: None) is not None  # no apt-get


def test_cluster_runs_where_rabbitmq_server_and_the_tools_are(tmp_path: Path):
    (tmp_path / "rabbitmq-server").touch()
    assert cluster_unavailable(tmp_path, is_root=False, which=everything) is None
    no_flock = cluster_unavailable(tmp_path, is_root=False, which=lambda t: None if t == "flock" else t)
    assert no_flock == "scripts/cluster.sh needs flock (not found on PATH)"
