"""The test double's quarantine: what is in it, and replay (as ``amqpjobs quarantine replay`` does, no rate limit)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any

from amqpjobs.errors import ConfigurationError, UnroutableError
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.replay_plan import ReplayOptions, check_rate, check_replay_target
from amqpjobs.runtime.app import App
from amqpjobs.runtime.replay import replay_move
from amqpjobs.runtime.replay_checks import missing_targets_refusal, moves_to_unserved, strays_refusal
from amqpjobs.runtime.worker_config import job_queue_layout
from amqpjobs.testing.memory import MemoryBroker, MemoryDelivery, MemoryPublisher
from amqpjobs.testing.records import QuarantinedMessage
from amqpjobs.topology.naming import QUARANTINE_SUFFIX, parse_queue_name


class QuarantineView:
    """The quarantine half of :class:`~amqpjobs.testing.broker.TestBroker` (its ``app``, ``memory``, ``publisher``)."""

    app: App
    memory: MemoryBroker
    publisher: MemoryPublisher
    _names: itertools.count[int]
    #: Closed after being open: it runs nothing more (its records stay readable).
    _closed: bool = False

    def _still_open(self) -> None:
        """Refuse what runs or moves jobs once the double was closed (its worker is gone: a drain would spin).

        Raises:
            ConfigurationError: it was closed.
        """
        if self._closed:
            raise ConfigurationError(
                "this TestBroker is closed: it runs jobs only inside `async with TestBroker(app) as broker:`; what it "
                "recorded (completed(), quarantine(), messages()) can still be read"
            )

    def _quarantine_queue(self, name: str) -> str:
        return name if name.endswith(QUARANTINE_SUFFIX) else job_queue_layout(self.app, name).quarantine_queue

    def quarantine(self, job_queue: str) -> list[QuarantinedMessage]:
        """The messages in ``job_queue``'s quarantine (a job queue or quarantine queue name), oldest first."""
        out = []
        for stored in self.memory.queue(self._quarantine_queue(job_queue)).messages:
            m = stored.message
            headers = dict(m.headers)
            info = q.describe(headers, m.message_id, m.type, m.body)
            out.append(QuarantinedMessage(headers, m.body, m.message_id, m.type, info))
        return out

    def messages(self, queue: str) -> list[dict[str, Any]]:
        """Headers of the messages waiting in any queue (a work or tier queue ...), oldest first."""
        return [dict(s.message.headers) for s in self.memory.queue(queue).messages]

    async def replay(self, job_queue: str, options: ReplayOptions | None = None) -> int:
        """Move quarantined messages back to their work queues as ``amqpjobs quarantine replay --app`` does.

        No rate limit applies; the messages left out stay in order. Run them with :meth:`drain`.
        It refuses what the CLI refuses (checked before anything moves): a rate outside its bounds,
        a ``limit`` below 1, a ``to`` that is no work queue or does not exist, and a ``to`` whose
        workers don't serve a job that would move (the app's jobs, as ``--app`` gives them). A job
        the app serves from another job queue than the one its evidence names stays, as with ``--app``.

        Returns:
            How many were moved.

        Raises:
            ConfigurationError: one of the refusals above, or the TestBroker is closed.

        """
        self._still_open()
        options = options or ReplayOptions()
        if isinstance(options.rate, bool) or not isinstance(options.rate, int | float):
            raise ConfigurationError(f"ReplayOptions(rate=...) must be a number of messages per second (got "
                                     f"{options.rate!r})")  # fmt: skip
        if options.to is not None and (not isinstance(options.to, str) or not options.to.strip()):
            raise ConfigurationError(f"ReplayOptions(to=...) must be a work queue's name, or None for the queue "
                                     f"each job failed on (got {options.to!r})")  # fmt: skip
        check_rate(options.rate)
        check_replay_target(options.to)
        if options.limit is not None and (type(options.limit) is not int or options.limit < 1):
            raise ConfigurationError(f"ReplayOptions(limit=...): limit must be a whole number of at least 1 (got "
                                     f"{options.limit!r}), or None for all that match")  # fmt: skip
        if options.job_queues is None:  # the app is known here, as --app makes it known to the CLI
            options = replace(options, job_queues={job.name: job.queue for job in self.app}, app=self.app.name,
                              idempotent=frozenset(job.name for job in self.app if job.idempotent))  # fmt: skip
        source = self._quarantine_queue(job_queue)
        if options.to is not None:
            self._check_target(source, options)
        run = f"test-replay-{next(self._names)}"
        moved, kept = 0, []
        for _ in range(len(self.memory.queue(source).messages)):
            delivery = MemoryDelivery.take(self.memory, source)
            assert delivery is not None
            full = options.limit is not None and moved >= options.limit
            planned = None if full else replay_move(delivery, options, run)
            if planned is None or options.dry_run:
                kept.append(delivery.stored)
                moved += planned is not None
                continue
            try:
                await self.publisher.publish("", planned.target, planned.copy)
            except UnroutableError:  # its target does not exist: it stays, as in a real replay
                kept.append(delivery.stored)
                continue
            await delivery.ack()
            moved += 1
        self.memory.queue(source).messages[:0] = kept
        return moved

    def _check_target(self, source: str, options: ReplayOptions) -> None:
        """Refuse a ``to`` that does not exist, or whose workers don't serve a job that would move there."""
        assert options.to is not None
        assert options.job_queues is not None
        if options.to not in self.memory.queues:
            raise ConfigurationError(missing_targets_refusal([options.to]))
        target, strays = parse_queue_name(options.to).job_queue, Counter[str]()
        for stored in self.memory.queue(source).messages:
            m = stored.message
            item = q.describe(m.headers, m.message_id, m.type, m.body)
            if moves_to_unserved(item, options, target):
                strays[item.job] += 1
        if strays:
            raise ConfigurationError(strays_refusal(options.to, strays, options.job_queues))
