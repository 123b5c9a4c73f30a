"""What of an :class:`~amqpjobs.runtime.app.App` is bound to the event loop it connected on (README "Enqueueing").

An aio-pika connection, its channels and the ``queued`` writer live on one loop: used from
another they fail (``Event loop is closed``) or, worse, run callbacks on a loop that is not
running. An App is bound to the loop it connected on; another loop gets a copy
(:func:`copy_for_another_loop`, the sync publisher's), or the App is closed first.
"""

from __future__ import annotations

import asyncio
import copy
from typing import TYPE_CHECKING

from amqpjobs.errors import ConfigurationError

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App


def on_an_ended_loop(app: App) -> bool:
    """Whether ``app``'s connection lives on an event loop that has ended (not the running one; it can't be used).

    Raises:
        ConfigurationError: it lives on another thread's loop, still running.

    """
    there = app._connected_on
    if app._connection is None or there is None or there is asyncio.get_running_loop():
        return False
    if there.is_closed():
        return True
    raise ConfigurationError(
        f"app {app.name!r} is connected to the broker on the event loop of another thread; an App is bound to "
        "the event loop it connected on: give each thread's loop its own app.for_another_loop() copy, or from "
        "synchronous code use app.sync_publisher()"
    )


def refuse_another_loop(app: App) -> None:
    """Refuse to use ``app``'s connection from a loop other than its own (before :meth:`App.connect`).

    Raises:
        ConfigurationError: it lives on an event loop that has ended, or on another thread's.

    """
    if on_an_ended_loop(app):
        raise ConfigurationError(
            f"app {app.name!r} connected to the broker on an event loop that has ended (an earlier asyncio.run()); "
            "an App is bound to the event loop it connected on: await app.close() before that loop ends (the next "
            "enqueue connects again, on its own loop), or run the program's async work under one asyncio.run(); "
            "from synchronous code use app.sync_publisher()"
        )


def forget_an_ended_loop(app: App) -> None:
    """Drop ``app``'s connection when it lives on an event loop that has ended: it can't be closed from this one.

    Its management API clients are closed; the AMQP connection ends when Python frees its socket
    (the broker logs it as closed without ``connection.close``). The next enqueue connects on the
    running loop.

    Raises:
        ConfigurationError: it lives on another thread's loop, still running.

    """
    if on_an_ended_loop(app):
        if app._gate is not None:
            app._gate.close()
        app._publisher = app._connection = app._gate = app._connect_lock = app._connected_on = None


def copy_for_another_loop(app: App, url: str | None) -> App:
    """:meth:`App.for_another_loop`: the one home of "what carries over" to another loop."""
    twin = copy.copy(app)
    twin._url = url or app._url
    twin._role = "sync-publisher-thread"  # its connection named apart from the app's (README "Enqueueing")
    twin.ledger = None
    twin.results = app.results.copy() if app.results is not None else None
    twin.payload_store = app.payload_store.copy() if app.payload_store is not None else None
    twin._connection = twin._publisher = twin._gate = twin._connect_lock = twin._connected_on = None
    twin._publisher_loop = twin._routed_version = None
    twin._markers = None
    twin._queued_writer = None
    return twin
