"""SIGTERM and SIGINT held while a command starts (amqpjobs.runtime.held_signals), without a broker.

The whole path (the console script, a worker or scheduler signalled while it starts) is
tested against the broker in tests/integration/test_signals_at_start.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from amqpjobs.runtime import held_signals
from tests.child_signals import SIGNALS_DEFAULT

pytestmark = pytest.mark.version_independent


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(1)  # a handler runs as soon as this thread runs Python again: it raises here


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """The test's own process: whatever a test leaves held is released, the handlers put back."""
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not SIG_IGN, as in a job a non-interactive shell started (CI)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        held_signals.release()
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


def _python(code: str, *, timeout: float = 30, signals: tuple[int, ...] = ()) -> tuple[int, str, str, float]:
    """Run ``code`` (after logging at INFO is set up) in a child; send it ``signals`` once it prints "ready".

    Returns:
        (exit code, stdout, stderr, seconds from the first signal to the exit).
    """
    head = "import logging, os, signal, sys, threading, time\nlogging.basicConfig(level=logging.INFO)\n"
    head += "from amqpjobs.runtime import held_signals\n"
    command = [*SIGNALS_DEFAULT, sys.executable, "-c", head + code]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    t0 = time.monotonic()
    if signals:
        if (first := child.stdout.readline()) != "ready\n":
            child.kill()
            pytest.fail(f"the child did not get ready: {first!r}, stderr {child.communicate()[1]!r}")
        t0 = time.monotonic()
        for sig in signals:
            child.send_signal(sig)
            time.sleep(0.2)
    out, err = child.communicate(timeout=timeout)
    return child.returncode, out, err, time.monotonic() - t0


EXITING = "INFO:amqpjobs.signals:signal {n} while starting: exiting (nothing was taken from the broker yet)\n"


def test_exit_on_signal_exits_0_at_once_for_the_held_signal() -> None:
    code = (
        "held_signals.hold()\nos.kill(os.getpid(), signal.SIGTERM)\nheld_signals.exit_on_signal()\nprint('not reached')"
    )
    assert _python(code)[:3] == (0, "", EXITING.format(n=15))


def test_in_exit_mode_a_signal_exits_0_at_once_though_a_thread_of_the_app_would_keep_the_process() -> None:
    """No interpreter shutdown: it would wait for the app's non-daemon thread (here 60 s)."""
    code = (
        "held_signals.hold()\nheld_signals.exit_on_signal()\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    exit_code, out, err, took = _python(code, signals=(signal.SIGINT,))
    assert (exit_code, out, err) == (0, "", EXITING.format(n=2))
    assert took < 5, took


def test_in_exit_mode_another_signal_of_the_apps_does_not_exit_and_end_stops_it() -> None:
    code = (
        "signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
        "held_signals.hold()\nheld_signals.exit_on_signal()\n"
        "print('ready', flush=True)\ntime.sleep(1)\n"
        "held_signals.end()\nsignal.signal(signal.SIGTERM, lambda *a: print('ours', flush=True))\n"
        "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.5)\nprint('went on', flush=True)\n"
    )
    assert _python(code, signals=(signal.SIGUSR1,))[:3] == (0, "usr1\nours\nwent on\n", "")


def test_release_in_exit_mode_puts_the_handlers_back() -> None:
    """A long-running command that failed before its loop: its error's exit code stands (here: the signal's)."""
    code = (
        "before = signal.getsignal(signal.SIGTERM)\n"  # SIG_DFL, or coverage's (its sigterm option, under --cov)
        "held_signals.hold()\nheld_signals.exit_on_signal()\n"
        "assert held_signals.release() is None\n"
        "assert signal.getsignal(signal.SIGTERM) is before, signal.getsignal(signal.SIGTERM)\n"
        "print('ready', flush=True)\ntime.sleep(30)\n"
    )
    assert _python(code, signals=(signal.SIGTERM,))[:3] == (-signal.SIGTERM, "", "")


def test_nothing_is_held_off_the_main_thread(handlers_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    thread = threading.Thread(target=held_signals.hold)
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS} == before
    assert held_signals.release() is None


def test_a_second_signal_while_held_exits_at_once_with_128_plus_it() -> None:
    code = (
        "held_signals.hold()\nos.kill(os.getpid(), signal.SIGTERM)\nprint('first', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\nprint('not reached')\n"
    )
    exit_code, out, err, _ = _python(code)
    assert (exit_code, out, err) == (130, "first\n", "second signal 2 while starting: exiting now\n")


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
    done = subprocess.run([*SIGNALS_DEFAULT, sys.executable, "-c", code], timeout=30, preexec_fn=lambda: os.close(2))
    assert done.returncode == 143
