"""The process exit codes of amqpjobs (README "Exit codes"), and which one an error of ours ends a process with.

One home: the CLI's commands (:func:`amqpjobs.cli._common.errors_to_exit_codes`), a worker's
stop line (``worker stopped: ...; exit 3``) and each ``consume --processes`` child's exit code
(:mod:`amqpjobs.runtime.child`) all take the code from :func:`exit_code`, so a child stopped
by the broker exits 3 as a single worker does, and its log line says so.
This module imports nothing of ours but :mod:`amqpjobs.errors`.
"""

from __future__ import annotations

from amqpjobs.errors import (
    BrokerBlockedError,
    BrokerError,
    BusyError,
    ConfigurationError,
    InvalidPayloadError,
    LedgerUnavailableError,
    PayloadStoreError,
    PublishError,
    ResultsUnavailableError,
    TopologyConflictError,
    TopologyValidationError,
)

EXIT_OK = 0
#: A check found something (``status`` unhealthy, ``topology plan`` conflicts); also an error of none of ours.
EXIT_FOUND = 1
EXIT_BAD_INPUT = 2
#: The broker, or a service the app uses (results store, ledger, payload store), failed us.
EXIT_BROKER = 3
EXIT_BUSY = 4
#: ``pause``/``resume``: the flag changed, but the signal to the workers was refused (they notice within 30 s).
EXIT_UNSIGNALLED = 5
#: Exit code when stdout's reader went away (``amqpjobs status | head -5``): 128 + SIGPIPE,
#: what a shell reports for a program the broken pipe killed; nothing more is printed.
EXIT_BROKEN_PIPE = 141
#: Exit code of a command interrupted by Ctrl-C (SIGINT): 128 + 2, the shell convention (not
#: click's "Aborted!" and 1, which reads as a failed check).
EXIT_INTERRUPTED = 130

#: A service failed us, like the broker: exit 3.
_SERVICES = (BrokerError, ResultsUnavailableError, LedgerUnavailableError, PayloadStoreError)


def exit_code(exc: BaseException) -> int:
    """The exit code a process ends with for ``exc`` (an int, 1 to 4).

    :data:`EXIT_BAD_INPUT` (2) for what the user gave (a configuration, an invalid topology or
    payload, a publish refused for what it is: unroutable, nacked, too large), :data:`EXIT_BROKER`
    (3) for a service that failed us (the broker, a resource alarm, an unconfirmed publish, the
    results store, ledger or payload store), :data:`EXIT_BUSY` (4), :data:`EXIT_FOUND` (1) for
    conflicts found, and 1 for any other exception (Python's own exit code for an uncaught one).
    """
    if isinstance(exc, TopologyConflictError):
        return EXIT_FOUND
    if isinstance(exc, (TopologyValidationError, ConfigurationError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, (InvalidPayloadError, PublishError)):
        # the outcome is unknown (no confirm, closed under it), or an alarm blocks publishers: the broker's side
        return EXIT_BROKER if type(exc) is PublishError or isinstance(exc, BrokerBlockedError) else EXIT_BAD_INPUT
    if isinstance(exc, BusyError):
        return EXIT_BUSY
    if isinstance(exc, _SERVICES):
        return EXIT_BROKER
    if isinstance(exc, OSError):  # files given on the command line
        return EXIT_BAD_INPUT
    return 1
