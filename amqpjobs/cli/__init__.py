"""The ``amqpjobs`` command line: a thin click layer over the library.

Exit codes: 0 success; 1 the check found something (plan conflicts); 2 bad input
(invalid topology files, bad options); 3 the broker or its management API failed; 4 busy:
another process holds the lock the command needs (one mover per quarantine queue), nothing
was done; 130 interrupted by Ctrl-C (``replay`` prints its summary first); 141 stdout's reader
went away (``amqpjobs status | head``): the command stops quietly, as one killed by SIGPIPE.

``-v`` logs debug details and prints the traceback of an error before its one-line message.

One module per command group; importing them registers their commands on :data:`main`.
"""

from __future__ import annotations

from amqpjobs.cli import console, flow, job, parking, quarantine, schedule, status, topology, worker  # noqa: F401  (registers the commands)
from amqpjobs.cli._common import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_BROKER, EXIT_BUSY, EXIT_FOUND, EXIT_INTERRUPTED
from amqpjobs.cli._root import main

__all__ = ["EXIT_BAD_INPUT", "EXIT_BROKEN_PIPE", "EXIT_BROKER", "EXIT_BUSY", "EXIT_FOUND", "EXIT_INTERRUPTED", "main"]
