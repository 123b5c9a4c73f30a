"""Issue 26 review: ``amqpjobs console`` starting up, as an operator runs it (a subprocess, the real CLI).

The "listening on" line comes once the console is bound, with the port it is bound to (``--port 0``:
the one the system chose), never before a check that then fails.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from amqpjobs.console.config import PASSWORD_ENV, TOKEN_ENV, USER_ENV
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, cli_subprocess

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

BANNER = "amqpjobs console on"


@pytest.fixture(autouse=True)
def no_console_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TOKEN_ENV, USER_ENV, PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def started(broker: BrokerSettings, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs console --port 0`` running; stopped at the end."""
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               AMQPJOBS_CONSOLE_AUDIT_LOG=str(tmp_path / "audit.jsonl"))  # fmt: skip
    exe = str(Path(sys.executable).with_name("amqpjobs"))
    with subprocess.Popen([exe, "console", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True) as proc:
        try:
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def test_port_0_prints_the_port_it_is_bound_to(started: subprocess.Popen[str]):
    assert started.stderr is not None
    line = started.stderr.readline()  # blocks until the console says where it listens (or exits)
    found = re.fullmatch(r"amqpjobs console on http://127\.0\.0\.1:(\d+)/ \(vhost '[^']+'; Ctrl-C to stop\)\n", line)
    assert found is not None, line + started.stderr.read() if started.poll() is not None else line
    port = int(found.group(1))
    assert port != 0
    deadline = time.monotonic() + 30
    while True:  # bound before the line was printed; uvicorn serves it once started
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/audit", timeout=2)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "nothing answers on the port printed"
            time.sleep(0.05)
    assert answer.status_code == 200


def test_a_start_that_fails_prints_no_banner(broker: BrokerSettings, tmp_path: Path):
    (tmp_path / "a-file").write_text("")
    unwritable = cli(broker, "console", "--port", "0", "--audit-log", str(tmp_path / "a-file" / "audit.jsonl"))
    not_loopback = cli(broker, "console", "--host", "0.0.0.0", "--port", "0")
    assert (unwritable.exit_code, not_loopback.exit_code) == (2, 2)
    assert "can't be written" in unwritable.output
    assert "not loopback" in not_loopback.output
    assert BANNER not in unwritable.output + not_loopback.output


def test_a_port_in_use_is_exit_2_naming_it(broker: BrokerSettings, tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli(broker, "console", "--port", str(port), "--audit-log", str(tmp_path / "audit.jsonl"))
    assert result.exit_code == 2, result.output
    assert f"can't listen on 127.0.0.1:{port}" in result.output
    assert "--port 0" in result.output  # the fix: another port, or any free one
    assert BANNER not in result.output


def test_a_short_token_in_the_environment_is_exit_2_saying_how_to_make_one(broker, monkeypatch, tmp_path: Path):
    monkeypatch.setenv(TOKEN_ENV, "letmein")
    args = ("console", "--host", "0.0.0.0", "--port", "0", "--audit-log", str(tmp_path / "a.jsonl"))
    result = cli_subprocess(broker, *args, timeout=30)  # accepted, it would serve until the timeout
    assert result.returncode == 2, result.stderr
    assert f"{TOKEN_ENV} is 7 characters: give one of at least 16" in result.stderr
    assert "python -c 'import secrets; print(secrets.token_urlsafe())'" in result.stderr
    assert "letmein" not in result.stderr
    assert BANNER not in result.stderr
    assert "Traceback" not in result.stderr
