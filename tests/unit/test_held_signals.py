"""SIGTERM and SIGINT held while a command starts (amqpjobs.runtime.held_signals), without a broker.

The whole path (the console script, a worker or scheduler signalled while it starts) is
tested against the broker in tests/integration/test_signals_at_start.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from amqpjobs.runtime import held_signals

pytestmark = pytest.mark.version_independent


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(1)  # a handler runs as soon as this thread runs Python again: it raises here


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """The test's own process: whatever a test leaves held is released, the handlers put back."""
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    try:
        yield
    finally:
        held_signals.end()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_held_signal_is_noted_then_released_with_the_handlers_from_before(handlers_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    held_signals.hold()
    assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
    os.kill(os.getpid(), signal.SIGINT)  # Python's handler would raise KeyboardInterrupt here
    assert held_signals.release() == signal.SIGINT
    assert {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS} == before
    assert held_signals.release() is None  # released once


def test_exit_on_signal_exits_0_at_once_for_the_held_signal(
    handlers_kept: None, caplog: pytest.LogCaptureFixture
) -> None:
    held_signals.hold()
    os.kill(os.getpid(), signal.SIGTERM)  # the default would end this process
    with caplog.at_level(logging.INFO, logger="amqpjobs.signals"), pytest.raises(SystemExit) as exited:
        held_signals.exit_on_signal()
    assert exited.value.code == 0
    assert caplog.messages == ["signal 15 while starting: exiting (nothing was taken from the broker yet)"]


def test_exit_on_signal_makes_the_next_signal_exit_0_until_end(
    handlers_kept: None, caplog: pytest.LogCaptureFixture
) -> None:
    held_signals.hold()
    held_signals.exit_on_signal()  # nothing held: returns
    with caplog.at_level(logging.INFO, logger="amqpjobs.signals"), pytest.raises(SystemExit) as exited:
        _signal_self(signal.SIGINT)
    assert exited.value.code == 0
    assert caplog.messages == ["signal 2 while starting: exiting (nothing was taken from the broker yet)"]
    held_signals.hold()
    held_signals.exit_on_signal()
    held_signals.end()  # the loop's handlers took over: ours does nothing any more
    assert held_signals.release() is None


def test_nothing_is_held_off_the_main_thread(handlers_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    thread = threading.Thread(target=held_signals.hold)
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS} == before
    assert held_signals.release() is None


@pytest.mark.parametrize("exit_mode", [False, True], ids=["held", "exit-caught"])
def test_a_second_signal_while_starting_exits_at_once_with_128_plus_it(exit_mode: bool) -> None:
    code = (
        "import os, signal, time\n"
        "from amqpjobs.runtime import held_signals\n"
        "held_signals.hold()\n"
        f"if {exit_mode}: held_signals.exit_on_signal()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.1)\n"
        "except SystemExit:\n"
        "    pass  # an app that swallows it\n"
        "print('first', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (130, "first\n")
    assert done.stderr.endswith("second signal 2 while starting: exiting now\n")


def test_the_console_script_imports_only_the_hold_before_it_holds() -> None:
    """``import amqpjobs`` loads its names when first used: nothing slow comes before hold()."""
    code = (
        "import sys\n"
        "import amqpjobs.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('amqpjobs', 'aio_pika', 'aiormq', 'pydantic')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == str(
        ["amqpjobs", "amqpjobs.__main__", "amqpjobs._version", "amqpjobs.runtime", "amqpjobs.runtime.held_signals"]
    )


def test_a_signal_ignored_from_the_start_stays_ignored(handlers_kept: None) -> None:
    """``cmd &`` in a non-interactive shell starts with SIGINT ignored: holding must not make it count."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    held_signals.hold()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGINT)
    assert held_signals.release() is None
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_second_signal_exits_128_plus_it_also_with_stderr_closed() -> None:
    code = (
        "import os, signal, time\n"
        "from amqpjobs.runtime import held_signals\n"
        "held_signals.hold()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(5)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=30, preexec_fn=lambda: os.close(2))
    assert done.returncode == 143
