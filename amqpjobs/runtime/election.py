"""A scheduler replica's part in the leader election (the design: :mod:`amqpjobs.runtime.scheduler`).

Each replica offers a token to the election queue at start and, while following, every
``reoffer`` seconds (``x-max-length: 1`` with ``reject-publish`` refuses an offer while one
waits); the single active consumer that receives a token holds it unacked and leads (RabbitMQ
"Consumers" -> "Single Active Consumer").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from amqpjobs.errors import PublishNackedError
from amqpjobs.jobs.envelope import OutgoingMessage
from amqpjobs.wire.abc import Publisher

if TYPE_CHECKING:
    from amqpjobs.runtime.scheduler import SchedulerOptions

log = logging.getLogger("amqpjobs.scheduler")


class Election:
    """Offering the leader token and taking it: the election side of :class:`~amqpjobs.runtime.scheduler.Scheduler`."""

    options: SchedulerOptions
    _publisher: Publisher | None
    _stop: asyncio.Event
    _token: Any
    _lead_task: asyncio.Task[None] | None
    replica: str

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

    async def _offer_token(self) -> None:
        assert self._publisher is not None
        token = OutgoingMessage(body=b"leader", content_type="text/plain", type="amqpjobs.scheduler-token")
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
        if self._stop.is_set() or self.is_leader:
            return  # held unacked: it returns to the queue with our channel
        self._token = message
        if self._lead_task is not None and not self._lead_task.done():  # its token's channel is gone: it ended
            self._lead_task.cancel()  # (its own end, a few loop turns on, says nothing: no longer the lead task)
            log.info("scheduler replica %s no longer leads", self.replica)
        self._lead_task = asyncio.create_task(self._lead(message), name="amqpjobs-scheduler-lead")
