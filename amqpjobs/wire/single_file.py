"""One delivery at a time after a 541 INTERNAL_ERROR, so the message no client can receive reaches the head.

RabbitMQ closes a connection with 541 when it fails to send it a delivery: a message with a
short string over 255 bytes, taken in by the management API's HTTP publish (README "Wire
format"). Its unacked deliveries return to the queue *ahead of* that message (a classic queue
requeues to the original position: RabbitMQ "Consumer Acknowledgements and Publisher
Confirms", "Negative Acknowledgement and Requeuing"). With a prefetch of N the broker sends
them and the message together at the next consume, so the connection closes again before any
of them is acked, and a look at the queue's head finds a good job each time: no job runs.

Taking one delivery at a time (prefetch 1, or one ``basic.get`` token) after a 541, the message
is sent only once nothing else is unacked, so it is the head when the next 541 comes and the
look moves it (:mod:`amqpjobs.runtime.undeliverable`). That ends once the look moved a message,
or once ``wide`` deliveries came one at a time without a 541: at most ``wide - 1`` deliveries
were ahead of it, so it is no longer in the way.
"""

from __future__ import annotations


class SingleFile:
    """Whether a consumer of ``wide`` slots takes one delivery at a time now (module docstring).

    Pure state; the consumer applies it (``basic.qos`` 1, then its slots again under a new tag).
    """

    def __init__(self) -> None:
        self._wide: int | None = None  # the slots to go back to; None: not single file
        self._left = 0  # deliveries still to come one at a time

    @property
    def on(self) -> bool:
        """Whether deliveries come one at a time now."""
        return self._wide is not None

    def begin(self, wide: int) -> bool:
        """A 541 closed the connection: one at a time for the next ``wide`` deliveries (>= 1 slots).

        Returns:
            Whether this began it (a consumer of one slot already takes one at a time; a second 541
            while it is on only counts ``wide`` again).
        """
        if wide <= 1 and self._wide is None:
            return False
        began = self._wide is None
        self._wide = self._wide or wide
        self._left = self._wide
        return began

    def came(self) -> int | None:
        """One more delivery came one at a time; the slots to go back to when it was the last, else None."""
        if self._wide is None:
            return None
        self._left -= 1
        return self.end() if self._left <= 0 else None

    def end(self) -> int | None:
        """Stop now (the look moved the message); the slots to go back to, None when it was not on."""
        wide, self._wide, self._left = self._wide, None, 0
        return wide
