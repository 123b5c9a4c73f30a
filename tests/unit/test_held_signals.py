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
from collections.abc import Iterator

import pytest

from amqpjobs.runtime import held_signals

pytestmark = pytest.mark.version_independent


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    """The test's own process: whatever a test leaves held is released, the handlers put back."""
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    try:
        yield
    finally:
        held_signals.release()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_held_signal_is_noted_not_acted_on_and_taken_once(handlers_kept: None) -> None:
    held_signals.hold()
    os.kill(os.getpid(), signal.SIGTERM)  # the default would end this process
    assert held_signals.take() == (signal.SIGTERM,)
    assert held_signals.take() == ()  # handed over once
    assert held_signals.release() is None  # no longer held: nothing to put back


def test_release_puts_the_handlers_from_before_back_and_returns_the_held_signal(handlers_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    held_signals.hold()
    assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
    os.kill(os.getpid(), signal.SIGINT)  # Python's handler would raise KeyboardInterrupt here
    assert held_signals.release() == signal.SIGINT
    assert {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS} == before
    assert held_signals.take() == ()


def test_nothing_is_held_without_hold_or_off_the_main_thread(handlers_kept: None) -> None:
    before = {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS}
    assert (held_signals.take(), held_signals.release()) == ((), None)
    thread = threading.Thread(target=held_signals.hold)
    thread.start()
    thread.join()
    assert {sig: signal.getsignal(sig) for sig in held_signals.SIGNALS} == before
    assert held_signals.take() == ()


def test_a_second_signal_while_held_exits_at_once_with_128_plus_it() -> None:
    code = (
        "import os, signal, time\n"
        "from amqpjobs.runtime import held_signals\n"
        "held_signals.hold()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('first held', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (
        130,
        "first held\n",
        "second signal 2 while starting: exiting now\n",
    )


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
