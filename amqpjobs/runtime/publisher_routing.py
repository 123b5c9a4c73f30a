"""Where an app's enqueues go when :mod:`amqpjobs.testing` stands in for the broker: the hooks the double sets.

:class:`~amqpjobs.runtime.app.App` enqueues through its own broker connection unless a
publisher was installed here (the test double's in-memory broker), and holds the overlap
guard's running markers on the double's queues when it gives its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from amqpjobs.wire.abc import Publisher, TickWire


class PublisherRouting:
    """The part of :class:`~amqpjobs.runtime.app.App` a test double uses to take its enqueues and markers."""

    _publisher: Publisher | None = None
    #: The event loop an installed publisher lives on (:meth:`use_publisher`'s ``loop``).
    _publisher_loop: asyncio.AbstractEventLoop | None = None
    #: The RabbitMQ version an installed publisher stands for (:meth:`use_publisher`'s ``broker_version``).
    _routed_version: tuple[int, ...] | None = None
    #: Where the overlap guard holds its markers instead of the app's broker (:meth:`use_markers`).
    _markers: tuple[TickWire, Any] | None = None

    def use_publisher(
        self,
        publisher: Publisher | None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        broker_version: tuple[int, ...] | None = None,
    ) -> Publisher | None:
        """Send every enqueue through ``publisher`` from now on; returns the publisher it replaces.

        :mod:`amqpjobs.testing` uses it to route ``enqueue`` (from handlers too) into its
        in-memory broker. ``None``: the next enqueue connects to the broker again.
        ``loop``: the event loop ``publisher`` lives on; while set, :meth:`sync_publisher`
        enqueues through it (from other threads) instead of connecting to a broker.
        ``broker_version``: the RabbitMQ version ``publisher`` stands for, whose refusals enqueue
        applies as on a broker of that version (:func:`~amqpjobs.jobs.enqueue_args.check_broker_priority`);
        None: none (the newest broker's behaviour).
        """
        previous, self._publisher = self._publisher, publisher
        self._publisher_loop = loop if publisher is not None else None
        self._routed_version = broker_version if publisher is not None else None
        return previous

    def use_markers(self, wire: TickWire | None, connection: Any = None) -> None:
        """Hold the overlap guard's running markers through ``wire`` on ``connection`` (None: on the app's broker).

        :mod:`amqpjobs.testing` uses it so ``overlap="skip"`` runs on its in-memory queues.
        """
        self._markers = None if wire is None else (wire, connection)
