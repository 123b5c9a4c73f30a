"""Fair sharing of a worker's slots among the shards of a job queue (no broker I/O).

A sharded job queue (``shards = N`` in the topology) spreads tenants over N work queues by
a hash of the tenant key, so a tenant that floods the queue fills only its own shard. A
worker with ``slots`` slots for that job queue holds at most ``slots`` unacked deliveries
of all its shards together (README "Tenant fairness"), and shares them so that every busy
shard gets an equal share however deep the others are:

* **turns** (:class:`ShardTurns`): a free slot takes one job (``basic.get``) from the next
  shard in round-robin order; a shard found empty is skipped until its backoff (1 ms
  doubling to 100 ms) ends, so an idle worker looks at each shard about ten times a second;
* **leases** (:func:`lease_sizes`): shards with a backlog also get a consumer whose prefetch
  is reserved from the slots, an equal share for each busy shard (one slot kept for turns
  unless every shard has a lease). A lease only streams what the worker can run at once,
  so the bound holds; it saves the ``basic.get`` round trip per job on a busy shard.
  :func:`resize` says when a lease's size should change as shards turn busy or idle.
"""

from __future__ import annotations

from collections.abc import Collection

#: Seconds a shard found empty is first skipped; doubled each time it is found empty again.
FIRST_BACKOFF = 0.001
#: The longest a shard found empty is skipped (seconds): the idle polling period.
MAX_BACKOFF = 0.1


class ShardTurns:
    """Round-robin turns over ``shards`` lanes, skipping a lane found empty until its backoff ends.

    Args:
        shards: Number of lanes (>= 1).
        first_backoff: Seconds an empty lane is first skipped (default :data:`FIRST_BACKOFF`).
        max_backoff: Longest skip in seconds (default :data:`MAX_BACKOFF`).

    Raises:
        ValueError: ``shards`` below 1.
    """

    def __init__(self, shards: int, first_backoff: float = FIRST_BACKOFF, max_backoff: float = MAX_BACKOFF) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1 (got {shards})")
        self.shards = shards
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self._next = 0  # the lane whose turn comes first
        self._backoff = [0.0] * shards
        self._until = [0.0] * shards  # monotonic time before which the lane is skipped

    def next(self, now: float, skip: Collection[int] = ()) -> int | None:
        """The lane whose turn it is at ``now`` (the turn passes on), or None when every lane waits or is skipped.

        Args:
            now: The current monotonic time in seconds.
            skip: Lanes that can't take a turn now (e.g. a take already under way there).
        """
        for step in range(self.shards):
            lane = (self._next + step) % self.shards
            if lane in skip or self._until[lane] > now:
                continue
            self._next = (lane + 1) % self.shards
            return lane
        return None

    def found(self, lane: int) -> None:
        """The lane had a job: no backoff."""
        self._backoff[lane] = 0.0
        self._until[lane] = 0.0

    def found_empty(self, lane: int, now: float) -> float:
        """The lane was empty at ``now``: skip it for a backoff that doubles each time. Returns the backoff."""
        backoff = min(max(self._backoff[lane] * 2, self.first_backoff), self.max_backoff)
        self._backoff[lane] = backoff
        self._until[lane] = now + backoff
        return backoff

    def hold(self, lane: int, until: float) -> None:
        """Skip the lane until monotonic time ``until`` (a failed take: try again later)."""
        self._until[lane] = max(self._until[lane], until)

    def wake_at(self, skip: Collection[int] = ()) -> float | None:
        """The earliest monotonic time a lane not in ``skip`` can take a turn again (None: none waits)."""
        times = [u for lane, u in enumerate(self._until) if lane not in skip]
        return min(times) if times else None

    def reset(self) -> None:
        """Forget every backoff (after a pause: look at every lane at once)."""
        self._backoff = [0.0] * self.shards
        self._until = [0.0] * self.shards


def lease_sizes(slots: int, shards: int, busy: Collection[int]) -> dict[int, int]:
    """The prefetch of each busy shard's lease: an equal share of the slots.

    One slot stays for turns (taking jobs by ``basic.get``, also on idle shards, which
    is how new work is found) unless every shard is busy. A share below 1 means no leases:
    every job is taken by turns.

    Args:
        slots: The worker's slots for the job queue (>= 1).
        shards: The job queue's number of shards.
        busy: The shards seen with a backlog.

    Returns:
        Shard -> lease size (prefetch); shards not in it have no lease.

    """
    if not busy:
        return {}
    spare = 0 if len(busy) >= shards else 1
    each = (slots - spare) // len(busy)
    return dict.fromkeys(sorted(busy), each) if each >= 1 else {}


def resize(current: int, target: int) -> bool:
    """Whether a lease of size ``current`` should be replaced by one of ``target`` (0: ended).

    Shrinking is needed at once (the slots are another shard's share); growing only pays
    for the cancel and consume when the lease at least doubles (until then the slots it
    would gain serve the turns, which reach busy shards too). With no lease (``current``
    0), any positive ``target`` is a new lease.
    """
    if current == 0:
        return target > 0
    return target < current or target >= 2 * current


def jain_index(values: list[float]) -> float:
    """Jain's fairness index of ``values``: 1.0 when all equal, 1/n when one takes everything.

    ``(sum x)^2 / (n * sum x^2)`` (Jain, Chiu, Hawe 1984). Returns 1.0 for an empty list or all zeros.
    """
    total = sum(values)
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return 1.0
    return total * total / (len(values) * squares)
