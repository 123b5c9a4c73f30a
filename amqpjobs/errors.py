"""Every error amqpjobs raises, under one root.

The tree::

    AmqpJobsError
    ├── ConfigurationError          bad settings or arguments given to the library
    │   └── UnaddressableNameError   a queue name RabbitMQ takes but pamqp won't put in a frame (rename it)
    ├── InvalidPayloadError         a payload fails its job's model (nothing was sent)
    ├── DuplicateJobError           an idempotent job's key was already done (its effect rolled back)
    ├── BusyError                   another process holds the lock (e.g. moves that quarantine queue)
    ├── JobFailedError              App.result(): the job was quarantined or parked (carries the reason)
    ├── ResultsUnavailableError     the results store can't be read (database down or unusable)
    ├── LedgerUnavailableError      the idempotency ledger's database can't be reached (down, refusing)
    ├── PayloadStoreError           the payload store failed to keep a large payload (nothing was sent)
    ├── PublishError                a publish was not confirmed by the broker
    │   ├── UnroutableError          returned (mandatory): no queue is bound for it; or its exchange is missing
    │   ├── PublishNackedError       the broker nacked it (e.g. a full queue, reject-publish)
    │   │   └── QueueFullError        the work queue is over its max_depth / max_age / max_length (not sent)
    │   ├── BrokerBlockedError       a resource alarm blocks publishing (memory, disk); not sent
    │   └── MessageTooLargeError     bigger than max_message_size, or headers over frame_max
    ├── PublisherClosedError        a SyncPublisher used after its close, or App.close() under an enqueue: not sent
    ├── TopologyError
    │   ├── TopologyValidationError  topology files are invalid (carries each problem)
    │   └── TopologyConflictError    live broker objects differ from the desired ones
    └── BrokerError                  the broker or its management API failed us
        ├── BrokerUnavailableError   cannot connect / connection lost
        ├── ManagementApiError       the HTTP management API answered with an error
        ├── ChannelClosedError       the channel closed under an operation (nothing more on it)
        ├── NotFoundError            404 NOT_FOUND: the queue or exchange does not exist
        ├── ResourceLockedError      405 RESOURCE_LOCKED: exclusive to another connection
        ├── PreconditionFailedError  406 PRECONDITION_FAILED: the broker refused the arguments
        └── SignalNotSentError       pause/resume changed the flag, but the workers' signal was refused

Broker and client library errors are translated into these at the wire boundary
(``amqpjobs.wire.errors``: one table, one context manager), once, with the original exception chained as ``__cause__``.
This module imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass

from amqpjobs.printable import printable


class AmqpJobsError(Exception):
    """Root of every error raised by amqpjobs.

    Attributes:
        final: True (set on the instance) when a worker's start refused is refused again by any
            restart until an operator acts (a lost ledger), or a running worker stopped because the
            broker refuses its every reconnect (a user's ``max-channels``): ``consume --processes``
            then stops every child at the first, with its words, instead of restarting it.
    """

    final: bool = False


class ConfigurationError(AmqpJobsError):
    """Settings or arguments given to the library are wrong; the message says how to fix them."""


class InvalidPayloadError(AmqpJobsError):
    """A payload does not validate against its job's payload model; nothing was published.

    Attributes:
        job: The job name.
        errors: Pydantic's error list (``loc``, ``msg``, ``type`` …).

    """

    def __init__(self, job: str, errors: list[dict[str, object]], message: str) -> None:
        self.job = job
        self.errors = errors
        super().__init__(message)


class UnaddressableNameError(ConfigurationError):
    """A queue or exchange name RabbitMQ accepts but the AMQP client (pamqp) refuses to put in a frame.

    RabbitMQ takes any UTF-8 name up to 255 bytes; pamqp only accepts
    ``[a-zA-Z0-9-_.:@#,/+ ]`` (its ``DOMAIN_REGEX``), so such a queue can only be reached
    through the management API. Raised by the wire layer's error map.

    Attributes:
        name: The name refused ("" when the call did not say which).
    """

    def __init__(self, message: str, name: str = "") -> None:
        self.name = name
        super().__init__(message)


class DuplicateJobError(AmqpJobsError):
    """An idempotent job's key was already marked done by another run; this run's effect was rolled back."""


class JobFailedError(AmqpJobsError):
    """``App.result()``: the job ended quarantined, parked, purged or skipped, so no result will come.

    Attributes:
        job_id: The job id.
        state: ``quarantined``, ``parked``, ``purged`` (deleted by ``quarantine purge --app``) or ``skipped``
            (a cron run the overlap guard left unrun).
        reason: The quarantine reason (``exhausted``, ``permanent`` ...), the skip's
            (``overlap: schedule nightly``), or "".
        error: ``"<type>: <message>"`` of the last failure, or "".

    """

    def __init__(self, message: str, job_id: str, state: str, reason: str, error: str) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        self.error = error
        super().__init__(message)


class ResultsUnavailableError(AmqpJobsError):
    """The results store can't be read (database down, unreachable or unusable); jobs are not affected."""


class LedgerUnavailableError(AmqpJobsError):
    """The idempotency ledger's database can't be reached now (down, unreachable, refusing the login).

    An idempotent job then waits without using an attempt; at a worker's start it stops the
    worker (exit 3). A bad connection string is a :class:`ConfigurationError` instead.
    """


class PayloadStoreError(AmqpJobsError):
    """The payload store (``App(payload_store=...)``) failed to keep a large payload: nothing was sent."""


class BusyError(AmqpJobsError):
    """Another process holds the broker-side lock this operation needs; nothing was done.

    Raised at once, never after waiting: e.g. a second replay of a quarantine queue while
    one runs (one mover per quarantine queue at a time).

    Attributes:
        resource: What is locked, e.g. ``quarantine queue 'work.quarantine'``.
        holder: Who holds it, e.g. ``replay (pid 4242 on host-a, since 2026-11-29T08:00:00Z)``,
            or None when that could not be read.

    """

    def __init__(self, message: str, resource: str, holder: str | None) -> None:
        self.resource = resource
        self.holder = holder
        super().__init__(message)


class PublishError(AmqpJobsError):
    """The broker did not confirm a publish: the message may not have been stored.

    Raised as this class itself (not a subclass), the outcome is unknown: no confirm came in
    time, or the channel or connection closed under the publish. The message names the job and
    says it may or may not be stored. The subclasses are definite refusals (nothing stored).
    """


class UnroutableError(PublishError):
    """A ``mandatory`` publish came back (``basic.return``): no queue is bound for its routing key.

    Usually the topology is not applied (``amqpjobs topology apply``) or the job names a
    queue the topology lacks. Publishers never declare queues.
    """


class PublishNackedError(PublishError):
    """The broker answered the publish with ``basic.nack`` (e.g. queue full with ``reject-publish``)."""


class QueueFullError(PublishNackedError):
    """The work queue is full: enqueue refused the job, or the broker nacked it; it is not in the queue.

    Raised by ``enqueue`` when the job queue declares ``max_depth`` / ``max_age`` in the
    topology and the work queue is over it (nothing was sent), and when the broker nacks a
    publish to a queue at its ``max_length`` with ``overflow = "reject-publish"`` (RabbitMQ
    "Queue Length Limit" -> "Overflow Behaviour"; the broker did not store it). Try again
    later or shed the load; ``App(queue_full_wait=...)`` makes enqueue wait first.

    Attributes:
        queue: The work queue.
        limit: What it is over, e.g. ``max_depth 100 (103 ready)`` or ``max_length``.
        waited: Seconds enqueue waited for room first (0 without ``queue_full_wait``, and for a
            broker's nack).

    """

    def __init__(self, message: str, queue: str = "", limit: str = "", waited: float = 0.0) -> None:
        self.queue = queue
        self.limit = limit
        self.waited = waited
        super().__init__(message)


class PublisherClosedError(AmqpJobsError):
    """A :class:`~amqpjobs.SyncPublisher` was used after :meth:`~amqpjobs.SyncPublisher.close` (or its ``with`` block).

    Its connection and event loop thread are gone; nothing was sent. Keep the calls inside
    the ``with app.sync_publisher() as publisher:`` block, or make another publisher.

    Also raised by ``App.enqueue`` (and a ``ConfirmedPublisher``'s publish) that ``App.close()``
    cut off before the message was sent: nothing was sent. One cut off after it was sent raises
    :class:`PublishError` (it may or may not be stored).
    """


class BrokerBlockedError(PublishError):
    """A broker resource alarm blocks publishing, and it did not clear in time; the job was NOT sent.

    RabbitMQ blocks every publishing connection while a node is low on memory or disk
    (RabbitMQ "Memory and Disk Alarms"; it tells clients with ``connection.blocked``).
    ``enqueue`` checks before it writes and waits up to ``App(blocked_timeout=...)`` for the
    alarm to clear, then raises this: nothing reached the broker, so enqueueing again later
    is safe. Also raised by an ``enqueue`` whose publish the alarm held unread when
    ``App.close(held_wait=...)`` reset the connection: the broker drops what it had not read.

    Attributes:
        alarm: Which alarm: ``memory``, ``disk`` or ``memory & disk`` (from the broker's reason).
        waited: Seconds waited for it to clear.

    """

    def __init__(self, message: str, alarm: str = "", waited: float = 0.0) -> None:
        self.alarm = alarm
        self.waited = waited
        super().__init__(message)


class MessageTooLargeError(PublishError):
    """The message exceeds the broker's ``max_message_size``, or its headers ``frame_max``; nothing was sent.

    Attributes:
        reason: What is too large, without the advice (``headers and properties of 131098
            bytes, over the connection's frame_max of 131072 bytes ...``), for a caller that
            words its own ("" when unknown).
        excess: Bytes by which the headers and properties are over what a frame lets them
            take, or None (a body over ``max_message_size``, or unknown).

    """

    def __init__(self, message: str, reason: str = "", excess: int | None = None) -> None:
        self.reason = reason
        self.excess = excess
        super().__init__(message)


class TopologyError(AmqpJobsError):
    """A problem with the declared topology."""


@dataclass(frozen=True)
class Problem:
    """One validation problem found in a topology file.

    Attributes:
        file: Path of the file (as given) the problem is in, or ``"<topology>"`` for
            problems that span files.
        key_path: Dotted key path inside the file, e.g. ``job_queues[1].retry_tiers[0]``;
            ``"-"`` for the whole file (missing, not TOML, empty): the text then leaves it out.
        message: What is wrong.
        fix: How to fix it.

    """

    file: str
    key_path: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = printable(self.file) if self.key_path == "-" else f"{printable(self.file)}: {printable(self.key_path)}"
        return f"{where}: {self.message} (fix: {self.fix})"


class TopologyValidationError(TopologyError):
    """Topology files are invalid. ``problems`` lists every problem found (never empty)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid topology ({len(self.problems)} problem(s)):\n{lines}")


class TopologyConflictError(TopologyError):
    """Live broker objects are inequivalent to the desired ones; nothing was declared.

    ``report`` is the human-readable plan report naming every conflicting argument;
    ``declared_nothing`` is False only when the broker refused a declaration mid-apply
    (something changed between plan and apply).
    """

    def __init__(self, report: str, declared_nothing: bool = True) -> None:
        self.report = report
        self.declared_nothing = declared_nothing
        super().__init__(report)


class BrokerError(AmqpJobsError):
    """The broker, or talking to it, failed."""


class BrokerUnavailableError(BrokerError):
    """The broker cannot be reached (refused, timed out, authentication failed)."""


class ManagementApiError(BrokerError):
    """The RabbitMQ management HTTP API answered with an error status.

    Attributes:
        status: HTTP status code (0 when no answer came at all).

    """

    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class ChannelClosedError(BrokerError):
    """The channel (or its connection) closed under an operation; the broker requeues what it held."""


class NotFoundError(BrokerError):
    """The broker answered ``404 NOT_FOUND``: the queue or exchange does not exist."""


class ResourceLockedError(BrokerError):
    """The broker answered ``405 RESOURCE_LOCKED``: the queue is exclusive to another connection."""


class PreconditionFailedError(BrokerError):
    """The broker answered ``406 PRECONDITION_FAILED`` (e.g. declared with other arguments, too large)."""


class SignalNotSentError(BrokerError):
    """``pause``/``resume`` changed the flag, but the signal to the workers was refused (README "Pause and resume").

    The state changed: workers notice it at their next read of the flags, within 30 s
    (:data:`amqpjobs.wire.flags.RECHECK`). ``amqpjobs pause/resume`` exit 5 with this message.

    Attributes:
        job_queue: The job queue paused or resumed.
        paused: True after a pause, False after a resume.
    """

    def __init__(self, message: str, job_queue: str, paused: bool) -> None:
        self.job_queue = job_queue
        self.paused = paused
        super().__init__(message)
