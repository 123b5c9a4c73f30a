"""What the end of an unconfirmed publish means, and the words for it (:mod:`amqpjobs.wire.publish`).

An enqueue error says "not stored" only when the broker said so for that publish (a return,
a nack, a 404 naming its own exchange); any other end of a publish sent but not confirmed is
uncertain (README "Enqueueing").
"""

from __future__ import annotations

import aiormq

from amqpjobs.message import OutgoingMessage


def heard_close(underlay: aiormq.Channel) -> bool:
    """Whether aiormq closed ``underlay``, or heard the broker's close (its ``close-ok`` queued, same step).

    A frame sent on a channel after its ``close-ok`` makes RabbitMQ close the whole connection
    (``504 CHANNEL_ERROR - expected 'channel.open'``). aiormq queues the ``close-ok`` in the step
    in which it reads the broker's close and notes the close in ``_close_exception``; a writer
    that checks this and queues its frames in one step (no await between) goes ahead of the
    ``close-ok`` (the broker ignores it) or not at all. ``is_closed`` alone is set a few steps later.
    (Should a later aiormq drop that attribute, only ``is_closed`` is checked: a crossing is possible again.)
    """
    return underlay.is_closed or getattr(underlay, "_close_exception", None) is not None


def uncertain(what_happened: str, message: OutgoingMessage) -> str:
    """The words of an unconfirmed publish whose outcome is unknown: it names the job, claims no failure."""
    job = f"job {message.message_id!r}" if message.message_id is not None else "the message"
    if message.type:
        job += f" ({message.type})"
    return (f"{what_happened}; {job} may or may not be stored (not confirmed): enqueueing it again may store it "
            "twice; with the same job id an idempotent job runs once")  # fmt: skip
