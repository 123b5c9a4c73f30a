"""Poison containment: count the starts of a job that never reached an outcome.

A job that kills its worker (``os._exit``, a segfault, the OOM killer), blocks the event
loop past the heartbeat timeout, or outlives the broker's ``consumer_timeout`` never gets
an outcome: its delivery simply returns to the queue with ``redelivered=true``. Classic
queues count nothing (RabbitMQ "Consumer Acknowledgements" -> "Redelivery"; no delivery
count on classic queues, 3.10 through 4.3), and a quorum queue's ``delivery_limit`` drops
or dead-letters without our evidence. So the workers count, durably, in the message:

* a delivery the broker marks ``redelivered`` had a start that ended without an outcome
  (a worker never hands a delivery back with a requeue: what it did not start it
  republishes unchanged and acks, see :data:`STARTS`; except on a RabbitMQ 4.3+ quorum
  queue, where it nacks it back and ``x-delivery-count`` tells a crash from a hand-back);
* the worker that receives such a redelivery does not run it: it publishes a copy
  registered for the next start (``amqpjobs-starts`` + 1, who registered it and when,
  confirmed) to the job queue's *suspects* queue and acks the redelivery. The count lives
  on the broker, so it survives worker restarts and is shared by every worker of the queue;
* nobody consumes the suspects queue: a worker that finds it non-empty stops consuming,
  hands back unstarted what it holds, lets its running jobs finish, and only then takes
  one suspect (``basic.get``) and runs it alone. Nothing else is held unacked by that
  worker, so if the suspect brings it down again, no other job is charged for it; and a
  suspect is never pushed to a consumer, so it is never held beside another job's run;
* when a redelivery shows that start ``max_redeliveries + 1`` ended without an outcome,
  the job is quarantined with reason ``crashed``.

Pure rules; the worker carries them out (:mod:`amqpjobs.runtime.worker`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from amqpjobs.jobs.envelope import parse_attempt

#: int header: the start this copy is registered for (missing = 1: a fresh job's first start).
STARTS: Final = "amqpjobs-starts"
#: Who registered the last start, ``host`` and ``pid``, and when (ISO-8601 UTC).
LAST_START_HOST: Final = "amqpjobs-last-start-host"
LAST_START_PID: Final = "amqpjobs-last-start-pid"
LAST_START_AT: Final = "amqpjobs-last-start-at"
#: The work queue a suspect came from (it waits in the job queue's suspects queue meanwhile).
WORK_QUEUE: Final = "amqpjobs-work-queue"
#: Headers of the start count: reset on every copy made after an outcome (retry tiers, replay).
#: A registered start that waits in a retry tier (its idempotency claim was busy, or the ledger
#: down): the copy that comes back from the tier is registered again for this start, not run from
#: the work queue, where :data:`STARTS` is ignored (the count would begin again: a job killing
#: its workers while a dead worker's claim lives would never reach ``crashed``). Honoured on a
#: work queue delivery of an idempotent job only (the only kind that waits so), and only when a
#: worker of the same ledger wrote it: its value is ``<start>:<seal>``, the seal an HMAC-SHA256
#: of the job id and the start under a key the ledger keeps (:func:`seal_waiting_start`). Another
#: publisher's value (a bare number, a wrong seal, another job's) is ignored, as :data:`STARTS`
#: is: it could otherwise register a fresh job as a suspect at its last start, run it alone, and
#: have one crash (a worker killed by a deploy) quarantine it. On other jobs it is ignored.
WAITING_START: Final = "amqpjobs-waiting-start"
START_HEADERS: Final = (STARTS, LAST_START_HOST, LAST_START_PID, LAST_START_AT, WORK_QUEUE, WAITING_START)


@dataclass(frozen=True, slots=True)
class Screening:
    """What to do with a delivery before its handler may run.

    Attributes:
        action: ``run`` (an ordinary start), ``alone`` (a suspect: run it only with nothing
            beside it, i.e. from the suspects queue; elsewhere move it there), ``register``
            (publish a copy registered for start ``start`` to the suspects queue, then ack),
            or ``crashed`` (quarantine: ``start`` starts ended without an outcome).
        start: The start number this delivery is (``run``/``alone``), the number to register
            (``register``), or the number of starts without an outcome (``crashed``).

    """

    action: str
    start: int


_FIRST = Screening("run", 1)


def starts_of(headers: Mapping[str, Any]) -> int:
    """The start a delivery is registered for: our header, read like the attempt header (missing or bad = 1)."""
    return parse_attempt(headers.get(STARTS))


def _seal(key: bytes, job_id: str, start: int) -> str:
    return hmac.new(key, f"{job_id}\n{start}".encode(errors="surrogatepass"), hashlib.sha256).hexdigest()[:32]


def seal_waiting_start(key: bytes | None, job_id: str, start: int) -> str | int:
    """The :data:`WAITING_START` value of job ``job_id``'s copy waiting with registered start ``start``.

    ``<start>:<seal>``, the seal an HMAC-SHA256 (32 hex digits) of the job id and the start under
    ``key``, the ledger's (:mod:`amqpjobs.runtime.ledger_key`); the bare ``start`` without a key
    (a ledger of another kind, that keeps none: any publisher's value is honoured then).
    """
    return start if key is None else f"{start}:{_seal(key, job_id, start)}"


def waiting_start(headers: Mapping[str, Any], job_id: str, key: bytes | None) -> int | None:
    """The registered start a delivery of job ``job_id`` waited with, when a worker of this ledger sealed it.

    None when the header is missing or is another publisher's: no ``<start>:<seal>`` of this job
    under ``key``. Without a key, the value as is (:func:`seal_waiting_start`).
    """
    value = headers.get(WAITING_START)
    if value is None:
        return None
    if key is None:
        return parse_attempt(value)
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    start, colon, seal = text.partition(":") if isinstance(text, str) else ("", "", "")
    if not colon or not start.isascii() or not start.isdigit() or len(start) > 6:
        return None
    return int(start) if hmac.compare_digest(seal, _seal(key, job_id, int(start))) else None


def screen(
    redelivered: bool,
    headers: Mapping[str, Any],
    max_redeliveries: int,
    *,
    registered: bool,
    waiting: int | None = None,
) -> Screening:
    """Decide about a delivery of a job before running it.

    Args:
        redelivered: The broker's ``redelivered`` flag (classic and quorum queues alike).
        headers: The delivery's headers (reads :data:`STARTS`).
        max_redeliveries: Starts without an outcome allowed after the first (>= 0).
        registered: The delivery comes from the job queue's suspects queue, where workers
            put the starts they register. Elsewhere :data:`STARTS` is not a count of ours
            (workers never put a registered start back in a work queue) and is ignored: a
            publisher's ``amqpjobs-starts`` never charges a job with crashes it did not have.
            A count over ``max_redeliveries + 1`` is no worker's (it would have quarantined the job
            instead) and is read as that bound (README "Wire format": a count the worker can't have
            written is not believed): a suspect forged with ``amqpjobs-starts: 999`` runs as the last start.
            A registered start that waited in a retry tier comes back with :data:`WAITING_START`
            and is registered again for that start (redelivered or not: it never runs there).
        waiting: That start, read by :func:`waiting_start` (an idempotent job's only: only its
            suspects wait in a tier with their start, on another's claim or for the ledger);
            None for any other job, or a value no worker of the ledger sealed: another
            publisher's, ignored like :data:`STARTS`.

    Every redelivery counts as a start, on every version: the broker's counters can't tell a
    start from a hand-back (on 4.3 quorum queues a nack, a consumer timeout and a partition
    all raise only ``x-acquired-count``, release notes 4.3.0, and a consumer timeout returns
    runs still going), so the worker never hands back by requeue: a copy, then an ack.

    Returns:
        The :class:`Screening`: a fresh first delivery runs; a registered copy (start > 1)
        runs alone; a redelivery registers the next start or, once start
        ``max_redeliveries + 1`` ended without an outcome, is ``crashed``.

    """
    if waiting is not None and not registered:  # a registered start back from its wait: again
        return Screening("register", min(max(waiting, 1), max_redeliveries + 1))
    if not redelivered and (STARTS not in headers or not registered):
        return _FIRST
    # a count no worker writes (over the bound: it would have quarantined the job) is read as the most one does
    start = min(starts_of(headers), max_redeliveries + 1) if registered else 1
    if not redelivered:
        return Screening("alone" if start > 1 else "run", start)
    if start > max_redeliveries:
        return Screening("crashed", start)
    return Screening("register", start + 1)
