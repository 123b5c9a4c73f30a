"""What the worker says when a delivery's ack finds its channel closed (amqpjobs.runtime.fallback.ack)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from amqpjobs.runtime.fallback import ack
from amqpjobs.wire.acks import DeliveryChannelClosed


class ClosedChannelDelivery:
    """A delivery whose channel closed: its ack raises, as the wire's does."""

    def __init__(self) -> None:
        self.acks: list[bool] = []

    async def ack(self, at_once: bool = False) -> None:
        self.acks.append(at_once)
        raise DeliveryChannelClosed("channel 3 is closed")


@pytest.mark.parametrize(
    ("copied", "says"),
    [
        (True, "the copy already published makes this a duplicate the handler must tolerate"),
        (False, "no copy was made: it is handled again, unless its queue was deleted"),
    ],
)
def test_a_refused_ack_says_whether_a_copy_exists(copied: bool, says: str, caplog: pytest.LogCaptureFixture) -> None:
    delivery = ClosedChannelDelivery()
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        acked = asyncio.run(ack(delivery, "job-7", copied=copied))  # type: ignore[arg-type]
    assert acked is False
    assert delivery.acks == [copied]  # a confirmed copy's ack goes at once, a plain one may be batched
    assert [r.getMessage() for r in caplog.records] == [
        f"job job-7: its channel closed before the ack; the broker redelivers it ({says})"
    ]
