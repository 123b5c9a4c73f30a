"""Smoke run of the benchmark suite: ``bench/run.py --quick`` with a tiny N writes every section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BrokerRoot

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = [
    "# amqpjobs benchmarks",
    "## 1. Throughput",
    "## 2. `amqpjobs consume --processes 2` vs `--processes 1`",
    "## 3. Publish rate",
    "## 4. Sync publisher",
    "## 5. Latency",
    "## 6. Worker RSS",
    "## 7. Retry-tier timing error",
    "## 8. `amqpjobs topology apply`",
    "## Where the time goes",
    "## Goals of issue 22",
    "_Machine: ",
]

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_quick_run_writes_every_section(broker_root: BrokerRoot, tmp_path: Path) -> None:
    for module in ("dramatiq", "celery", "pika", "psutil"):
        pytest.importorskip(module, reason="the bench extra is not installed: pip install -e '.[bench]'")
    out = tmp_path / "RESULTS.md"
    settings = broker_root.settings
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--n", "100", "--out", str(out),
         "--url", settings.url, "--management-url", settings.management_url],
        capture_output=True, text=True, timeout=230, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    for heading in SECTIONS:
        assert heading in text, f"{heading!r} missing from:\n{text}"
    assert text.count("_Machine: ") >= 11  # with every table
    assert "section failed" not in text
    assert "not measured in this run" not in text  # the closing table has a figure for every goal of issue 22
    assert "| raw aio-pika, prefetch 16, concurrent handlers |" in text
    for peer in ("Dramatiq", "Celery", "sync pika"):
        assert peer in text
