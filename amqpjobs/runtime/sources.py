"""What a worker takes deliveries from: a work queue's consumer, or a sharded job queue's dispatcher."""

from __future__ import annotations

from typing import Protocol


class Source(Protocol):
    """What the worker drives for each of its queues.

    A :class:`~amqpjobs.wire.consume.WorkQueueConsumer` (one work queue) or a
    :class:`~amqpjobs.runtime.dispatch.ShardDispatcher` (every shard of a job queue).
    """

    @property
    def queue(self) -> str:
        """The queue it takes from (a job queue's name for a dispatcher)."""
        ...

    @property
    def consuming(self) -> bool:
        """Whether it takes deliveries now."""
        ...

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped it on purpose."""
        ...

    async def start(self) -> None:
        """Start taking (after :meth:`pause`: only at :meth:`resume`)."""

    async def pause(self) -> None:
        """Stop taking; return once nothing more arrives."""

    async def resume(self) -> None:
        """Take again after :meth:`pause`."""

    async def cancel(self) -> None:
        """Stop taking for good; return once nothing more arrives."""

    async def settle(self) -> None:
        """Make sure the broker has every ack sent so far."""

    async def flush_acks(self) -> None:
        """Send the acks still batched."""

    def one_at_a_time(self) -> bool:
        """After a 541: one delivery at a time (:mod:`amqpjobs.wire.single_file`); whether this began it."""
        ...

    async def widen(self) -> None:
        """Take as many as its slots again after :meth:`one_at_a_time` (the message was moved)."""
