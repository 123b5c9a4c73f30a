"""README's "Quick start", word for word: its files written from the README, its commands run as shown.

A fresh user found no quick start (the nearest snippets import ``amqpjobs`` while the examples
import internal modules); this keeps the one the README now has true.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

ROOT = Path(__file__).resolve().parents[2]


def quick_start() -> tuple[list[tuple[str, str]], list[str]]:
    """The section's files, ``(path, text)`` in order, and its shell commands (comments cut)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    files = re.findall(r"^`([\w./]+)`, [^\n]*:\n\n```(?:toml|python)\n(.*?)```", section, re.S | re.M)
    (shell,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = [line.split("#", 1)[0].strip() for line in shell.splitlines() if line.strip()]
    return files, commands


def test_the_quick_start_runs_as_written(broker: BrokerSettings, tmp_path: Path) -> None:
    files, commands = quick_start()
    assert [path for path, _ in files] == ["topology/jobs.toml", "app.py", "enqueue.py"]
    assert commands == [
        "export AMQPJOBS_URL=amqp://guest:guest@127.0.0.1:5682/",
        "amqpjobs topology apply topology/",
        "amqpjobs consume app:app",
        "python enqueue.py",
    ]
    for path, text in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    bin_dir = str(Path(sys.executable).parent)
    # the test's broker and vhost in place of the README's local node (the same URL form)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    env.pop("PYTHONPATH", None)
    apply = subprocess.run(commands[1].split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert apply.returncode == 0, apply.stderr
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(commands[2].split(), cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "worker consuming emails" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        python = [sys.executable, *commands[3].split()[1:]]
        sent = subprocess.run(python, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        (job_id,) = re.findall(r"^enqueued (\S+)$", sent.stdout, re.M)
        while f"sending to ann@example.com (job {job_id}, attempt 1)" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        worker.send_signal(signal.SIGINT)  # Ctrl-C: drains and stops
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    out = log.read_text()
    assert out.count("outcome=succeeded") == 1, out
    assert "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered); exit 0" in out, out
