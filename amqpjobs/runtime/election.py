"""A scheduler replica's part in the leader election (the design: :mod:`amqpjobs.runtime.scheduler`).

Each replica offers a token to the election queue at start and, while following, every
``reoffer`` seconds (``x-max-length: 1`` with ``reject-publish`` refuses an offer while one
waits); the single active consumer that receives a token holds it unacked and leads (RabbitMQ
"Consumers" -> "Single Active Consumer").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from amqpjobs.errors import PublishNackedError
from amqpjobs.jobs.envelope import OutgoingMessage
from amqpjobs.wire.abc import Publisher

if TYPE_CHECKING:
    from amqpjobs.runtime.scheduler import SchedulerOptions

log = logging.getLogger("amqpjobs.scheduler")

#: A token's headers: the schedules its replica runs (a JSON array of names, sorted), and their digest.
SCHEDULES_HEADER = "amqpjobs-schedules"
DIGEST_HEADER = "amqpjobs-schedules-digest"
#: Names shown at most in a token's list (the digest compares them all).
SHOWN_NAMES = 50


def schedules_digest(names: list[str]) -> str:
    """The digest of a set of schedule names (sorted, JSON): equal for the same set, whatever the order."""
    return hashlib.sha256(json.dumps(sorted(names)).encode()).hexdigest()[:16]


class Election:
    """Offering the leader token and taking it: the election side of :class:`~amqpjobs.runtime.scheduler.Scheduler`."""

    options: SchedulerOptions
    _publisher: Publisher | None
    _stop: asyncio.Event
    _token: Any
    _lead_task: asyncio.Task[None] | None
    replica: str
    #: Digests of the other schedule sets a token was seen with (each warned once).
    _other_sets: set[str]

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the leader token (the scheduler's)."""
        raise NotImplementedError

    @property
    def leader_queue(self) -> str:
        """The app's election queue (the scheduler's)."""
        raise NotImplementedError

    async def _lead(self, token: Any) -> None:
        raise NotImplementedError

    def _schedule_names(self) -> list[str]:
        """The names of the schedules this replica runs (the scheduler's)."""
        raise NotImplementedError

    async def _offer_token(self) -> None:
        assert self._publisher is not None
        names = sorted(self._schedule_names())
        headers = {SCHEDULES_HEADER: json.dumps(names[:SHOWN_NAMES]), DIGEST_HEADER: schedules_digest(names)}
        token = OutgoingMessage(body=b"leader", headers=headers, content_type="text/plain",
                                type="amqpjobs.scheduler-token")  # fmt: skip
        try:
            await self._publisher.publish("", self.leader_queue, token)
            log.debug("offered a leader token")
        except PublishNackedError:
            pass  # a token already waits: x-max-length 1, reject-publish

    async def _follow(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.options.reoffer)
            if self._stop.is_set() or self.is_leader:
                continue
            try:
                await self._offer_token()
            except Exception as exc:  # the broker may be away; the next offer comes in a few seconds
                log.debug("token offer failed: %s", exc)

    async def _on_token(self, message: Any) -> None:
        self._compare_sets(getattr(message, "headers", None) or {})
        if self._stop.is_set() or self.is_leader:
            return  # held unacked: it returns to the queue with our channel
        self._token = message
        if self._lead_task is not None and not self._lead_task.done():  # its token's channel is gone: it ended
            self._lead_task.cancel()  # (its own end, a few loop turns on, says nothing: no longer the lead task)
            log.info("scheduler replica %s no longer leads", self.replica)
        self._lead_task = asyncio.create_task(self._lead(message), name="amqpjobs-scheduler-lead")

    def _compare_sets(self, headers: Mapping[str, Any]) -> None:
        """Warn (once per other set) when a token came from a replica running other schedules than this one.

        Replicas share one election (README "Cron"): while one leads, only its schedules fire. A
        replica that takes the lead with the token another offered (a failover, a hand-over at a
        stop, a rolling deploy) sees that one's set. A token without the header (an older amqpjobs)
        is not compared.
        """
        theirs = headers.get(DIGEST_HEADER)
        ours = sorted(self._schedule_names())
        if not isinstance(theirs, str) or theirs == schedules_digest(ours) or theirs in self._other_sets:
            return
        self._other_sets.add(theirs)
        try:
            listed_names = json.loads(str(headers.get(SCHEDULES_HEADER)))
            names = {str(n) for n in listed_names} if isinstance(listed_names, list) else set()
        except ValueError:
            names = set()
        only_here, only_there = sorted(set(ours) - names), sorted(names - set(ours))
        effects = [f"while this one leads, {', '.join(only_there)} never fire"] if only_there else []
        effects += [f"while that one leads, {', '.join(only_here)} never fire"] if only_here else []
        log.warning(
            "scheduler replica %s runs schedule(s) %s, but the leader token it took was offered by a replica of "
            "this app running %s: %s; run the same schedules on every replica of an app (the same code and "
            "--schedules)",
            self.replica, ", ".join(ours), ", ".join(sorted(names)) or "another set",
            "; ".join(effects) or "the sets differ",
        )  # fmt: skip
