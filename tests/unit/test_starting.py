"""A start given up by a stop request (runtime/starting.py): the start is cancelled, and the AMQP client's
lines about the calls that cancellation cut short are not logged (the worker's own line says what happened)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from amqpjobs.runtime.starting import start_unless_stopped


async def test_a_stop_while_starting_cancels_the_start_and_silences_the_clients_channel_lines(
    caplog: pytest.LogCaptureFixture,
):
    cancelled = asyncio.Event()

    async def start() -> None:
        try:
            await asyncio.sleep(60)  # waiting for Channel.Open, say
        except asyncio.CancelledError:
            # what aiormq logs when an RPC of a channel is cancelled (aiormq/channel.py)
            logging.getLogger("aiormq.channel").warning("Closing channel %r because RPC call %r cancelled", 2, "Open")
            cancelled.set()
            raise

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    with caplog.at_level(logging.INFO):  # at DEBUG (-v) they are kept
        started = await start_unless_stopped(start(), stop)
    assert started is False
    assert cancelled.is_set()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("aiormq")] == []
    logging.getLogger("aiormq.channel").warning("after the start: logged again")
    assert [r.getMessage() for r in caplog.records if r.name == "aiormq.channel"] == ["after the start: logged again"]


async def test_a_start_that_ends_first_returns_true_and_raises_its_error():
    async def fails() -> None:
        raise RuntimeError("no such queue")

    with pytest.raises(RuntimeError, match="no such queue"):
        await start_unless_stopped(fails(), asyncio.Event())

    async def quick() -> None:
        return None

    assert await start_unless_stopped(quick(), asyncio.Event()) is True
