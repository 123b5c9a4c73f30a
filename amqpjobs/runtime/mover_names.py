"""Which program runs this process's quarantine movers, as a refused mover is told (``busy: ... by amqpjobs console``).

A mover's lock names its action, host, pid and start (:class:`~amqpjobs.wire.lock.LockHolder`);
the same pid tells an operator nothing when the holder is a long-running program that moves on
someone's behalf, such as the web console. The program is said by whoever runs the movers
(:func:`acting_as`: the CLI gives its command, the console its action and who started it), else
it is the name of the script the process runs. Held in a context variable, so each console
action (its own task) names itself; never any argument of the command line (one may hold a URL
with a password).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Final

#: At most this many characters of the program's words are carried in the lock (a queue argument).
MAX_PROGRAM: Final = 200

_program: ContextVar[str] = ContextVar("amqpjobs_mover_program", default="")


@contextmanager
def acting_as(program: str) -> Iterator[None]:
    """Movers started in the ``with`` block (and in tasks created there) name ``program`` as who runs them.

    ``program``: e.g. ``amqpjobs replay`` or ``amqpjobs console: action 3f2a..., started by alice from 10.0.0.5``.
    """
    token = _program.set(program)
    try:
        yield
    finally:
        _program.reset(token)


def mover_program() -> str:
    """The program running the movers here (:func:`acting_as`), else the script's name (``worker.py``), else ""."""
    said = _program.get() or (Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "")
    return said[:MAX_PROGRAM]
