"""One queue of the in-memory double: its messages, and the order they leave it in.

The order is the RabbitMQ one the double stands for (checked against RabbitMQ 3.10, 4.0.5
and 4.3.6 nodes by ``tests/integration/test_priority_contract.py``):

* a classic queue is FIFO, or with ``max_priority`` highest priority first (over the maximum
  as the maximum), FIFO within a priority; a requeued message goes back where it was (in
  publish order, whatever order several came back in);
* a quorum queue hands out what came back (a requeue, a closed channel's unacked delivery)
  before anything else, in the order it came back, whatever the priorities; then
  * before 4.0: FIFO (no priorities);
  * 4.0-4.2: two levels, 0-4 (or none) normal and 5+ high. Of every three messages taken,
    the first two are the oldest high ones and the third is the older of the two oldest,
    normal or high: while old normal messages wait, two high go for each normal one (the
    "about 2:1" of the release notes); a high one published before them all still goes
    first. The count of three runs on over the queue's life, not per batch;
  * 4.3+: strict priorities 0-31 (over 31 as 31, none as 4), FIFO within a priority;
    ``x-max-priority`` is ignored.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Final

from amqpjobs.message import OutgoingMessage
from amqpjobs.topology.versions import QUORUM_MAX_PRIORITY

_serial = itertools.count(1)

#: A 4.0-4.2 quorum queue's turns: the oldest message (normal or high) goes every this-many-th take.
TWO_LEVEL_TURNS: Final = 3
#: A 4.0-4.2 quorum queue's high level starts at this priority.
TWO_LEVEL_HIGH: Final = 5


@dataclass
class Stored:
    """A message in a queue: what was published, where, and when it expires (virtual seconds)."""

    message: OutgoingMessage
    exchange: str
    routing_key: str
    expires_at: float | None = None
    redelivered: bool = False
    serial: int = field(default_factory=lambda: next(_serial))
    #: It came back to a quorum queue (requeued): it leaves before anything else.
    returned: bool = False


@dataclass
class MemoryQueue:
    """One queue: its messages (oldest first, what came back to a quorum queue before them) and its arguments."""

    name: str
    max_priority: int | None = None
    message_ttl: float | None = None  # seconds
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_length: int | None = None
    overflow: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    messages: list[Stored] = field(default_factory=list)
    #: A quorum queue's priorities (``quorum_order``): None (classic: ``max_priority``), "fifo", "two", "strict".
    quorum: str | None = None
    #: Messages taken so far, modulo :data:`TWO_LEVEL_TURNS` (a 4.0-4.2 quorum queue's turn).
    turn: int = 0

    def put(self, stored: Stored, head: bool = False) -> None:
        """Add a message at the tail (``head``: it came back, a requeue).

        On a classic queue a message that came back goes back where it was (before the messages
        published after it, whatever order they came back in); on a quorum queue it goes after
        those that came back before it, and all of them leave before the rest.
        """
        if not head:
            self.messages.append(stored)
        elif self.quorum is None:  # back where it was: before every message published after it
            at = next((i for i, s in enumerate(self.messages) if s.serial > stored.serial), len(self.messages))
            self.messages.insert(at, stored)
        else:
            stored.returned = True
            back = next((i for i, s in enumerate(self.messages) if not s.returned), len(self.messages))
            self.messages.insert(back, stored)

    def _rank(self, priority: int | None) -> int | None:
        """Where a message of ``priority`` goes: higher first; None: FIFO (no priorities)."""
        if self.quorum == "strict":
            return min(4 if priority is None else priority, QUORUM_MAX_PRIORITY)
        if self.quorum == "two":
            return int((priority or 0) >= TWO_LEVEL_HIGH)
        if self.quorum is None and self.max_priority is not None:
            return min(priority or 0, self.max_priority)
        return None

    def _next(self) -> int:
        """The index of the next message out of a non-empty queue (what came back is taken apart)."""
        if self.quorum == "two":
            high = next((i for i, s in enumerate(self.messages) if self._rank(s.message.priority)), None)
            normal = next((i for i, s in enumerate(self.messages) if not self._rank(s.message.priority)), None)
            if high is None or normal is None:
                return 0
            return min(high, normal) if self.turn == TWO_LEVEL_TURNS - 1 else high
        index, best = 0, -1
        for i, s in enumerate(self.messages):
            rank = self._rank(s.message.priority)
            if rank is None:
                break
            if rank > best:
                best, index = rank, i
        return index

    def take(self) -> Stored | None:
        """The next message out (see the module docstring for the order), or None when the queue is empty."""
        if not self.messages:
            return None
        if self.messages[0].returned:
            stored = self.messages.pop(0)
        else:
            stored = self.messages.pop(self._next())
            self.turn = (self.turn + 1) % TWO_LEVEL_TURNS
        stored.returned = False
        return stored
