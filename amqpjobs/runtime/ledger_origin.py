"""A ledger new at a worker's start: the app's first, or one that replaced a lost ledger (README "Idempotency").

A SQLite ledger file missing when the app is loaded is created empty: rightly on the first
start, wrongly when a ledger was in use and its file is lost (deleted, another path after a
deploy, a new container without its volume): every done-mark is gone, and a redelivered or
replayed idempotent job would run its effect again. The same holds for a PostgreSQL ledger
whose table is missing (another database after a deploy, a restore without it).

The two cases can only be told apart by something that outlives the ledger and belongs to
the jobs whose redeliveries are at stake: the broker. A ledger created by its open notes when
and by whom in a table of its own (``amqpjobs_ledger_origin``, a row that stays *unconfirmed*).
A worker that starts on such a ledger looks for the app's marker, the durable queue
``amqpjobs.ledger.<app>`` in the app's vhost (a quorum queue: :mod:`amqpjobs.topology.ledger_marker`):

* missing: this is the app's first ledger; the worker declares the marker, confirms the
  ledger, and says where it created it (INFO);
* present: the app had a ledger before, so this one replaced a lost one: the worker refuses
  to start (:class:`~amqpjobs.errors.ConfigurationError`, exit 2), naming the ledger and the
  fixes, unless told to begin a new ledger knowingly (``WorkerOptions(new_ledger=True)``,
  ``consume --new-ledger``), which confirms it;
* not known (a classic marker of an earlier version on a node that is down, the connection
  lost): the start is refused too (:class:`~amqpjobs.errors.BrokerError`), to be tried again.

A ledger found established (no unconfirmed row; every ledger made before this rule) makes
sure the marker exists. The broker losing the marker too (a new broker) loses the messages
whose redeliveries were at stake with it.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, Protocol, runtime_checkable

from amqpjobs.errors import BrokerError, ConfigurationError
from amqpjobs.jobs.registry import DEFAULT_APP_NAME
from amqpjobs.runtime.ledger_key import seal_key_of
from amqpjobs.topology.declarations import QueueDecl
from amqpjobs.topology.ledger_marker import ledger_marker, legacy_note, to_quorum
from amqpjobs.topology.naming import app_names_problem
from amqpjobs.wire import ticks
from amqpjobs.wire.errors import access_refused

log = logging.getLogger("amqpjobs.worker")

#: The table in which a ledger created by its open notes it (SQLite and PostgreSQL alike).
ORIGIN_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS amqpjobs_ledger_origin "
    "(created_at DOUBLE PRECISION NOT NULL, created_by TEXT NOT NULL, confirmed_at DOUBLE PRECISION)"
)


def marker_queue(app: str) -> str:
    """The broker's marker that app ``app`` has had a ledger: ``amqpjobs.ledger.<app>`` (its home: naming)."""
    return ledger_marker(app).name


def creator() -> str:
    """Who creates a ledger: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def origin_words(created_at: float, created_by: str) -> str:
    """``created 2026-12-05T19:40:02Z by host:pid``."""
    return f"created {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(created_at))} by {created_by}"


_TABLES: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('amqpjobs_ledger', 'amqpjobs_ledger_origin')"
)


def sqlite_schema(db: sqlite3.Connection, schema: str) -> None:
    """Create the ledger's table when missing, noting in the same transaction that this open created it.

    Only a read when both tables are there: a process starting while a ``ctx.transaction()``
    holds the file's write lock does not wait for it.
    """
    if len(db.execute(_TABLES).fetchall()) == 2:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'amqpjobs_ledger'").fetchone()
        db.execute(schema)
        db.execute(ORIGIN_TABLE)
        if found is None:
            db.execute("INSERT INTO amqpjobs_ledger_origin (created_at, created_by) VALUES (?, ?)",
                       (time.time(), creator()))  # fmt: skip
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


#: The unconfirmed row, if any (both backends; no placeholders).
UNCONFIRMED: Final = (
    "SELECT created_at, created_by FROM amqpjobs_ledger_origin WHERE confirmed_at IS NULL ORDER BY created_at LIMIT 1"
)


def sqlite_unconfirmed(connect: Callable[[], sqlite3.Connection]) -> str | None:
    """:meth:`NewLedger.unconfirmed` of a SQLite ledger (``connect``: the calling thread's connection)."""
    row = connect().execute(UNCONFIRMED).fetchone()
    return None if row is None else origin_words(float(row[0]), str(row[1]))


def sqlite_confirm(connect: Callable[[], sqlite3.Connection]) -> None:
    """:meth:`NewLedger.confirm` of a SQLite ledger."""
    connect().execute("UPDATE amqpjobs_ledger_origin SET confirmed_at = ? WHERE confirmed_at IS NULL", (time.time(),))


#: What to do once a ledger began with ``--new-ledger``, and why (:data:`LEFT_ON`).
TAKE_OUT: Final = "take --new-ledger out of the worker's command"
#: Why ``--new-ledger`` must not stay in a worker's command (a unit file, a container's args).
LEFT_ON: Final = (
    "while it stays, a ledger lost later is begun anew instead of refused, and the jobs it had marked done may "
    "run again"
)


@runtime_checkable
class NewLedger(Protocol):
    """A ledger that knows whether it was created by its open and not yet confirmed (both backends)."""

    #: Where the ledger is, for messages: ``SQLite ledger at /path``, ``PostgreSQL ledger (database db on h:5432)``.
    where: str

    async def unconfirmed(self) -> str | None:
        """How the ledger was created (:func:`origin_words`) while not yet confirmed; None once established."""

    async def confirm(self) -> None:
        """Mark the ledger established: the app's ledger from now on."""


async def check_new_ledger(
    ledger: object, app: str, connection: Any, vhost: str, new_ledger: bool, aside: Aside | None = None
) -> None:
    """Refuse a new ledger when the app had one before; otherwise confirm it and keep the marker (module docstring).

    Args:
        ledger: The app's ledger (one that is no :class:`NewLedger` is left alone).
        app: The app's name.
        connection: A broker connection (the app's vhost).
        vhost: The vhost, for messages.
        new_ledger: Begin a new ledger knowingly, though the app had one (``consume --new-ledger``).
        aside: Opens a connection of its own for the marker's declare (:func:`_keep`); None: ``connection``.

    Raises:
        ConfigurationError: the ledger is new and the app had one before, or the app's name
            can't go into the marker's name (:func:`~amqpjobs.topology.naming.app_names_problem`).
        BrokerError: the ledger is new and the broker can't say whether the marker exists
            (a classic marker's node down, the connection lost): start again once it answers.

    A marker the broker refuses to show or declare (a user without configure or read
    permission on it) is warned about, and the start goes on unchecked.
    """
    if not isinstance(ledger, NewLedger):
        return
    marker = ledger_marker(app)
    if problem := app_names_problem(app, (marker.name,), "ledger marker"):
        raise _final(ConfigurationError(problem))
    created = await ledger.unconfirmed()
    if created is None:
        if new_ledger:
            log.warning("--new-ledger had nothing to begin here: the %s is app %s's own ledger already (since "
                        "an earlier start, or begun by another process of this one under --processes). %s",
                        ledger.where, app, f"{TAKE_OUT.capitalize()}: {LEFT_ON}")  # fmt: skip
        await _keep(connection, marker, app, vhost, aside)  # a ledger made before this rule, a marker deleted since
        return
    try:
        had_one = await ticks.probe(connection, marker.name, f"looking for queue {marker.name}") != "missing"
    except BrokerError as exc:
        if access_refused(exc):  # a user without the permissions: the start goes on unchecked, said once
            _unmarked(app, marker.name, exc)
            return
        if not new_ledger:
            raise BrokerError(
                f"can't tell whether app {app!r} had a ledger before: the {ledger.where} is new ({created}), and "
                f"{exc}. Start again once the broker answers for queue {marker.name} (a node of the cluster that "
                "is down: once it is back); nothing is consumed meanwhile. To begin with an empty ledger "
                "knowingly, start one worker with --new-ledger (WorkerOptions(new_ledger=True))"
            ) from exc
        had_one = True  # --new-ledger: begun whatever the marker says
    if had_one and not new_ledger:
        if await ledger.unconfirmed() is None:  # another process of this start (--processes) confirmed it meanwhile
            return
        raise _final(
            ConfigurationError(
                f"the {ledger.where} is new ({created}), but app {app!r} had a ledger before (queue {marker.name} in "
                f"vhost {vhost!r} marks it): its done-marks are lost, and a redelivered or replayed idempotent job "
                "would run its effect again. Point the app at the ledger it had (the path or database after a deploy, "
                "the container's volume), or restore it from a backup, and start again; to begin with an empty "
                "ledger knowingly, start one worker with --new-ledger (WorkerOptions(new_ledger=True))"
                + (_UNNAMED_REFUSED.format(vhost=vhost) if app == DEFAULT_APP_NAME else "")
            )
        )
    await ledger.confirm()  # before the marker: a process that finds the marker then finds it confirmed
    marked = await _keep(connection, marker, app, vhost, aside)
    if had_one:
        log.warning("began a new %s for app %s (--new-ledger; %s): the jobs it had marked done may run again; "
                    "%s now (%s)", ledger.where, app, created, TAKE_OUT, LEFT_ON)  # fmt: skip
    else:
        mark = f"queue {marker.name} marks it on the broker" if marked else "the broker holds no mark of it yet"
        log.info("created a new %s for app %s (%s; its first ledger: %s)", ledger.where, app, created, mark)
        if app == DEFAULT_APP_NAME:
            log.warning("app %s has the default name (App() given no name): queue %s marks the ledger of every app "
                        "left unnamed in vhost %r, so a second one's first start is refused as a lost ledger; give "
                        "each app its own name, App('billing', ...), before its first start", app, marker.name,
                        vhost)  # fmt: skip


#: The refusal's last words for an app of the default name (``.format(vhost=...)``).
_UNNAMED_REFUSED: Final = (
    ". App 'amqpjobs' is the default name (App() given no name): if the ledger before is another app's, also left "
    "unnamed in vhost {vhost!r}, neither ledger is lost: give each app its own name, App('billing', ...) (its "
    "marker, its scheduler's queues go by it), and start again"
)


def _final(refusal: ConfigurationError) -> ConfigurationError:
    """``refusal`` marked :attr:`~amqpjobs.errors.AmqpJobsError.final`: no restart changes it, an operator must act."""
    refusal.final = True
    return refusal


def _unmarked(app: str, marker: str, exc: BrokerError) -> None:
    fix = (f"give this user configure and read permission on queue {marker}" if access_refused(exc)
           else "the next start that reaches it keeps it")  # fmt: skip
    log.warning("can't keep the broker's mark of app %s's ledger (%s): a ledger lost later can't be told from a "
                "first start; %s", app, exc, fix)  # fmt: skip


async def _keep(connection: Any, marker: QueueDecl, app: str, vhost: str, aside: Aside | None) -> bool:
    """Declare the marker (found in its legacy shape: said at INFO); whether the broker holds it now.

    The quorum declare goes on a connection of its own (``aside``): a cluster without a majority
    can't make a new quorum queue, and RabbitMQ 3.10 then closes the connection it was asked on
    (after 15 s, ``541 INTERNAL_ERROR ... cluster_not_formed``; measured on scripts/cluster.sh
    with 2 of 3 nodes down), which a worker's start did not survive. The marker is then
    declared in its classic legacy shape on ``connection`` (a WARNING says so). A broker error
    other than that is warned about (:func:`_unmarked`).
    """
    try:
        shape = await _declare_aside(aside, marker) if aside is not None else None
        shape = shape or await ticks.declare_or_legacy(connection, marker)
    except BrokerError as exc:
        legacy = marker.legacy_shape()
        if access_refused(exc) or legacy is None:
            _unmarked(app, marker.name, exc)
            return False
        try:
            await ticks.declare_or_legacy(connection, legacy)
        except BrokerError as again:
            _unmarked(app, marker.name, again)
            return False
        log.warning("declared queue %s classic: the broker could not make it a quorum queue (%s). It marks app %s's "
                    "ledger all the same, but on one node. %s", marker.name, exc, app,
                    to_quorum(marker.name, shlex.quote(vhost)))  # fmt: skip
        return True
    if shape == "legacy":
        log.info("ledger marker: %s", legacy_note(marker.name).replace("<vhost>", shlex.quote(vhost)))
    elif shape == "other":
        log.warning(
            "queue %s is no ledger marker as amqpjobs declares it (quorum, x-max-length 0) but exists, so "
            "it marks app %s's ledger all the same; a job or message put into it is lost",
            marker.name,
            app,
        )
    return True


#: Opens a connection of its own, for :func:`_keep` (the worker's: its broker settings, no retry).
Aside = Callable[[], Awaitable[Any]]


async def _declare_aside(aside: Aside, marker: QueueDecl) -> Literal["declared", "legacy", "other"] | None:
    """:func:`~amqpjobs.wire.ticks.declare_or_legacy` on a connection of its own; None when it can't be opened."""
    try:
        side = await aside()
    except BrokerError:
        return None  # the worker's own connection declares it then
    try:
        return await ticks.declare_or_legacy(side, marker)
    finally:
        await ticks.close_quietly(side)


async def start_ledger(
    ledger: object, app: str, connection: Any, vhost: str, new_ledger: bool, aside: Aside | None = None
) -> bytes | None:
    """A worker's start with its ledger: open it, :func:`check_new_ledger`, and read its seal key.

    Returns:
        The key that seals a waiting suspect's start (:mod:`amqpjobs.runtime.ledger_key`), or None.

    Raises:
        The errors of the ledger's ``open`` and of :func:`check_new_ledger`.
    """
    opener = getattr(ledger, "open", None)
    if opener is not None:
        await opener()
    await check_new_ledger(ledger, app, connection, vhost, new_ledger, aside)
    return await seal_key_of(ledger)
