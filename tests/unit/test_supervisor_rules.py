"""``consume --processes N`` without a broker: the process count, the child's spec, health sums, log labels."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.errors import (
    BrokerError,
    ConfigurationError,
    LedgerUnavailableError,
    PayloadStoreError,
    ResultsUnavailableError,
)
from amqpjobs.runtime.child import ChildSpec
from amqpjobs.runtime.logs import JsonFormatter, TextFormatter
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.runtime.process_count import process_count
from amqpjobs.runtime.supervisor import Slot, Supervisor
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.wire.settings import broker_settings


def test_processes_is_a_positive_count_or_auto() -> None:
    assert process_count("3", 2) == 3
    assert process_count("auto", 3) == 3
    assert process_count(" AUTO ", 3) == 3
    for bad in ("0", "-2", "two", ""):
        with pytest.raises(ConfigurationError, match=r"--processes .*positive number of processes, or auto"):
            process_count(bad, 2)


def test_the_child_spec_survives_its_json_line() -> None:
    settings = broker_settings("amqp://u:p%2C@h1:5672/v,amqp://u:p%2C@h2:5672/v").with_connect_timeout(7.5)
    spec = ChildSpec("m:app", 2, WorkerOptions(queues=("a", "b"), concurrency=16, grace=3.0), settings, True, 10, True)
    line = spec.to_json()
    assert "\n" not in line
    assert ChildSpec.from_json(line) == spec
    assert json.loads(line)["options"]["queues"] == ["a", "b"]


def child_log_record() -> logging.LogRecord:
    rec = logging.LogRecord("amqpjobs.worker", logging.INFO, __file__, 1, "draining", None, None)
    rec.created, rec.msecs = 1764406800.25, 250
    return rec


def test_log_lines_name_the_child() -> None:
    assert TextFormatter(3).format(child_log_record()).endswith(" INFO [child 3] amqpjobs.worker: draining")
    assert json.loads(JsonFormatter(3).format(child_log_record()))["child"] == 3
    assert "child" not in json.loads(JsonFormatter().format(child_log_record()))
    assert "[child" not in TextFormatter().format(child_log_record())


class Running:
    """Stands for a running child process (the health sum only asks whether there is one)."""

    returncode = None


def supervisor_with(*children: tuple[str, int | None]) -> Supervisor:
    spec = ChildSpec("m:app", 0, WorkerOptions(), broker_settings("amqp://u:p@h:5672/v"))
    sup = Supervisor(spec, len(children))
    for slot, (state, port) in zip(sup._slots, children, strict=True):
        slot.state, slot.port, slot.process = state, port, Running()  # type: ignore[assignment]
    return sup


def child_server(ready: tuple[bool, str], heartbeat_age: float) -> MetricsServer:
    beat = time.monotonic() - heartbeat_age
    server = MetricsServer(WorkerMetrics(), lambda: ready, lambda: beat, stale_after=10.0)
    server.start()
    return server


def test_health_is_503_while_any_child_is_stalled_starting_or_not_ready() -> None:
    good = child_server((True, "consuming work with 4 slot(s)"), 0.5)
    stalled = child_server((False, "event loop blocked for 12s"), 12.0)
    servers: list[Any] = [good, stalled]
    try:
        both = supervisor_with(("ready", good.port), ("ready", good.port))
        alive, text = both.liveness()
        assert alive
        assert re.fullmatch(r"child 1: alive: event loop heartbeat 0\.\ds ago; child 2: alive: event loop heartbeat "
                            r"0\.\ds ago", text), text  # fmt: skip
        assert both.readiness() == (True, "child 1: consuming work with 4 slot(s); child 2: consuming work with "
                                    "4 slot(s)")  # fmt: skip
        one_stalled = supervisor_with(("ready", good.port), ("ready", stalled.port))
        stuck, text = one_stalled.liveness()
        assert not stuck
        assert re.fullmatch(r"child 2: event loop stuck for 12\.\ds", text), text
        assert one_stalled.readiness() == (False, "child 2: event loop blocked for 12s")
        restarting = supervisor_with(("ready", good.port), ("restarting", None))
        assert restarting.liveness() == (False, "child 2 restarting")
        starting = supervisor_with(("starting", good.port), ("ready", good.port))
        assert starting.liveness()[0] is True  # alive while it connects ...
        assert starting.readiness() == (False, "child 1 starting")  # ... but not ready
        gone = supervisor_with(("ready", good.port), ("ready", stalled.port))
        stalled.stop()
        ok, text = gone.liveness()
        assert not ok
        assert text.startswith("child 2: does not answer")
    finally:
        for server in servers:
            server.stop()


def test_consume_refuses_a_bad_process_count_before_it_starts_anything() -> None:
    from click.testing import CliRunner

    from amqpjobs.cli import main

    env = {"AMQPJOBS_URL": "amqp://u:p@127.0.0.1:1/v"}
    result = CliRunner().invoke(main, ["consume", "no_such_module:app", "--processes", "none"], env=env)
    assert result.exit_code == 2
    assert result.stderr == "error: --processes 'none': give a positive number of processes, or auto (one per CPU)\n"
    result = CliRunner().invoke(main, ["consume", "no_such_module:app", "--log-outcomes", "some"], env=env)
    assert result.exit_code == 2
    assert "'some' is not one of 'all', 'failures', 'none'" in result.stderr


@pytest.mark.parametrize(
    ("value", "cpus", "expected"),
    [("1", 1, 1), ("4", 1, 4), ("8", 2, 8), ("auto", 2, 2), ("auto", 64, 64), ("256", 64, 256), ("5", 1, None),
     ("9", 2, None), ("999", 2, None), ("257", 64, None)],
)  # fmt: skip
def test_processes_are_at_most_4_per_cpu(value: str, cpus: int, expected: int | None) -> None:
    if expected is not None:
        assert process_count(value, cpus) == expected
        return
    with pytest.raises(ConfigurationError) as caught:
        process_count(value, cpus)
    assert str(caught.value) == (
        f"--processes {value}: at most {4 * cpus} here (4 per CPU; this process may use {cpus} CPU(s), "
        "os.sched_getaffinity). Each child is a whole worker: about 50 MB of memory and 2-3 broker connections. "
        "Use fewer processes (auto: one per CPU), or run workers on more hosts"
    )


def test_consume_refuses_more_than_4_processes_per_cpu_and_starts_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from amqpjobs.cli import main

    started: list[int] = []

    async def run_child(self: Supervisor, slot: Any) -> int:
        started.append(slot.index)
        return 0

    monkeypatch.setattr(Supervisor, "_run_child", run_child)
    cpus = len(os.sched_getaffinity(0))
    env = {"AMQPJOBS_URL": "amqp://u:p@127.0.0.1:1/v"}
    result = CliRunner().invoke(main, ["consume", "no_such_module:app", "--processes", str(4 * cpus + 1)], env=env)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --processes {4 * cpus + 1}: at most {4 * cpus} here (4 per CPU; ")
    assert result.stderr.count("\n") == 1
    assert started == []


def run_child_module(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "amqpjobs.runtime.child"], input=stdin, capture_output=True,
                          timeout=60, check=False)  # fmt: skip


def test_a_child_whose_supervisor_is_gone_before_its_spec_exits_quietly() -> None:
    done = run_child_module(b"")
    assert (done.returncode, done.stdout, done.stderr) == (1, b"", b"")


def test_a_child_given_a_bad_spec_says_so_in_one_line() -> None:
    done = run_child_module(b'{"app_ref": "m:app", "index": 1\n')
    assert done.returncode == 2
    assert done.stderr.decode() == (
        "amqpjobs child: the supervisor's settings line is not a valid spec: JSONDecodeError: Expecting ',' "
        "delimiter: line 2 column 1 (char 32)\n"
    )
    assert "JSONDecodeError" in done.stdout.decode()  # the status line the supervisor's crash-loop error repeats
    wrong = run_child_module(b'{"app_ref": "m:app"}\n')
    assert wrong.returncode == 2
    assert wrong.stderr.decode() == (
        "amqpjobs child: the supervisor's settings line is not a valid spec: KeyError: 'options'\n"
    )


async def test_a_metrics_port_in_use_leaves_no_metrics_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the supervisor's directory
    spec = ChildSpec("m:app", 0, WorkerOptions(), broker_settings("amqp://u:p@h:5672/v"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"can't serve metrics on 127.0.0.1:{port}: "):
            await Supervisor(spec, 2, "127.0.0.1", port).run()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "raised"),
    [("BrokerError", BrokerError), ("LedgerUnavailableError", LedgerUnavailableError),
     ("ResultsUnavailableError", ResultsUnavailableError), ("PayloadStoreError", PayloadStoreError),
     ("ConfigurationError", ConfigurationError), (None, ConfigurationError)],
)  # fmt: skip
def test_a_crash_loop_is_raised_as_the_childs_kind_of_error_so_the_exit_code_is_one_processs(
    kind: str | None, raised: type[Exception]
) -> None:
    """A service that failed every child (broker, ledger, results or payload store) is exit 3, as with one process."""
    error = Supervisor._crash_loop_error(Slot(0, error="the PostgreSQL ledger is unreachable (...)", kind=kind))
    assert type(error) is raised
    assert "Its error: the PostgreSQL ledger is unreachable (...)" in str(error)
