"""``ctx.transaction()`` of one delivery of an idempotent job (README "Idempotency: exactly-once effect").

The effect and the job's done-mark commit together, once: a second transaction after one
that committed is refused (the job counts as done, the rest of the run did not happen), as
is one opened inside another. A run whose transaction rolled back (it raised) committed
nothing; an immediate retry of it (``RetryPolicy.immediate_retries``) is a new run and gets
a transaction of its own (:meth:`RunTransaction.next_run`), and one that committed is never
run again in process: its effect is done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqpjobs.errors import ConfigurationError, DuplicateJobError
from amqpjobs.runtime.ledger import Ledger


class RunTransaction:
    """The ``ctx.transaction`` callable of one delivery's runs (its claim's ``key`` and ``owner``).

    Attributes:
        committed: A transaction committed the effect with the done-mark.
        found_done: A transaction found the job marked done by another run (it raised
            :class:`~amqpjobs.errors.DuplicateJobError`, the effect rolled back): the one way a run
            ends as a duplicate; the same error raised by the handler itself is its job's failure.
    """

    def __init__(self, ledger: Ledger, job: str, key: str, owner: str) -> None:
        self._ledger = ledger
        self._job = job
        self._key = key
        self._owner = owner
        self._used = False
        self.committed = False
        self.found_done = False

    @contextmanager
    def __call__(self) -> Iterator[Any]:
        """The ledger's transaction that also marks the job done (its database connection).

        Raises:
            ConfigurationError: one was opened already in this run (it committed, or is still open).
        """
        if self._used:
            raise ConfigurationError(
                f"job {self._job!r}: ctx.transaction() can be used once per run; "
                + ("the first one committed with the job's done-mark, so the job counts as done (a replay "
                   "acks it as a duplicate) and the rest of this run did not happen: " if self.committed else "")
                + "put the whole effect in one transaction"
            )  # fmt: skip
        self._used = True
        inside = False  # the block's own DuplicateJobError (the handler's) is not the ledger's word
        try:
            with self._ledger.transaction(self._key, self._owner) as db:
                try:
                    yield db
                except DuplicateJobError:
                    inside = True
                    raise
        except DuplicateJobError:
            self.found_done = not inside
            raise
        self.committed = True

    def next_run(self) -> bool:
        """An immediate retry is about to run the handler again: whether it may.

        False when a transaction committed (the effect is done: no run may follow in this
        process). Else True, and the next run may open a transaction of its own (the last
        one, if any, rolled back: nothing of it was kept).
        """
        if self.committed:
            return False
        self._used = False
        return True
