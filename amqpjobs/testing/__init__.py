"""Test your jobs without RabbitMQ, on the worker's and scheduler's own decision code.

Example::

    from amqpjobs.testing import TestBroker

    async def test_confirm(tmp_path):
        async with TestBroker(app) as broker:
            await app.enqueue("orders.confirm", {"order_id": 17, ...})
            await broker.drain()
        assert [p.job for p in broker.completed()] == ["orders.confirm"]

The in-memory broker (:mod:`.memory`, :mod:`.election`) implements the wire interface
(:mod:`amqpjobs.wire.abc`); README "Testing your jobs" lists where it differs from
RabbitMQ. It adds to real-broker tests, never replaces them. The pytest plugin
(:mod:`.plugin`) is registered by the ``pytest11`` entry point.
"""

from amqpjobs.testing.broker import TestBroker
from amqpjobs.testing.clock import VirtualClock
from amqpjobs.testing.records import Processed, QuarantinedMessage

__all__ = ["Processed", "QuarantinedMessage", "TestBroker", "VirtualClock"]
