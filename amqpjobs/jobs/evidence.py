"""Evidence headers for quarantined jobs: what failed, where, when, how often, the traceback.

Values are strings or integers, which every AMQP client decodes. The total stays under a
byte budget however large the exception text: headers count against the connection's
``frame_max`` (131072 bytes by default), and a bigger header frame breaks the connection
(RabbitMQ "Connections" / AMQP 0-9-1 frame_max).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from amqpjobs.jobs import envelope
from amqpjobs.jobs.envelope import FIRST_FAILURE_AT, JOB, ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY, TENANT
from amqpjobs.jobs.header_values import read_count
from amqpjobs.text import encodable

REASON: Final = "amqpjobs-reason"
ERROR_TYPE: Final = "amqpjobs-error-type"
ERROR_MESSAGE: Final = "amqpjobs-error-message"
TRACEBACK: Final = "amqpjobs-traceback"
ATTEMPTS: Final = "amqpjobs-attempts"
LAST_FAILURE_AT: Final = "amqpjobs-last-failure-at"
WORKER_HOST: Final = "amqpjobs-worker-host"
WORKER_PID: Final = "amqpjobs-worker-pid"
VERSION: Final = "amqpjobs-version"
APP_VERSION: Final = "amqpjobs-app-version"
ORIGINAL_QUEUE: Final = "amqpjobs-original-queue"
JOB_ID: Final = "amqpjobs-job-id"
DELIVERY_COUNT: Final = "amqpjobs-delivery-count"
ACQUIRED_COUNT: Final = "amqpjobs-acquired-count"

#: Every evidence header (README "Quarantine evidence").
EVIDENCE_HEADERS: Final = (
    REASON, ERROR_TYPE, ERROR_MESSAGE, TRACEBACK, ATTEMPTS, FIRST_FAILURE_AT, LAST_FAILURE_AT,
    WORKER_HOST, WORKER_PID, VERSION, APP_VERSION, ORIGINAL_EXCHANGE, ORIGINAL_QUEUE,
    ORIGINAL_ROUTING_KEY, JOB, JOB_ID, TENANT, DELIVERY_COUNT, ACQUIRED_COUNT,
)  # fmt: skip

__all__ = [
    "ACQUIRED_COUNT", "APP_VERSION", "ATTEMPTS", "DEFAULT_BUDGET", "DELIVERY_COUNT", "ERROR_MESSAGE",
    "ERROR_TYPE", "EVIDENCE_HEADERS",
    "FIRST_FAILURE_AT", "JOB", "JOB_ID", "LAST_FAILURE_AT", "MIN_BUDGET", "ORIGINAL_EXCHANGE", "ORIGINAL_QUEUE",
    "ORIGINAL_ROUTING_KEY", "REASON", "TENANT", "TRACEBACK", "VERSION", "WORKER_HEADROOM", "WORKER_HOST",
    "WORKER_PID", "Failure", "broker_counters", "delivery_counters", "evidence_headers", "trimmed_budget",
]  # fmt: skip

#: The evidence headers the budget holds: all but the tenant, which came on the job.
_BUDGETED: Final = frozenset(EVIDENCE_HEADERS) - {TENANT}
#: Default byte budget for all evidence headers together (names + values, UTF-8), the tenant's aside.
DEFAULT_BUDGET: Final = 16 * 1024
#: Bytes of ``frame_max`` that ``enqueue`` leaves free for the headers a worker adds to its
#: copies of a job: the evidence (:data:`DEFAULT_BUDGET`, on the quarantine copy) plus 4 KiB
#: for the rest (a retry's ``amqpjobs-attempt``/``-runs``/``-first-failure-at``/``-original-*``,
#: a suspect's ``amqpjobs-starts``/``-last-start-*``/``-work-queue`` with names of up to 255
#: bytes, a generated job id, field encodings). README "Bad messages".
WORKER_HEADROOM: Final = DEFAULT_BUDGET + 4 * 1024
#: The least evidence worth a quarantine copy trimmed to fit a frame (:func:`trimmed_budget`).
MIN_BUDGET: Final = 2 * 1024
_MARK = "…[truncated]"


@dataclass(frozen=True)
class Failure:
    """What we know about one failure, before it becomes headers.

    Attributes:
        reason: Quarantine reason (see :data:`amqpjobs.jobs.outcome.REASONS`).
        error_type: Qualified exception class name, or a short label such as ``DecodeError``.
        error_message: The exception text (any size; trimmed to the budget).
        traceback: Formatted traceback, or ``""``.
        attempts: Handler runs so far (0 when the job never ran).
        first_failure_at / last_failure_at: ISO-8601 UTC times.
        host / pid: Worker host name and process id.
        version / app_version: amqpjobs version and the app's version (``""`` if not given).
        exchange / queue / routing_key: Where the delivery came from.
        job / job_id: The job, as far as known (``""`` when not).
        tenant: The tenant, ``""`` (or blank) for none: then no tenant header is written.
            Kept whole, never trimmed (no tenant limit of ours; a replay keeps its shard).
        delivery_count / acquired_count: The broker's quorum-queue counters on the
            delivery (``x-delivery-count``, ``x-acquired-count`` from 4.3), 0 when absent or
            not the broker's (classic queues, a first delivery); see :func:`broker_counters`.

    """

    reason: str
    error_type: str
    error_message: str
    traceback: str
    attempts: int
    first_failure_at: str
    last_failure_at: str
    host: str
    pid: int
    version: str
    app_version: str
    exchange: str
    queue: str
    routing_key: str
    job: str
    job_id: str
    tenant: str
    delivery_count: int = 0
    acquired_count: int = 0


def delivery_counters(headers: Mapping[str, object]) -> dict[str, int]:
    """``delivery_count`` and ``acquired_count`` as a delivery's headers say them (:func:`broker_counters`: whose).

    RabbitMQ 4.3.0 release notes: ``x-delivery-count`` counts rejects and client crashes (the
    delivery limit counts it), ``x-acquired-count`` every return (also nack, consumer
    timeout, partitions). Before 4.3 only the first exists. Read by the one count rule
    (:func:`~amqpjobs.jobs.header_values.read_count`, any encoding); a missing value or one
    that is no count is 0.
    """

    def count(name: str) -> int:
        return read_count(headers.get(name)) or 0

    return {"delivery_count": count(envelope.DELIVERY_COUNT), "acquired_count": count(envelope.ACQUIRED_COUNT)}


def broker_counters(
    headers: Mapping[str, object], queue_type: str, redelivered: bool, version: tuple[int, ...]
) -> dict[str, int]:
    """The :class:`Failure` counters of a delivery the worker quarantines: the broker's, or 0 where it wrote none.

    A quorum queue writes ``x-delivery-count`` (and from RabbitMQ 4.3 ``x-acquired-count``) on a
    message it returned, i.e. a redelivery (RabbitMQ "Quorum Queues" -> "Poison Message Handling";
    release notes 4.3.0). A classic queue counts nothing ("Consumer Acknowledgements" ->
    "Redelivery"), no queue counts a first delivery, and our copies (retries, registered starts)
    carry none: what such a delivery holds is a publisher's, and reads 0 here (the message keeps it
    among its own headers). On 4.3 a redelivery returned by nacks alone has no ``x-delivery-count``
    of the broker's: one there is a publisher's, read as at most ``x-acquired-count`` (measured on
    4.3.6: a forged 999 after two nacks reads 2, not 0: the bound, not the truth).

    Args:
        headers: The delivery's headers.
        queue_type: Its job queue's (``classic`` or ``quorum``).
        redelivered: The delivery's ``redelivered`` flag.
        version: The broker's version, e.g. ``(4, 3, 6)``: ``x-acquired-count`` is read from 4.3 on.
    """
    if not redelivered or queue_type != "quorum":
        return {"delivery_count": 0, "acquired_count": 0}
    counters = delivery_counters(headers)
    if version < (4, 3):
        counters["acquired_count"] = 0
    else:  # 4.3 writes x-delivery-count only once it counts one (a nack raises x-acquired-count alone), so a
        # publisher's value may still be there: bounded by the acquired count, every reject or crash being a return
        counters["delivery_count"] = min(counters["delivery_count"], counters["acquired_count"])
    return counters


def _size(headers: Mapping[str, str | int]) -> int:
    return sum(len(k.encode()) + len(str(v).encode("utf-8")) + 8 for k, v in headers.items())


def _trim_head(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    keep = max(0, max_bytes - len(_MARK.encode()))
    return data[:keep].decode("utf-8", "ignore") + _MARK


def _trim_tail(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    keep = max(0, max_bytes - len(_MARK.encode()))
    return _MARK + data[len(data) - keep :].decode("utf-8", "ignore")


def evidence_headers(failure: Failure, budget: int = DEFAULT_BUDGET) -> dict[str, str | int]:
    """Build the evidence headers for ``failure``, at most ``budget`` bytes in all.

    Short fields are each capped at 1 KiB; then the traceback (keeping its end, where the
    error is) and the error message (keeping its start) share what the budget leaves. The
    tenant is kept whole and outside the budget: it came on the job, whose size ``enqueue``
    checked against ``frame_max`` with it, and the copy carries it once.

    Args:
        failure: The failure to describe.
        budget: Byte budget for names + values (UTF-8) but the tenant's, default 16 KiB.

    Returns:
        Header name → ``str`` or ``int`` value, every name in :data:`EVIDENCE_HEADERS` but
        :data:`TENANT` for a job without a tenant (absent stays absent: a replayed copy
        must not carry a tenant named ``""``).

    """
    f = failure
    short: dict[str, str | int] = {
        REASON: f.reason,
        ERROR_TYPE: f.error_type,
        ATTEMPTS: f.attempts,
        FIRST_FAILURE_AT: f.first_failure_at,
        LAST_FAILURE_AT: f.last_failure_at,
        WORKER_HOST: f.host,
        WORKER_PID: f.pid,
        VERSION: f.version,
        APP_VERSION: f.app_version,
        ORIGINAL_EXCHANGE: f.exchange,
        ORIGINAL_QUEUE: f.queue,
        ORIGINAL_ROUTING_KEY: f.routing_key,
        JOB: f.job,
        JOB_ID: f.job_id,
        DELIVERY_COUNT: f.delivery_count,
        ACQUIRED_COUNT: f.acquired_count,
    }
    short = {k: (_trim_head(encodable(v), 1024) if isinstance(v, str) else v) for k, v in short.items()}
    room = budget - _size(short) - _size({ERROR_MESSAGE: "", TRACEBACK: ""})
    if f.tenant.strip():  # whole: the replayed copy must keep its tenant (and shard); it came in this size
        short[TENANT] = encodable(f.tenant)  # outside the budget: already on the job, in the frame enqueue sized
    message, tb = encodable(f.error_message), encodable(f.traceback)
    msg_room = max(256, room // 4)
    message = _trim_head(message, msg_room)
    tb = _trim_tail(tb, max(0, room - len(message.encode("utf-8"))))
    return {**short, ERROR_MESSAGE: message, TRACEBACK: tb}


def trimmed_budget(headers: Mapping[str, object], excess: int) -> int | None:
    """The evidence budget that lets a quarantine copy over its frame by ``excess`` bytes fit.

    Another publisher's headers may leave less of ``frame_max`` than the evidence takes
    (``enqueue`` leaves :data:`WORKER_HEADROOM`): the copy then carries its evidence built
    again with this budget (the evidence in ``headers`` less ``excess`` and 256 bytes for
    field encodings), error message and traceback trimmed first.

    Args:
        headers: The quarantine copy's headers, evidence included (the tenant, outside the
            budget, is not counted: :func:`evidence_headers`).
        excess: Bytes by which the copy was over the frame.

    Returns:
        The smaller budget in bytes, or None when it would be under :data:`MIN_BUDGET`
        (the delivery is then rejected as it is: README "Bad messages").
    """
    used = _size({k: v for k, v in headers.items() if k in _BUDGETED and isinstance(v, str | int)})
    smaller = used - excess - 256
    return smaller if smaller >= MIN_BUDGET else None
