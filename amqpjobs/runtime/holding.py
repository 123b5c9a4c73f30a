"""Deliveries whose copy has nowhere to go: held unacked until the missing broker object is back.

A worker settles a delivery by publishing a copy (to a delay tier, the quarantine
exchange, the suspects queue, or back to its work queue) and then acking the original.
When the copy can't be published because its target was deleted at run time, rejecting
the original is no way out: the work queue's dead-letter exchange is the quarantine
exchange, and a dead-letter into an exchange that is missing or routes nowhere is
dropped (rabbitmq-notes "Dead-lettering"); a requeue would bring it straight back, and on
a quorum queue raise its delivery count toward the limit. So :class:`Holding`:

* keeps the delivery unacked and stops consuming the work queue it came from (nothing
  more falls into the hole; deliveries already on their way still run);
* reports it: :attr:`Holding.summary` for readiness (``/readyz`` 503), and one ERROR per
  missing object naming the fix (``amqpjobs topology apply``);
* looks for the missing objects every :data:`PROBE_INTERVAL` seconds (passive declares);
  once a delivery's objects are back its copy is published, the caller acks the
  original, and the work queue is consumed again when it holds nothing more;
* ends a hold without publishing when the delivery's channel has closed (connection
  lost, consumer timeout): the broker has the message back and redelivers it;
* on shutdown, held deliveries get the grace period like running handlers, then return
  to their queue with the connection.

A publish that fails while every object exists (a channel closed under it by another
publish's error, a nack, no confirm in time) is tried again at once, then every round.
A copy no wait can fix (its headers too large, a bug of ours) is ``refused`` once every
object the caller's fallback routes into exists and the dead-letter route into the
quarantine queue is made sure of (its binding to the quarantine exchange declared again:
a no-op when it is there): the caller then rejects into a quarantine that is there. A
binding that can't be made (no permission, the broker refuses) holds the delivery as a
missing object does, trying again every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Literal

from amqpjobs.errors import AmqpJobsError, MessageTooLargeError
from amqpjobs.jobs.outcome import Decision, HandBack, Register, RetryLater
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.declare import bind_queue, find_missing

log = logging.getLogger("amqpjobs.worker")

#: Seconds between looks for a missing queue or exchange while deliveries are held.
PROBE_INTERVAL = 5.0

#: What became of a held delivery: its copy was published (ack the original); its channel
#: closed (the broker redelivers it: do nothing); or its copy can never be published (every
#: object it needs exists: fall back).
Settled = Literal["published", "gone", "refused"]


@dataclass(frozen=True, order=True)
class BrokerObject:
    """A queue or exchange a copy needs."""

    kind: Literal["queue", "exchange"]
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


#: Looks for objects on the broker; returns those missing. Raises when it can't tell.
Probe = Callable[[Collection[BrokerObject]], Awaitable[set[BrokerObject]]]
#: Stop or start consuming one work queue.
Switch = Callable[[str], Awaitable[None]]
#: Binds a queue to an exchange (queue, exchange), a no-op when bound; raises when it can't.
Bind = Callable[[str, str], Awaitable[None]]


def _curable(error: BaseException) -> bool:
    """Whether publishing again later can succeed (not a copy too large, nor a bug of ours)."""
    return isinstance(error, AmqpJobsError) and not isinstance(error, MessageTooLargeError)


class Holding:
    """The deliveries a worker holds because their copies can't be published yet.

    Args:
        probe: Finds which objects are missing (passive declares).
        pause: Stops consuming a work queue.
        resume: Consumes a work queue again (the caller decides whether it may).
        on_change: Called whenever a hold begins or ends.
        interval: Seconds between looks (default :data:`PROBE_INTERVAL`, read when built).
        bind: Makes sure of a dead-letter route before a copy is ``refused`` (None: not checked).
    """

    def __init__(
        self,
        probe: Probe,
        pause: Switch,
        resume: Switch,
        on_change: Callable[[], None] = lambda: None,
        interval: float | None = None,
        bind: Bind | None = None,
    ) -> None:
        self._probe = probe
        self._bind = bind
        self._pause = pause
        self._resume = resume
        self._on_change = on_change
        self.interval = PROBE_INTERVAL if interval is None else interval
        self._held: Counter[str] = Counter()  # work queue -> deliveries held
        self._missing: set[BrokerObject] = set()
        self._failing = ""  # the last publish error while nothing was found missing
        self._round = asyncio.Event()  # set (and replaced) after each look
        self._looker: asyncio.Task[None] | None = None
        #: Why the worker is not ready, "" when nothing is held (read from other threads).
        self.summary = ""

    @property
    def count(self) -> int:
        """Deliveries held now."""
        return sum(self._held.values())

    def holds(self, work_queue: str) -> bool:
        """Whether deliveries of ``work_queue`` are held (it is not consumed meanwhile)."""
        return self._held.get(work_queue, 0) > 0

    async def settle(
        self,
        work_queue: str,
        needs: frozenset[BrokerObject],
        publish: Callable[[], Awaitable[None]],
        error: BaseException,
        open_: Callable[[], bool],
        route: tuple[str, str] | None = None,
    ) -> Settled:
        """Publish a delivery's copy after its first publish failed with ``error``, holding it as long as needed.

        Args:
            work_queue: The work queue the delivery came from.
            needs: What the copy and the caller's fallback route into.
            publish: Publishes the copy (raises on failure).
            error: Why the first publish failed.
            open_: Whether the delivery's channel is still open.
            route: (queue, exchange) the caller's fallback dead-letters through: bound before
                ``refused`` is returned.

        Returns:
            ``published``, ``gone`` or ``refused`` (see :data:`Settled`).
        """
        missing = await self._look(needs)
        why: BaseException = error
        if missing == set():
            if not _curable(error):
                unbound = await self._routed(route)
                if unbound is None:
                    return "refused"
                why = unbound
            elif not open_():
                return "gone"
            else:
                try:
                    await publish()
                    return "published"
                except Exception as exc:
                    error = why = exc
                    missing = await self._look(needs)
        return await self._hold(work_queue, needs, missing or set(), publish, (error, why), open_, route)

    async def _routed(self, route: tuple[str, str] | None) -> BaseException | None:
        """Bind ``route`` (queue, exchange); None when bound (or nothing to bind), else why not."""
        if route is None or self._bind is None:
            return None
        try:
            await self._bind(*route)
        except Exception as exc:
            log.debug("binding %s to %s failed: %s", route[0], route[1], exc)
            return AmqpJobsError(f"{route[0]} can't be bound to {route[1]}, so a reject would be dropped: {exc}")
        return None

    async def _hold(
        self,
        work_queue: str,
        needs: frozenset[BrokerObject],
        missing: set[BrokerObject],
        publish: Callable[[], Awaitable[None]],
        errors: tuple[BaseException, BaseException],
        open_: Callable[[], bool],
        route: tuple[str, str] | None,
    ) -> Settled:
        error, why = errors  # the copy's last error; what is reported (the binding's when that failed)
        released = True  # False when cancelled (the stop's grace is over): the delivery goes back, not released
        try:
            await self._enter(work_queue, missing, why)
            while True:
                await self._next_round()
                if not open_():
                    log.warning(
                        "a held delivery of %s went back to the broker with its channel; it is redelivered", work_queue
                    )
                    return "gone"
                if needs & self._missing:
                    continue
                if not _curable(error):
                    unbound = await self._routed(route)
                    if unbound is None:
                        return "refused"
                    self._note(await self._look(needs) or set(), unbound, work_queue)
                    self._changed()
                    continue
                try:
                    await publish()
                    return "published"
                except Exception as exc:
                    error = exc
                    self._note(await self._look(needs) or set(), error, work_queue)
                    self._changed()
        except asyncio.CancelledError:
            released = False
            raise
        finally:
            await self._leave(work_queue, released)

    async def _look(self, objects: Collection[BrokerObject]) -> set[BrokerObject] | None:
        """The missing ones among ``objects``, or None when the broker can't be asked now."""
        try:
            return await self._probe(objects)
        except Exception as exc:
            log.debug("looking for %s failed: %s", ", ".join(map(str, sorted(objects))), exc)
            return None

    def _note(self, missing: set[BrokerObject], error: BaseException, work_queue: str) -> None:
        for obj in sorted(missing - self._missing):
            log.error(
                "%s does not exist: deliveries of %s whose copies go there are held unacked and %s is not consumed "
                "until it is back (looking every %gs); apply the topology: amqpjobs topology apply",
                obj, work_queue, work_queue, self.interval,
            )  # fmt: skip
        self._missing |= missing
        self._failing = "" if missing else f"{type(error).__name__}: {error}"[:300]

    async def _enter(self, work_queue: str, missing: set[BrokerObject], error: BaseException) -> None:
        first = not self.holds(work_queue)
        self._held[work_queue] += 1
        self._note(missing, error, work_queue)
        if not missing and first:
            log.error(
                "publishing a copy of a delivery of %s failed again (%s); holding it unacked and not consuming "
                "%s, trying every %gs", work_queue, self._failing, work_queue, self.interval,
            )  # fmt: skip
        self._changed()
        if self._looker is None or self._looker.done():
            self._looker = asyncio.get_running_loop().create_task(self._look_every_round())
        if first:
            await self._pause(work_queue)

    async def _leave(self, work_queue: str, released: bool = True) -> None:
        """A hold ends; ``released``: not cancelled (a cancelled one goes back to its queue: the stop says so)."""
        self._held[work_queue] -= 1
        last = self._held[work_queue] <= 0
        if last:
            del self._held[work_queue]
        if not self._held:
            self._missing.clear()
            self._failing = ""
        self._changed()
        if last:
            if released:
                log.info("no delivery of %s is held any more", work_queue)
            with contextlib.suppress(Exception):
                await self._resume(work_queue)

    def _changed(self) -> None:
        if not self._held:
            self.summary = ""
        else:
            where = ", ".join(f"{q}: {n}" for q, n in sorted(self._held.items()))
            why = (
                f"{', '.join(map(str, sorted(self._missing)))} missing; apply the topology (amqpjobs topology apply)"
                if self._missing
                else f"their copies can't be published ({self._failing})"
            )
            self.summary = f"holding {self.count} delivery(ies) unacked, not consuming their queues ({where}): {why}"
        self._on_change()

    async def _next_round(self) -> None:
        await self._round.wait()

    async def _look_every_round(self) -> None:
        while self._held:
            await asyncio.sleep(self.interval)
            if self._missing:
                asked = set(self._missing)
                found = await self._look(asked)
                if found is not None:
                    back = asked - found
                    for obj in sorted(back):
                        log.info("%s is back", obj)
                    self._missing -= back
                    self._changed()
            done, self._round = self._round, asyncio.Event()
            done.set()

    async def close(self) -> None:
        """Stop looking (after the worker's grace period: what is still held is abandoned)."""
        if self._looker is not None:
            self._looker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._looker


def needs_of(layout: JobQueueLayout, work_queue: str, decision: Decision) -> frozenset[BrokerObject]:
    """What the copy a ``decision`` publishes, and the worker's fallback, route into.

    A retry goes to its tier queue, a quarantine copy to the quarantine exchange and its
    queue, a registered start to the suspects queue, a handed-back one to its work queue.
    Each falls back to a reject (a copy that can never go), which the work queue
    dead-letters into that same quarantine (:mod:`amqpjobs.runtime.fallback`).
    """
    quarantine = {BrokerObject("exchange", layout.quarantine_exchange), BrokerObject("queue", layout.quarantine_queue)}
    if isinstance(decision, RetryLater):
        return frozenset({BrokerObject("queue", layout.tier_queues[work_queue][decision.tier]), *quarantine})
    if isinstance(decision, Register):
        return frozenset({BrokerObject("queue", layout.suspects_queue), *quarantine})
    if isinstance(decision, HandBack):
        return frozenset({BrokerObject("queue", work_queue), *quarantine})
    return frozenset(quarantine)


def pending_of(layout: JobQueueLayout, work_queue: str, decision: Decision) -> tuple[str, str]:
    """What a held delivery's copy carries out, and the queue or exchange it goes to (the stop's lines).

    ``('quarantine', 'work.quarantine')``, ``('retry', <tier queue>)``, ``('registration',
    <suspects queue>)``, ``('hand-back', <work queue>)``.
    """
    if isinstance(decision, RetryLater):
        return "retry", layout.tier_queues[work_queue][decision.tier]
    if isinstance(decision, Register):
        return "registration", layout.suspects_queue
    if isinstance(decision, HandBack):
        return "hand-back", work_queue
    return "quarantine", layout.quarantine_exchange


def broker_bind(connection: Connection) -> Bind:
    """A :data:`Bind` on ``connection`` (:func:`amqpjobs.wire.declare.bind_queue`)."""

    async def bind(queue: str, exchange: str) -> None:
        await bind_queue(connection, queue, exchange)

    return bind


def broker_probe(connection: Connection) -> Probe:
    """A :data:`Probe` by passive declares on ``connection`` (:func:`amqpjobs.wire.declare.find_missing`)."""

    async def probe(objects: Collection[BrokerObject]) -> set[BrokerObject]:
        queues, exchanges = await find_missing(
            connection,
            [o.name for o in objects if o.kind == "queue"],
            [o.name for o in objects if o.kind == "exchange"],
        )
        return {o for o in objects if o.name in (queues if o.kind == "queue" else exchanges)}

    return probe
