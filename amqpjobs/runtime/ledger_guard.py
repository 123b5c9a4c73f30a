"""Inside ``ctx.transaction()`` the effect and the done-mark commit together: a handler must not end it itself.

:class:`TransactionGuard` refuses it on SQLite; :func:`ended_inside` is the run's error on both
backends (:mod:`amqpjobs.runtime.ledger`, :mod:`amqpjobs.runtime.ledger_postgres`).
"""

from __future__ import annotations

import sqlite3

from amqpjobs.errors import ConfigurationError


class TransactionGuard:
    """A SQLite authorizer (``Connection.set_authorizer``) refusing statements that end or begin a transaction.

    Inside ``ctx.transaction()`` the effect and the job's done-mark commit together when the
    block ends; a ``COMMIT`` of the handler's own (``db.commit()``, ``executescript``, raw
    SQL) would split them (https://www.sqlite.org/c3ref/set_authorizer.html: action
    ``SQLITE_TRANSACTION``). Savepoints stay the handler's.
    """

    def __init__(self) -> None:
        self.tried = False
        self.closed = False  # the handler closed the connection

    def __call__(self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        """Deny ``SQLITE_TRANSACTION`` (and note it was tried); allow the rest."""
        if action == sqlite3.SQLITE_TRANSACTION:
            self.tried = True
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    @staticmethod
    def error(key: str) -> ConfigurationError:
        """What the run fails with (:func:`ended_inside`)."""
        return ended_inside(key, "COMMIT, ROLLBACK, BEGIN or executescript")


def ended_inside(key: str, how: str, after: str = "") -> ConfigurationError:
    """The error of a run whose handler ended ``ctx.transaction()``'s transaction itself (``how``: by what).

    ``key``: the job id (the idempotency key); the quarantine evidence names the job.

    A permanent failure: its job is quarantined with it at once (:func:`amqpjobs.jobs.failure.classify`),
    and no retry repeats what may have been committed. ``after``: what to check before a replay.
    """
    return ConfigurationError(
        f"job id {key!r}: ctx.transaction() commits the effect with the job's done-mark when its with block ends; "
        f"the handler tried to end the transaction itself ({how}): remove that{after}"
    )
