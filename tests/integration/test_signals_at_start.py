"""A signal at any moment of a long-running command's start stops it well (real broker).

README "Workers": SIGTERM or Ctrl-C stops ``amqpjobs consume`` with exit 0, also while it is
still starting. Before its event loop's handlers are in place, the process imports the CLI
(about 0.5 s on a quiet machine, over 1 s under load) and then the app's module (as long as the
user's code takes, maybe forever). A signal in that time met Python's default handling: exit by
SIGTERM with no line, or a KeyboardInterrupt traceback. Now the process exits 0 at once with a
line (nothing was taken from the broker yet). Each test signals at a moment it can see: the
CLI's import of aio-pika has ended (``python -X importtime`` writes one line per import to
stderr), or the app module has begun to load (it writes "importing" to the record, then sleeps).

A one-shot command keeps Python's handling (it dies by SIGTERM; Ctrl-C exits 130): the signal
held while the CLI was imported is raised again when the command starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.child_signals import SIGNALS_DEFAULT
from tests.integration.helpers import process_running, until, write_file
from tests.integration.worker_env import APPLIED_TOPOLOGY
from tests.silent_port import silent_port

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

SCRIPT = Path(sys.executable).with_name("amqpjobs")
#: The line ``-X importtime`` writes once the CLI's import of aio-pika has ended (more imports follow).
EXITING = "signal {n} while starting: exiting (nothing was taken from the broker yet)"
AIO_PIKA_IMPORTED = re.compile(r"^import time:.*\|\s*aio_pika$", re.MULTILINE)


@contextmanager
def started(
    tmp_path: Path, broker: BrokerSettings, args: Sequence[str], **extra: str
) -> Iterator[subprocess.Popen[str]]:
    """``python -X importtime amqpjobs ARGS``, stdout and stderr to tmp_path/out.log; killed if still running after."""
    topo = tmp_path / "proc.toml"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {**os.environ, "AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "PROCAPP_TOPOLOGY": str(topo), "SCHEDAPP_TOPOLOGY": str(topo),
           "PROCAPP_RECORD": str(tmp_path / "record.txt"), **extra}  # fmt: skip
    command = [*SIGNALS_DEFAULT, sys.executable, "-X", "importtime", str(SCRIPT), *args]
    with process_running(command, env, tmp_path / "out.log") as proc:
        yield proc


def log(tmp_path: Path) -> str:
    return (tmp_path / "out.log").read_text()


def lines_of_ours(tmp_path: Path) -> list[str]:
    """The output without the import-time lines."""
    return [line for line in log(tmp_path).splitlines() if not line.startswith("import time:")]


async def exit_code(proc: subprocess.Popen[str], timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    code = await asyncio.to_thread(proc.wait, timeout)
    return code, time.monotonic() - t0


async def signal_while_the_cli_is_imported(proc: subprocess.Popen[str], tmp_path: Path, sig: int) -> None:
    await until(lambda: AIO_PIKA_IMPORTED.search(log(tmp_path)) is not None or proc.poll() is not None, 30,
                "the CLI's import of aio-pika")  # fmt: skip
    assert proc.poll() is None, log(tmp_path)
    proc.send_signal(sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_consume_signalled_while_the_cli_is_imported_exits_0(
    broker: BrokerSettings, tmp_path: Path, sig: signal.Signals
):
    with started(tmp_path, broker, ["consume", "tests.integration.procapp:app"]) as proc:
        await signal_while_the_cli_is_imported(proc, tmp_path, sig)
        code, took = await exit_code(proc, 30)
    ours = lines_of_ours(tmp_path)
    assert code == 0, ours
    assert [line.split(" INFO ", 1)[1] for line in ours] == [f"amqpjobs.signals: {EXITING.format(n=int(sig))}"]
    assert took < 10, took


async def test_consume_signalled_while_the_app_module_loads_exits_0_at_once(broker: BrokerSettings, tmp_path: Path):
    """The app's import is cut short (it would take 60 s): nothing was taken from the broker yet."""
    record = tmp_path / "record.txt"
    args = ["consume", "tests.integration.procapp:app", "--log-json"]
    with started(tmp_path, broker, args, PROCAPP_SLOW_IMPORT="60") as proc:
        await until(lambda: record.exists() and record.read_text().startswith("importing"), 30, "the app's import")
        proc.send_signal(signal.SIGTERM)
        code, took = await exit_code(proc, 30)
    ours = lines_of_ours(tmp_path)
    assert code == 0, ours
    assert took < 5, took
    assert [json.loads(line)["message"] for line in ours] == [EXITING.format(n=15)]
    assert record.read_text().split() == ["importing", str(proc.pid)]  # loaded once, ran nothing


async def test_schedule_run_signalled_while_the_app_module_loads_exits_0_at_once(
    broker: BrokerSettings, tmp_path: Path
):
    """As a worker's: the app's import (60 s) is cut short, and no replica ever joined the election."""
    record = tmp_path / "sched-record.txt"
    args = ["schedule", "run", "tests.integration.schedapp:app", "--log-json"]
    with started(tmp_path, broker, args, SCHEDAPP_SLOW_IMPORT="60", SCHEDAPP_RECORD=str(record)) as proc:
        await until(lambda: record.exists() and record.read_text().startswith("importing"), 30, "the app's import")
        proc.send_signal(signal.SIGINT)
        code, took = await exit_code(proc, 30)
    ours = lines_of_ours(tmp_path)
    assert code == 0, ours
    assert took < 5, took
    assert [json.loads(line)["message"] for line in ours] == [EXITING.format(n=2)]
    assert record.read_text().split() == ["importing", str(proc.pid)]


async def test_consume_processes_2_signalled_while_the_cli_is_imported_exits_0(broker: BrokerSettings, tmp_path: Path):
    with started(tmp_path, broker, ["consume", "tests.integration.procapp:app", "--processes", "2"]) as proc:
        await signal_while_the_cli_is_imported(proc, tmp_path, signal.SIGTERM)
        code, _ = await exit_code(proc, 30)
    ours = "\n".join(lines_of_ours(tmp_path))
    assert code == 0, ours
    assert EXITING.format(n=15) in ours
    assert "child 1 started" not in ours  # none was


async def test_schedule_run_signalled_while_the_cli_is_imported_exits_0(broker: BrokerSettings, tmp_path: Path):
    with started(tmp_path, broker, ["schedule", "run", "tests.integration.schedapp:app"]) as proc:
        await signal_while_the_cli_is_imported(proc, tmp_path, signal.SIGINT)
        code, _ = await exit_code(proc, 30)
    ours = "\n".join(lines_of_ours(tmp_path))
    assert code == 0, ours
    assert EXITING.format(n=2) in ours
    assert "Traceback" not in ours


@pytest.mark.parametrize(
    ("args", "sig", "expected"),
    [
        (["status", "--json"], signal.SIGTERM, -signal.SIGTERM),
        (["status", "--json"], signal.SIGINT, 130),
        (["--version"], signal.SIGTERM, -signal.SIGTERM),  # never reaches a command
        (["consume", "--help"], signal.SIGINT, 130),
        (["consume"], signal.SIGTERM, -signal.SIGTERM),  # a usage error
    ],
    ids=["status-SIGTERM", "status-SIGINT", "version-SIGTERM", "consume-help-SIGINT", "usage-error-SIGTERM"],
)
async def test_a_one_shot_command_signalled_while_the_cli_is_imported_ends_as_python_would(
    broker: BrokerSettings, tmp_path: Path, args: list[str], sig: signal.Signals, expected: int
):
    """Not held for good: the command ends by the signal (SIGTERM), or as interrupted (Ctrl-C: 130)."""
    with started(tmp_path, broker, args) as proc:
        await signal_while_the_cli_is_imported(proc, tmp_path, sig)
        code, took = await exit_code(proc, 30)
    ours = lines_of_ours(tmp_path)
    assert code == expected, ours
    assert took < 10, took
    if sig == signal.SIGINT:
        assert ours[-1] == "interrupted"


async def test_schedule_run_signalled_while_still_connecting_gives_the_start_up_and_exits_0(
    broker: BrokerSettings, tmp_path: Path
):
    """As a worker does (README "Workers"): the first connect is retried for up to 30 s; a stop does not wait for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = broker.url.replace(f":{urlsplit(broker.url).port}/", f":{s.getsockname()[1]}/")
    with started(tmp_path, broker, ["schedule", "run", "tests.integration.schedapp:app"], AMQPJOBS_URL=nowhere) as proc:
        await until(lambda: "not reachable (attempt 1" in log(tmp_path) or proc.poll() is not None, 30,
                    "the first connect attempt")  # fmt: skip
        assert proc.poll() is None, log(tmp_path)
        proc.send_signal(signal.SIGTERM)
        code, took = await exit_code(proc, 30)
    ours = "\n".join(lines_of_ours(tmp_path))
    assert code == 0, ours
    assert took < 3, took
    assert "signal 15: handing leadership over and stopping" in ours
    assert "Traceback" not in ours


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_second_signal_while_a_stopped_start_winds_down_exits_143(
    broker: BrokerSettings, tmp_path: Path, loop: str
):
    """After the stop's loop handlers are gone, the process still waits for a management API request in a thread
    (5 s timeout): a second SIGTERM there exits 143 at once, as README "Exit codes" says, not by the signal.
    uvloop takes the signal wakeup fd when its loop starts: the first signal must reach the start all the same."""
    with silent_port() as (port, accepted):
        env = {"AMQPJOBS_MANAGEMENT_URL": f"http://guest:guest@127.0.0.1:{port}"}
        args = ["consume", "tests.integration.procapp:app", "--loop", loop]
        with started(tmp_path, broker, args, **env) as proc:
            await until(lambda: accepted or proc.poll() is not None, 30, "a management API request")
            assert proc.poll() is None, log(tmp_path)  # the start waits for it now (5 s)
            proc.send_signal(signal.SIGTERM)
            stopped = "worker stopped while starting: no delivery was taken; exit 0"
            await until(lambda: stopped in log(tmp_path) or proc.poll() is not None, 10, "the stopped line")
            assert proc.poll() is None, "\n".join(lines_of_ours(tmp_path))  # the request's thread still runs
            proc.send_signal(signal.SIGTERM)
            code, took = await exit_code(proc, 30)
    ours = "\n".join(lines_of_ours(tmp_path))
    assert code == 128 + signal.SIGTERM, ours
    assert took < 1.5, took
    assert "second signal 15: exiting now" in ours
