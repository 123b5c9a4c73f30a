"""Ctrl-C in any command: one line and exit 130, not click's "Aborted!" and 1 (no broker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.cli._common import errors_to_exit_codes
from tests.child_signals import SIGNALS_DEFAULT
from tests.silent_port import silent_port


@click.command()
@errors_to_exit_codes
def interrupted() -> None:
    raise KeyboardInterrupt


def test_ctrl_c_in_any_command_exits_130_with_one_line():
    result = CliRunner().invoke(interrupted, [])
    assert (result.exit_code, result.stderr, result.stdout) == (130, "interrupted\n", "")


def _raising(exc: Exception) -> click.Command:
    @click.command()
    @errors_to_exit_codes
    def command() -> None:
        raise exc

    return command


def test_a_publish_whose_outcome_is_unknown_exits_3_as_broker_trouble_not_2():
    """Plain PublishError (no confirm, channel or connection closed under it) is the broker's side."""
    from amqpjobs.errors import PublishError, UnroutableError

    unknown = CliRunner().invoke(_raising(PublishError("job 'x' may or may not be stored")), [])
    assert (unknown.exit_code, unknown.stderr) == (3, "broker error: job 'x' may or may not be stored\n")
    refused = CliRunner().invoke(_raising(UnroutableError("exchange 'jobs' does not exist")), [])
    assert (refused.exit_code, refused.stderr) == (2, "error: exchange 'jobs' does not exist\n")


BAD_TOPOLOGY = '[[exchanges]]\nname = "jobs"\n'  # the plural tables: an invalid topology


@pytest.mark.parametrize(
    ("args", "declares"),
    [(["topology", "apply"], True), (["topology", "plan"], False), (["topology", "export"], False),
     (["status"], False)],
)  # fmt: skip
def test_an_invalid_topology_says_nothing_was_declared_only_where_a_command_declares(
    tmp_path: Path, args: list[str], declares: bool
):
    path = tmp_path / "t.toml"
    path.write_text(BAD_TOPOLOGY)
    env = {"AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/", "AMQPJOBS_MANAGEMENT_URL": "http://127.0.0.1:1"}
    result = CliRunner().invoke(main, [*args, str(path)], env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: invalid topology (1 problem(s)):\n")
    assert ("nothing was declared\n" in result.stderr) is declares
    assert result.stdout == ""


OK_TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n'


@pytest.mark.parametrize("args", [["topology", "plan"], ["status"]])
def test_ctrl_c_while_a_management_api_request_hangs_exits_130_at_once(tmp_path: Path, args: list[str]):
    """The request runs in a thread (up to its 5 s timeout); Ctrl-C must not wait for it at exit."""
    path = tmp_path / "t.toml"
    path.write_text(OK_TOPOLOGY)
    exe = Path(sys.executable).with_name("amqpjobs")
    with silent_port() as (port, accepted):
        env = {**os.environ, "AMQPJOBS_URL": f"amqp://guest:guest@127.0.0.1:{port}/",
               "AMQPJOBS_MANAGEMENT_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
        proc = subprocess.Popen([*SIGNALS_DEFAULT, str(exe), *args, str(path)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not accepted and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert proc.poll() is None, proc.communicate()
            assert accepted, "no request reached the silent management API"
            time.sleep(0.3)  # well inside the request (its timeout is 5 s)
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            out, err = proc.communicate(timeout=15)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert (proc.returncode, err, out) == (130, "interrupted\n", "")
    # waiting for the request would take its 4.7 s left; 1.5 s failed once at 1.6 s beside 6 test processes
    assert took < 3.0, took


CLOSING_WITH_A_BUSY_THREAD = """
import asyncio, os, signal, threading, time
from amqpjobs.cli._running import run_command

async def main() -> int:
    asyncio.get_running_loop().run_in_executor(None, time.sleep, 20)  # a request still in its thread at the end
    threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C while the runner closes
    return 0

run_command(main())
print("ended normally")
"""


def test_ctrl_c_while_the_command_closes_with_a_busy_thread_exits_130_at_once():
    """The runner's close joins the executor's threads: a Ctrl-C then must not wait for them either."""
    started = time.monotonic()
    proc = subprocess.run([*SIGNALS_DEFAULT, sys.executable, "-c", CLOSING_WITH_A_BUSY_THREAD],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    took = time.monotonic() - started
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted\n", "")
    assert took < 10.0, took  # the thread sleeps 20 s; the 10 s cover Python's start on a loaded machine
