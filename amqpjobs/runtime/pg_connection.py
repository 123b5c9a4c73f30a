"""One store's async PostgreSQL connection: opened on first use, reopened after a loss, tries paced.

The one home of these rules for the PostgreSQL ledger, results store and payload store:

* **Reopen**: a connection psycopg marks closed (it met a lost connection), or whose
  statement failed with ``OperationalError``, is dropped; the next use connects again.
* **Bounded**: a connect waits :data:`CONNECT_TIMEOUT` s at most, and so does each use of an
  open connection (its statements, its commit): past it the connection's socket is shut down
  (no cancel request: that needs a new connection, which a cut network leaves unanswered
  too), so the waiting statement fails as a lost connection, the store's "unavailable" error.
  A network cut that keeps the connection open but answers nothing is an outage like a reset.
* **Paced**: after a failed connect, the next is tried :data:`FIRST_PAUSE` s later, the
  pause doubling up to :data:`LONGEST_PAUSE` s; a use in between fails at once with the
  store's "unavailable" error, without touching the network. So N jobs waiting for the
  database make one connect attempt per pause, and a use succeeds at most
  :data:`LONGEST_PAUSE` s after the database is back.
* **Told once**: one WARNING when the database stops answering, one INFO when it answers
  again (with how long it was away), nothing per use in between.
* **A thread's connection** (:class:`ThreadConnections`, the ledger's ``transaction()`` for
  plain-function handlers): one per thread, replaced when closed, and replaced once when its
  ``BEGIN`` meets a lost connection (nothing of the caller's ran on it yet).
* **Bad settings are not an outage**: a DSN that is no PostgreSQL connection string (or
  names a port that is no number) raises :class:`~amqpjobs.errors.ConfigurationError`.

Needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager
from typing import Any

from amqpjobs.errors import ConfigurationError
from amqpjobs.text import a_type, ascii_digits, one_line, url_text_problem

#: Seconds to wait for the database at most: a connect (libpq ``connect_timeout``), and each use of an
#: open connection (:meth:`PgConnection.use`: its statements and commit), then it counts as away.
CONNECT_TIMEOUT = 5
#: Seconds between a failed connect and the next try; doubled after each failure up to :data:`LONGEST_PAUSE`.
FIRST_PAUSE = 0.25
#: The longest pause (seconds) between two connect attempts while the database is down.
LONGEST_PAUSE = 2.0
#: Rows one prune statement deletes at most: each batch is one use (bounded by :data:`CONNECT_TIMEOUT`),
#: so a large backlog is pruned in turns, and claims and done-marks get the connection between two batches.
PRUNE_BATCH = 2000

log = logging.getLogger("amqpjobs.stores")


def psycopg_module(what: str) -> Any:
    """The ``psycopg`` module.

    Raises:
        ConfigurationError: it is not installed (``what`` names the class that needs it).
    """
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(f"{what} needs psycopg: pip install 'amqpjobs[postgres]'") from exc
    return psycopg


def dsn_problem(dsn: object) -> str | None:
    """What is wrong with ``dsn`` as a PostgreSQL connection string, or None; never shows the password.

    libpq takes a URI whose scheme is ``postgresql://`` or ``postgres://``, or ``keyword=value``
    pairs (PostgreSQL docs "Connection Strings"). An empty string would connect to libpq's
    defaults (``PG*`` variables, the local socket): refused, it is almost always a missing setting.
    A string libpq can't parse, or whose port is no number, is a problem too.
    """
    if not isinstance(dsn, str):
        return f"is {a_type(dsn)}, not a str"
    if not dsn.strip():
        return "is empty"
    uri = "://" in dsn
    if problem := url_text_problem(
        dsn.strip(), blanks=uri, what="a connection string has none" if not uri else "a URL has none (%-encode it)"
    ):
        return problem.removeprefix("it ")
    if uri:
        scheme = dsn.split("://", 1)[0]
        if scheme.lower() not in ("postgresql", "postgres"):
            shown = repr(scheme) if scheme.isascii() and scheme.replace("+", "").isalnum() else "not postgresql"
            return f"has scheme {shown}: not a PostgreSQL URL"
    elif "=" not in dsn:
        return "is not a URL (postgresql://...) nor keyword=value pairs (host=... dbname=...)"
    try:
        from psycopg.conninfo import conninfo_to_dict

        port = str(conninfo_to_dict(dsn).get("port") or "")
    except ImportError:  # pragma: no cover - the store's own check names the extra
        return None
    except Exception:  # libpq's parser refused it: its message may quote the password
        return "can't be parsed as a PostgreSQL connection string"
    if port and not all(ascii_digits(p.strip()) for p in port.split(",")):
        return "names a port that is not a number"
    return None


UNREACHABLE = "is unreachable"
REFUSED_SETTING = (
    "can't connect: its connection string has a setting libpq refuses; fix that setting in the DSN "
    '(PostgreSQL docs "Parameter Key Words")'
)


def refused_setting(exc: BaseException) -> bool:
    """Whether libpq refused the connection string before sending anything (a bad option value).

    psycopg says so as ``connection is bad: ...invalid sslmode value: ...`` (libpq's
    ``PQconnectStart`` gave ``CONNECTION_BAD`` at once), or raises ``ProgrammingError`` for an
    option libpq does not know. A host that does not answer, a refused login or TLS says
    ``connection failed: ...``: those are outages or credentials, not the string's syntax.
    """
    said = str(exc)
    return type(exc).__name__ == "ProgrammingError" or (said.startswith("connection is bad:") and "invalid " in said)


def shut(conn: Any) -> None:
    """Shut the socket of the psycopg connection ``conn`` down, both ways (nothing when it has none).

    Its waiting statement then fails at once as a lost connection (``OperationalError``);
    the connection is not closed (its owner closes it), so the descriptor is not freed under
    a waiting reader.
    """
    with contextlib.suppress(Exception), socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def deadline(conn: Any, seconds: float) -> Iterator[list[float]]:
    """Within the block, ``conn`` (psycopg, async) gets ``seconds`` to answer, then :func:`shut`.

    Yields a list that holds the seconds waited once the deadline passed (empty before).
    """
    expired: list[float] = []

    def expire() -> None:
        expired.append(seconds)
        shut(conn)

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield expired
    finally:
        handle.cancel()


@contextlib.contextmanager
def thread_deadline(conn: Any, seconds: float, what: str) -> Iterator[None]:
    """Within the block, ``conn`` (psycopg, sync, this thread's) gets ``seconds`` to answer, then :func:`shut`.

    Raises:
        psycopg.OperationalError: (from the block, once the deadline passed) saying ``what`` got no answer.
    """
    psycopg = psycopg_module(what)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        shut(conn)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.OperationalError as exc:
        if not expired.is_set():
            raise
        raise psycopg.OperationalError(f"{what} got no answer within {seconds}s: its connection was closed") from exc
    finally:
        timer.cancel()


class PgConnection:
    """The async connection of one store, under a lock (one statement or transaction at a time).

    Args:
        dsn: libpq connection string or URL.
        owner: The store's class name, for the message about a bad ``dsn``.
        what: The store in words, for messages and log lines (``"the PostgreSQL ledger"``).
        schema: Statements run after each connect (``CREATE TABLE IF NOT EXISTS ...``).
        unavailable: Builds the store's error for "the database can't be reached now" from a message.

    Raises:
        ConfigurationError: ``dsn`` is not a PostgreSQL connection string (at once).
    """

    def __init__(
        self, dsn: str, owner: str, what: str, schema: Sequence[str], unavailable: Callable[[str], Exception]
    ) -> None:
        self.what = what
        self._owner = owner
        if problem := dsn_problem(dsn):
            raise ConfigurationError(
                f"{owner}(dsn=...) {problem}: give the database's URL, "
                "postgresql://user:password@host:5432/dbname (or libpq keyword=value pairs)"
            )
        self.dsn = dsn
        self._schema = tuple(schema)
        self._unavailable = unavailable
        self._conn: Any = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._down_since: float | None = None  # monotonic time it stopped answering
        self._pause = 0.0
        self._next_try = 0.0
        self._why = ""
        self._state = UNREACHABLE

    def _locked(self) -> asyncio.Lock:
        """The lock of the running event loop (a CLI may use a store from one loop after another)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    @property
    def down(self) -> bool:
        """True while the database is known not to answer (since a failure, until a connect succeeds)."""
        return self._down_since is not None

    async def open(self) -> None:
        """Connect (when not connected) and run the schema statements.

        Raises:
            Exception: the store's ``unavailable`` error: the database can't be reached (now, or
                since a failure less than the current pause ago: not tried again yet).
        """
        async with self._locked():
            await self._connect()

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Any]:
        """The open psycopg ``AsyncConnection``, held alone for the ``async with`` block.

        A lost connection inside the block is dropped (the next use reconnects) and raised as
        the store's ``unavailable`` error; so is a block that got no answer within
        :data:`CONNECT_TIMEOUT` s (its socket is shut down); other errors (a refused value) pass through.
        """
        psycopg = psycopg_module(self.what)
        async with self._locked():
            await self._connect()
            conn = self._conn
            with deadline(conn, CONNECT_TIMEOUT) as expired:
                try:
                    yield conn
                except psycopg.Error as exc:
                    if not expired and (not isinstance(exc, psycopg.OperationalError) or not conn.closed):
                        raise  # the database answered (a cancelled statement, a lock timeout): no outage
                    await self._drop()
                    if expired:
                        why = f"got no answer within {CONNECT_TIMEOUT}s: its connection was closed"
                        self._went_down(why, pause=0.0)
                        raise self._unavailable(f"{self.what} {why}") from exc
                    self._went_down(
                        one_line(exc), pause=0.0
                    )  # reconnect at once on the next use: a restart may be over
                    raise self._unavailable(f"{self.what} lost its connection ({one_line(exc)})") from exc

    async def prune(self, table: str, where: str, params: tuple[Any, ...]) -> int:
        """Delete the rows of ``table`` matching ``where`` in batches of :data:`PRUNE_BATCH`; how many went.

        ``table`` and ``where`` are the store's own SQL (never user input); ``params`` fill ``where``'s ``%s``.

        Raises:
            The store's ``unavailable`` error, as :meth:`use` (the batches done stay done).
        """
        sql = f"DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE {where} LIMIT {PRUNE_BATCH})"
        total = 0
        while True:
            async with self.use() as conn:
                gone = int((await conn.execute(sql, params)).rowcount)
            total += gone
            if gone < PRUNE_BATCH:
                return total

    async def _connect(self) -> None:
        if self._conn is not None and not self._conn.closed:
            return
        await self._drop()
        now = time.monotonic()
        if self.down and now < self._next_try:
            raise self._unavailable(
                f"{self.what} {self._state} ({self._why}); down {now - (self._down_since or now):.1f}s, "
                f"next try in {self._next_try - now:.1f}s"
            )
        psycopg = psycopg_module(self.what)
        expired: list[float] = []
        try:
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                               connect_timeout=CONNECT_TIMEOUT)  # fmt: skip
            with deadline(self._conn, CONNECT_TIMEOUT) as expired:
                for statement in self._schema:
                    with contextlib.suppress(psycopg.errors.UniqueViolation):  # another process created it just now
                        await self._conn.execute(statement)
        except psycopg.Error as exc:
            await self._drop()
            why = f"got no answer within {CONNECT_TIMEOUT}s after connecting" if expired else one_line(exc)
            state = REFUSED_SETTING if refused_setting(exc) else UNREACHABLE
            self._went_down(why, pause=min(LONGEST_PAUSE, max(FIRST_PAUSE, 2 * self._pause)), state=state)
            raise self._unavailable(f"{self.what} {state} ({why})") from exc
        if self._down_since is not None:
            log.info("%s answers again after %.1fs", self.what, time.monotonic() - self._down_since)
        self._down_since, self._pause, self._why = None, 0.0, ""

    def _went_down(self, why: str, pause: float, state: str = UNREACHABLE) -> None:
        """Note a failure (``why``, one line): one line when the outage starts, then the next try after ``pause`` s."""
        now = time.monotonic()
        self._why, self._state = why, state
        if self._down_since is None:
            self._down_since = now
            log.warning("%s %s (%s)", self.what, state, self._why)
        self._pause = pause
        self._next_try = now + pause

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                await conn.close()

    async def close(self) -> None:
        """Close the connection (a later use opens a new one)."""
        await self._drop()

    def twin(self) -> PgConnection:
        """A connection of the same settings, not connected yet (for a store's copy on another event loop)."""
        return PgConnection(self.dsn, self._owner, self.what, self._schema, self._unavailable)


class ThreadConnections:
    """Synchronous connections, one per thread (handler threads), for transactions the caller fills.

    Their ``BEGIN`` and what :meth:`bounded` covers (the caller's closing statements and the
    commit or rollback) get :data:`CONNECT_TIMEOUT` s to answer; the caller's own statements
    in between are not bounded.

    Args:
        dsn: libpq connection string or URL (checked by the store's :class:`PgConnection`).
        owner: The store's class name (for the message when psycopg is missing).
        what: The store in words, for the message when the database does not answer.
    """

    def __init__(self, dsn: str, owner: str, what: str) -> None:
        self.dsn = dsn
        self._owner = owner
        self._what = what
        self._local = threading.local()
        self._all: list[Any] = []  # every thread's, to close
        self._all_lock = threading.Lock()

    def begin(self, stack: ExitStack) -> Any:
        """The calling thread's psycopg connection, in a transaction that ``stack`` ends (commit, or rollback).

        Raises:
            psycopg.OperationalError: the database can't be reached.
        """
        psycopg = psycopg_module(self._owner)
        for _ in range(2):  # the second time with a new connection
            conn: Any = getattr(self._local, "conn", None)
            fresh = conn is None or conn.closed
            if fresh:
                conn = self._local.conn = psycopg.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT)
                with self._all_lock:
                    self._all.append(conn)
            try:
                with self.bounded(conn):
                    stack.enter_context(conn.transaction())
                return conn
            except psycopg.OperationalError:
                if fresh or not conn.closed:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def bounded(self, conn: Any) -> contextlib.AbstractContextManager[None]:
        """A block in which ``conn`` gets :data:`CONNECT_TIMEOUT` s to answer, then its socket is shut down.

        Raises:
            psycopg.OperationalError: (from the block) no answer in time: "<what> got no answer within 5s: ...".
        """
        return thread_deadline(conn, CONNECT_TIMEOUT, self._what)

    def close(self) -> None:
        """Close every thread's connection (call when no transaction runs)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
