"""Publishes a resource alarm holds unread: their late answers logged, and what a publisher's close does with them.

Under a memory or disk alarm RabbitMQ stops reading a blocked publishing connection: what it had not
read is held, and stored once the alarm clears if the connection is still open then; a reset drops it
(:mod:`amqpjobs.wire.reset`). The one home of two rules both publish paths follow (README "Backpressure"):

- a publish held past its confirm wait gets one line once the broker answers (:func:`log_late_answer`):
  INFO confirmed, WARNING nacked, returned or lost; the sync path's held connections
  (:mod:`amqpjobs.runtime.sync_held`) and the app's channel (:func:`watch_late_answer`) alike;
- a close finds the connection blocked: it waits up to its ``held_wait`` for the alarm to clear, then
  resets the connection (so what was held is dropped, never stored behind the caller's back) and says
  so in one WARNING naming the jobs (:func:`dropped_at_close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Final

import aiormq
from aiormq.exceptions import DeliveryError, PublishError

from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.alarms import BLOCKED_RECHECK, blocked_by
from amqpjobs.wire.publish_outcome import job_words

log = logging.getLogger("amqpjobs.publisher")

#: The answers, as both publish paths word them.
CONFIRMED: Final = "confirmed (stored)"
NACKED: Final = "nacked (not stored)"
RETURNED: Final = "returned: unroutable (not stored)"

#: Default seconds a publisher's close waits for a resource alarm to clear before it resets the connection.
HELD_WAIT: Final = 5.0

#: Channels whose connection a close resets: the close's WARNING speaks for their held publishes.
_RESET: weakref.WeakSet[aiormq.Channel] = weakref.WeakSet()


def lost(exc: BaseException | str) -> str:
    """The answer of a held publish whose connection was lost before the broker answered."""
    return f"lost with its connection ({exc}): it may or may not be stored"


def log_late_answer(job: str, since: float, outcome: str) -> None:
    """Log the broker's answer to a publish a resource alarm held past its confirm wait (``since``: monotonic s).

    INFO when ``outcome`` is :data:`CONFIRMED`, else WARNING:
    ``job 'j1' (work), held by a resource alarm past its confirm wait 41.2s ago, was confirmed (stored)``.
    """
    level = logging.INFO if outcome == CONFIRMED else logging.WARNING
    log.log(level, "%s, held by a resource alarm past its confirm wait %.1fs ago, was %s",
            job, time.monotonic() - since, outcome)  # fmt: skip


def _answer(answer: asyncio.Future[Any]) -> str:
    if answer.cancelled():
        return lost("closed")
    exc = answer.exception()
    if exc is None:
        return CONFIRMED
    if isinstance(exc, PublishError):  # aiormq's basic.return
        return RETURNED
    if isinstance(exc, DeliveryError):  # a basic.nack
        return NACKED
    return lost(exc)


def watch_late_answer(underlay: aiormq.Channel, tag: int, message: OutgoingMessage) -> bool:
    """Log the broker's late answer to ``message`` (delivery ``tag`` on ``underlay``): :func:`log_late_answer`.

    Its confirm wait ended (the waiting cancelled aiormq's future, which stays registered until the
    broker answers, and would then be dropped with a DEBUG line): a fresh future takes its place, and
    the returned message's id is matched to the tag again. Whether it is watched (False: answered already).
    """
    message_id, job = message.message_id, job_words(message)
    old = underlay.confirmations.get(tag)
    if not isinstance(old, asyncio.Future) or not old.cancelled():
        return False
    answer: asyncio.Future[Any] = underlay.create_future()
    underlay.confirmations[tag] = answer
    if message_id and message_id not in underlay.message_id_delivery_tag:
        underlay.message_id_delivery_tag[message_id] = tag

        def forget(_: asyncio.Future[Any]) -> None:
            if underlay.message_id_delivery_tag.get(message_id) == tag:
                del underlay.message_id_delivery_tag[message_id]

        answer.add_done_callback(forget)
    since = time.monotonic()

    def answered(done: asyncio.Future[Any]) -> None:
        if underlay not in _RESET:
            log_late_answer(job, since, _answer(done))

    answer.add_done_callback(answered)
    return True


def unanswered(underlay: aiormq.Channel) -> list[str]:
    """The message ids (job ids) of the publishes on ``underlay`` the broker has not answered yet, oldest first."""
    ids = {tag: message_id for message_id, tag in underlay.message_id_delivery_tag.items()}
    pending = [tag for tag, f in underlay.confirmations.items() if isinstance(f, asyncio.Future) and not f.done()]
    return [ids.get(tag, f"delivery tag {tag}") for tag in pending]


@dataclass(frozen=True)
class HeldAtClose:
    """A close that found its connection blocked by ``alarm`` after ``waited`` seconds, ``jobs`` still held unread."""

    alarm: str
    waited: float
    jobs: list[str]


async def held_at_close(
    connection: Connection, underlay: aiormq.Channel | None, held_wait: float
) -> HeldAtClose | None:
    """Wait up to ``held_wait`` seconds while a resource alarm blocks ``connection``; what it still holds then.

    None: not blocked (a close goes as ever), or the alarm cleared within the wait (its held publishes' answers
    are awaited, up to the rest of the wait and a second, so that a close cuts none off). Else the connection's
    close would be held unread like its publishes (RabbitMQ reads nothing of a blocked connection): the caller
    resets it (:func:`~amqpjobs.wire.reset.reset`).
    """
    started, was_blocked = time.monotonic(), blocked_by(connection) is not None
    while (alarm := blocked_by(connection)) is not None:
        if time.monotonic() - started >= held_wait:
            jobs = [] if underlay is None else unanswered(underlay)
            if underlay is not None:
                _RESET.add(underlay)
            return HeldAtClose(alarm, time.monotonic() - started, jobs)
        await asyncio.sleep(BLOCKED_RECHECK)
    if was_blocked and underlay is not None and not underlay.is_closed:  # what it held is read now: answered at once
        pending = [f for f in underlay.confirmations.values() if isinstance(f, asyncio.Future) and not f.done()]
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.wait(pending, timeout=max(0.0, held_wait - (time.monotonic() - started)) + 1.0)
    return None


def dropped_at_close(owner: str, held: HeldAtClose, was_reset: bool) -> None:
    """The WARNING of a close that reset its blocked connection (``was_reset``: the reset went) with ``held`` jobs."""
    count = len(held.jobs)
    if not count:
        return
    names = ", ".join(repr(job) for job in held.jobs[:10]) + (f" and {count - 10} more" if count > 10 else "")
    fate = (
        "the connection was reset, so the broker drops them: NOT stored; enqueue them again once the alarm clears"
        if was_reset else
        "the connection was closed, so the broker may store them once the alarm clears, or drop them: each "
        "may or may not be stored"
    )  # fmt: skip
    log.warning(
        "%s closed while a resource alarm (%s) blocked its connection: %d publish(es) held unread after its wait of "
        "%.1fs (job %s); %s", owner, held.alarm, count, held.waited, names, fate,
    )  # fmt: skip
