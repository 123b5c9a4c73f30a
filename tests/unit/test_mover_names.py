"""Who holds a mover lock, as a refused mover is told: the program (runtime.mover_names) and the holder's words."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

import pytest

from amqpjobs.runtime.mover_names import MAX_PROGRAM, acting_as, mover_program
from amqpjobs.wire.lock import LockHolder

pytestmark = pytest.mark.version_independent

SINCE = datetime(2026, 12, 1, 5, 0, tzinfo=UTC)


def test_the_holder_names_the_program_and_its_connection_when_known():
    plain = LockHolder("replay", "web-1", 4242, SINCE)
    assert str(plain) == "replay (pid 4242 on web-1, since 2026-12-01T05:00:00Z)"
    console = "amqpjobs console: action a1, started by al\x1b from ::1"
    by = LockHolder("replay", "web-1", 4242, SINCE, (("by", console),))
    assert str(by) == (
        "replay (pid 4242 on web-1, since 2026-12-01T05:00:00Z; by amqpjobs console: action a1, started by al\\x1b "
        "from ::1)"
    )  # a user name's control character is escaped, never written raw into a terminal
    back = LockHolder.from_arguments(by.arguments())
    assert back == by
    both = LockHolder("park", "h", 1, SINCE, (("by", "amqpjobs quarantine park"), ("connection", "'a -> b'")))
    assert str(both) == (
        "park (pid 1 on h, since 2026-12-01T05:00:00Z; by amqpjobs quarantine park; connection 'a -> b')"
    )


def test_the_program_is_the_one_acting_else_the_script(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/nightly-replay.py", "--url", "amqp://u:secret@h/"])
    assert mover_program() == "nightly-replay.py"  # never an argument: one may hold a password
    with acting_as("amqpjobs replay"):
        assert mover_program() == "amqpjobs replay"
        with acting_as("x" * 500):
            assert mover_program() == "x" * MAX_PROGRAM

        async def in_a_task() -> str:
            return mover_program()

        assert asyncio.run(in_a_task()) == "amqpjobs replay"  # a task started here names it too
    assert mover_program() == "nightly-replay.py"
    monkeypatch.setattr(sys, "argv", [])
    assert mover_program() == ""
