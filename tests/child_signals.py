"""Children with SIGINT and SIGTERM at their defaults, whatever the test process has.

A job that a non-interactive shell puts in the background (CI's ``bash .ci/run &``) starts with
SIGINT ignored, and so does every process it starts; amqpjobs keeps a signal ignored from the
start ignored (``amqpjobs.runtime.held_signals``). Tests of what a signal does start their
child through :data:`SIGNALS_DEFAULT`.
"""

from __future__ import annotations

import sys

_CODE = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

#: Put before a command: it runs with both signals at their defaults, in the same process (exec).
SIGNALS_DEFAULT = [sys.executable, "-c", _CODE]
