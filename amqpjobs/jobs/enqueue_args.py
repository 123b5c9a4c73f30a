"""What ``enqueue`` refuses before it publishes: the job id, tenant and priority it was given (README "Enqueueing").

:func:`checked_job_id` runs before connecting; :func:`check_broker_priority` once the broker's
version is known (after connecting, still before anything is sent).
"""

from __future__ import annotations

import os
from typing import Any

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import job_id_problem
from amqpjobs.jobs.registry import JobDef
from amqpjobs.printable import invisible_at
from amqpjobs.text import a_type, lone_surrogate
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.versions import (
    QUORUM_MAX_PRIORITY,
    QUORUM_TWO_LEVELS_SINCE,
    Version,
    quorum_priorities,
    quorum_priority_refusal,
)

#: The bits ``uuid.uuid4()`` sets in 128 random ones: version 4 (bits 76-79), RFC 4122 variant (bits 62-63).
#: The fix for a key function's result over 255 UTF-8 bytes (:func:`~amqpjobs.jobs.envelope.job_id_problem`).
_SHORTER_KEY = "return a shorter key (for a long one, a hash of it: hashlib.sha256(key.encode()).hexdigest())"
_PLAIN_KEY = "return a key without them (or a hash of it: hashlib.sha256(key.encode()).hexdigest())"
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (4 << 76) | (0x8000 << 48)


def random_job_id() -> str:
    """``str(uuid.uuid4())``: the same bits from ``os.urandom``, same text, without a ``UUID`` object (1 µs less)."""
    x = f"{int.from_bytes(os.urandom(16)) & _UUID4_CLEAR | _UUID4_SET:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def check_broker_priority(jobdef: JobDef, layout: JobQueueLayout, priority: int | None, version: Version) -> None:
    """Refuse a ``priority`` that job queue ``layout`` would store and ignore on RabbitMQ ``version``.

    The one rule of :meth:`App.enqueue <amqpjobs.runtime.app.App.enqueue>` and the sync
    publisher's fast path, asked once the broker's version is known (connection properties),
    before publishing. Quorum queues have no priorities before RabbitMQ 4.0, two levels on
    4.0-4.2 (0-4 normal, 5+ high), strict ones 0-31 from 4.3 (release notes 4.0.0 and 4.3.0;
    README "RabbitMQ 3.10, 4.0 and 4.3"). An explicit ``priority=0`` is refused too, as on a
    classic job queue without ``max_priority`` (:func:`checked_job_id`): a caller that passes a
    priority expects it to order jobs, and one computed per job (0 for most) would otherwise
    fail only for the few that need it. ``None`` (no priority asked) is always taken.

    Args:
        jobdef: The job enqueued.
        layout: Its job queue.
        priority: The priority asked for, already checked against ``max_priority`` by
            :func:`checked_job_id`; None: none.
        version: The connected broker's version, e.g. ``(3, 10, 8)``.

    Raises:
        ConfigurationError: a priority for a quorum job queue on RabbitMQ before 4.0, or for one
            with ``max_priority`` before 4.3, or one over 31 for one without ``max_priority`` on
            4.3+ (delivered as 31, as a classic queue delivers one over its ``x-max-priority``;
            the message names the job, the queue, the version and the fixes; nothing was sent).

    """
    if priority is None or layout.queue_type != "quorum":
        return
    head = f"job {jobdef.name!r}: priority {priority} can't be kept: job queue {layout.name!r}"
    if layout.max_priority is not None:  # strict priorities, the topology's rule: 4.3+ (the worker refuses it too)
        if (refusal := quorum_priority_refusal(version)) is not None:
            message, fix = refusal
            raise ConfigurationError(
                f"{head} (quorum, max_priority {layout.max_priority}): {message}; nothing was sent (fix: {fix})"
            )
        return
    if version < QUORUM_TWO_LEVELS_SINCE:
        connected = ".".join(map(str, version))
        raise ConfigurationError(
            f"{head} is a quorum queue, and quorum queues have no priorities before RabbitMQ 4.0 (connected: "
            f"{connected}); nothing was sent. Fix: leave priority out (every job then goes with 0), or a classic "
            'job queue with max_priority (type = "classic", under a new name: a queue\'s type is fixed when it '
            "is declared), or upgrade the broker to RabbitMQ 4.0+ (quorum queues: 0-4 normal, 5+ high; 4.3+: "
            "strict 0-31 with max_priority)"
        )
    if priority > QUORUM_MAX_PRIORITY and quorum_priorities(version):
        raise ConfigurationError(
            f"{head} is a quorum queue, and RabbitMQ 4.3+ has quorum-queue priorities 0-{QUORUM_MAX_PRIORITY} "
            f"(connected: {'.'.join(map(str, version))}), a higher one is delivered as {QUORUM_MAX_PRIORITY}; "
            f"nothing was sent. Fix: a priority of 0-{QUORUM_MAX_PRIORITY} (a job without one counts as 4), or "
            "max_priority on the job queue to have enqueue check a lower bound"
        )


def tenant_text_problem(tenant: str) -> str | None:
    """Why ``tenant`` (a non-blank str) is no tenant ``enqueue`` sends, or None.

    A tenant is compared as given (its fairness slot, its shard, ``--tenant`` filters), and shown
    in logs, ``status`` and quarantine: one with whitespace at an end would be a tenant apart from
    the one it looks like, and a control or invisible character (what :func:`printable` escapes)
    would be shown other than it reads.
    """
    if tenant != tenant.strip():
        stripped = tenant.strip()[:40]
        return (
            f"tenant {tenant[:40]!r} has whitespace at its start or end: it would be a tenant apart from "
            f"{stripped!r} (its own fairness slot and shard); fix: tenant={stripped!r}"
        )
    if (unsafe := invisible_at(tenant)) is not None:
        return (
            f"tenant {tenant[:40]!r} holds a control or invisible character ({unsafe[1]} at {unsafe[0]}); "
            "a tenant is shown in logs, status and quarantine as it is sent: fix: leave such characters out"
        )
    return None


def _id_text_problem(job_id: str, fix: str = "leave such characters out", key: bool = False) -> str | None:
    """A blank at either end, or a control or invisible character, in a job id sent here; or None.

    It is shown in logs, status, quarantine and the console (escaped) and typed to look the job
    up (``job show``): an id holding a line feed or an escape reads as another, and one with a
    zero-width or blank-looking character (:func:`~amqpjobs.printable.invisible_at`) or an end
    blank is a job apart that prints the same: its own idempotency key, so its side effect twice.
    Ids from other publishers are taken as they come (the worker escapes them); ours are refused.
    """
    shown = f"{job_id[:40]!r}..." if len(job_id) > 40 else repr(job_id)
    if job_id != job_id.strip():
        stripped = job_id.strip()
        mend = "return it stripped (key.strip())" if key else f"job_id={stripped[:40]!r}"
        return (
            f"job_id {shown} begins or ends with a blank: a job apart from {stripped[:40]!r} that prints the same "
            f"(its own idempotency key); fix: {mend}"
        )
    if (found := invisible_at(job_id)) is None:
        return None
    return (
        f"job_id {shown} holds a control or invisible character ({found[1]} at {found[0]}): a job id is shown in "
        f"logs, status and quarantine and typed to look the job up; fix: {fix}"
    )


def checked_job_id(
    jobdef: JobDef, layout: JobQueueLayout, payload: Any, *, job_id: str | None, priority: int | None,
    tenant: str | None,
) -> str:  # fmt: skip
    """Check ``enqueue``'s arguments for job ``jobdef`` going to ``layout``; returns the job id to send.

    The job id is ``job_id``, else what the job's ``key`` function derives from the validated
    payload, else a random UUID.

    Raises:
        ConfigurationError: ``job_id`` or ``tenant`` not a str, or empty; ``job_id`` not an AMQP
            short string (1-255 UTF-8 bytes); ``priority`` not an int, or above the job queue's
            ``max_priority`` (or given to a classic queue without one); the key function failed
            or returned no non-empty str; the job id (given or derived) has a blank at either end or holds a
            control or invisible character (:func:`amqpjobs.printable.invisible_at`); ``tenant`` not UTF-8
            text (a lone surrogate), with whitespace at its start or end, or with a control or invisible
            character (:func:`tenant_text_problem`).

    """
    if job_id is not None and (problem := job_id_problem(job_id) or _id_text_problem(job_id)):  # its type too
        raise ConfigurationError(f"job {jobdef.name!r}: {problem}")
    if tenant is not None and not isinstance(tenant, str):
        raise ConfigurationError(f"job {jobdef.name!r}: tenant must be a str (got {type(tenant).__name__})")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ConfigurationError(f"job {jobdef.name!r}: priority must be an int (got {priority!r})")
    if tenant is not None and not tenant.strip():
        raise ConfigurationError(f"job {jobdef.name!r}: tenant is empty; give a tenant key or leave it out")
    if tenant is not None and (problem := lone_surrogate(tenant)):
        raise ConfigurationError(f"job {jobdef.name!r}: tenant {tenant[:40]!r} is not UTF-8 text ({problem})")
    if tenant is not None and (problem := tenant_text_problem(tenant)):
        raise ConfigurationError(f"job {jobdef.name!r}: {problem}")
    if priority is not None and (layout.queue_type == "classic" or layout.max_priority is not None):
        if layout.max_priority is None:
            raise ConfigurationError(
                f"job {jobdef.name!r}: job queue {layout.name!r} has no priorities (max_priority in the topology)"
            )
        if priority > layout.max_priority:  # an int, not a bool: checked above
            raise ConfigurationError(
                f"job {jobdef.name!r}: priority {priority} is above job queue {layout.name!r}'s "
                f"max_priority {layout.max_priority}"
            )
    if job_id is None and jobdef.key is not None:
        try:
            derived = jobdef.key(jobdef.validate(payload))
        except Exception as exc:
            raise ConfigurationError(f"job {jobdef.name!r}: its key function failed: {exc}") from exc
        if not isinstance(derived, str) or not derived.strip():
            raise ConfigurationError(
                f"job {jobdef.name!r}: its key function returned {derived!r}; it must return a non-empty str "
                "that identifies the job (jobs with the same key run once)"
            )
        if problem := job_id_problem(derived, _SHORTER_KEY) or _id_text_problem(derived, _PLAIN_KEY, key=True):
            shown = f"{derived[:40]!r}..." if len(derived) > 40 else repr(derived)
            raise ConfigurationError(
                f"job {jobdef.name!r}: its key function returned {shown}, which can't be a job id: {problem}"
            )
        job_id = derived
    return job_id or random_job_id()


def checked_max_message_size(value: object) -> int | None:
    """``App(max_message_size=...)`` as given: None, or a whole number of bytes >= 1.

    Raises:
        ConfigurationError: anything else (``"16MiB"``, ``0``, ``-1``, ``True``, ``1.5e6``), naming
            what was given and how to write a size. Taken as given, a str failed every enqueue
            with a ``TypeError``, 0 meant the broker's default, and -1 or ``True`` refused every job
            as too large.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    kind = f", {a_type(value)}" if isinstance(value, bool) or not isinstance(value, int) else ""
    raise ConfigurationError(
        f"App(max_message_size=...) must be a whole number of bytes >= 1 (got {value!r}{kind}): the largest "
        "message body the broker takes, e.g. 16 * 1024 * 1024 for 16 MiB; leave it out (None) for the broker's "
        "default for its version (128 MiB before RabbitMQ 4.0, 16 MiB from 4.0)"
    )
