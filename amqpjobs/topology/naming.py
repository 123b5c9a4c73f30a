"""How a job queue's name expands into broker object names.

The naming scheme (documented in README "Topology"), for a job queue ``N``:

=======================  ==========================================  ======================
object                   name                                        example (``N=urgent``)
=======================  ==========================================  ======================
work queue               ``N`` (or ``N.shard-<i>`` when sharded)     ``urgent``
delay queue, one a tier  ``<work queue>.retry.<tier>``               ``urgent.retry.30s``
quarantine exchange      ``N.quarantine`` (fanout)                   ``urgent.quarantine``
quarantine queue         ``N.quarantine``                            ``urgent.quarantine``
suspects queue           ``N.suspects``                              ``urgent.suspects``
parked queue             ``N.parked``                                ``urgent.parked``
pause flag               ``N.paused`` (only while paused)            ``urgent.paused``
outcome events exchange  ``amqpjobs.events`` (topic, one a vhost)    routing key ``urgent.succeeded``
pause signals            ``amq.direct`` (pre-declared)               routing key ``amqpjobs.pause.urgent``
pause listener (worker)  ``amqpjobs.pause-listener.<id>`` (exclusive)
breaker state (open)     ``N.breaker.<job>`` (durable, no messages)  ``urgent.breaker.mail``
breaker probe lock       ``N.breaker-probe.<job>`` (exclusive)       ``urgent.breaker-probe.mail``
waiting room of job J    ``N.rate-waiting.J`` (rate-limited jobs)    ``urgent.rate-waiting.sms``
token queue of job J     ``N.rate-tokens.J``                         ``urgent.rate-tokens.sms``
token emitter lock       ``N.rate-emitter.J`` (exclusive queue)      ``urgent.rate-emitter.sms``
=======================  ==========================================  ======================

Pause signals go through RabbitMQ's pre-declared direct exchange :data:`SIGNAL_EXCHANGE`
with routing key :func:`pause_signal_key` (a user can't delete it and unbind every worker
unnoticed, as with the ``amqpjobs.control`` exchange used before). A job's breaker notices
go through RabbitMQ's pre-declared headers exchange :data:`BREAKER_EXCHANGE` (it exists on
every vhost and can't be deleted: RabbitMQ "Exchanges" -> "Pre-declared Exchanges"), matched
on header :data:`BREAKER_HEADER` = job queue.

The breaker's and the three rate-limit queues are declared by the workers, not the topology
(breakers and rate limits are in the app's code: README "Flow control"); a job queue name
holding one of their markers is refused (:data:`JOB_MARKERS`); :func:`parse_queue_name` reads names back (kept: frozen).

Tiers are named by :func:`amqpjobs.durations.format_duration` of their TTL. Shard
``i`` of ``N`` is bound with routing key ``<key>.shard-<i>`` for each routing key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.printable import printable
from amqpjobs.text import ascii_digits

QUARANTINE_SUFFIX = ".quarantine"
SUSPECTS_SUFFIX = ".suspects"
PARKED_SUFFIX = ".parked"
#: Suffix of a job queue's pause flag, a durable queue that exists while an operator pauses it (``amqpjobs pause``).
PAUSED_SUFFIX = ".paused"
#: The exchange ``amqpjobs pause/resume`` tell workers through: pre-declared, so never missing
#: (RabbitMQ "Exchanges" -> "Pre-declared Exchanges"); routing key :func:`pause_signal_key`.
SIGNAL_EXCHANGE = "amq.direct"
#: Prefix of a worker's exclusive queue for pause signals: ``amqpjobs.pause-listener.<id>``.
LISTENER_PREFIX = "amqpjobs.pause-listener."
#: Suffix of the x-modulus-hash exchange of a sharded job queue with ``shard_routing = "modulus-hash"``.
SHARDS_SUFFIX = ".shards"
#: The topic exchange workers publish one outcome event to per delivery (:mod:`amqpjobs.jobs.events`).
EVENTS_EXCHANGE = "amqpjobs.events"
RETRY_INFIX = ".retry."
#: Infix of a job's breaker state queue: ``<job queue>.breaker.<job>`` (:mod:`amqpjobs.jobs.breaker`).
BREAKER_INFIX = ".breaker."
#: Infix of a job's breaker probe lock: ``<job queue>.breaker-probe.<job>`` (an exclusive queue).
BREAKER_PROBE_INFIX = ".breaker-probe."
#: Where breaker notices go: the pre-declared headers exchange (never missing).
BREAKER_EXCHANGE = "amq.headers"
#: The header breaker notices are routed by (its value: the job queue).
BREAKER_HEADER = "amqpjobs-breaker"
SHARD_INFIX = ".shard-"
#: Prefix of the scheduler's queues (:mod:`amqpjobs.jobs.cron`): ``amqpjobs.scheduler.<app>.…``.
SCHEDULER_PREFIX = "amqpjobs.scheduler."
#: Prefix of an app's ledger marker (:mod:`amqpjobs.runtime.ledger_origin`): ``amqpjobs.ledger.<app>``.
LEDGER_PREFIX = "amqpjobs.ledger."
#: Markers of a rate-limited job's queues: ``<job queue><marker><job>`` (:func:`rate_queue_names`).
WAITING_INFIX = ".rate-waiting."
TOKENS_INFIX = ".rate-tokens."
EMITTER_INFIX = ".rate-emitter."
RATE_INFIXES = (WAITING_INFIX, TOKENS_INFIX, EMITTER_INFIX)
#: Markers of a job's own queues (its breaker's, its rate limit's): no job queue name may hold one.
JOB_MARKERS = (BREAKER_INFIX, BREAKER_PROBE_INFIX, *RATE_INFIXES)

QueueKind = Literal[
    "work", "shard", "tier", "quarantine", "suspects", "parked", "paused", "leader", "ticks", "running",
    "breaker", "breaker-probe", "waiting", "tokens", "emitter", "ledger",
]  # fmt: skip


#: The longest queue name AMQP carries: a short string, 255 bytes of UTF-8 (AMQP 0-9-1 "shortstr").
MAX_NAME_BYTES = 255


#: The names the AMQP client library (pamqp, under aio-pika) puts in a frame: its
#: ``pamqp.constants.DOMAIN_REGEX`` for queue and exchange names, copied here because topology/
#: imports no client library (tests/unit/test_naming.py checks the copy). RabbitMQ itself takes
#: any UTF-8 up to 255 bytes (RabbitMQ "Queues" -> "Names"); pamqp is stricter.
ADDRESSABLE_NAME = re.compile(r"[a-zA-Z0-9-_.:@#,/+ ]*")
#: :data:`ADDRESSABLE_NAME` in words, for messages.
ADDRESSABLE_CHARS = "letters a-z A-Z, digits, space and - _ . : @ # , / +"
#: What a name in a topology file takes, in words: :data:`ADDRESSABLE_CHARS` without the space
#: (the models' ``Name`` refuses whitespace, so a message never offers one).
TOPOLOGY_NAME_CHARS = "letters a-z A-Z, digits and - _ . : @ # , / +"
#: pamqp's longest names, in characters (``Exchange.Declare`` / ``Queue.Declare`` validate()).
MAX_CLIENT_NAME = {"queue": 256, "exchange": 127}

NameKind = Literal["queue", "exchange"]


def unaddressable_problem(name: str, kind: NameKind) -> str | None:
    """What keeps pamqp from sending ``name`` (a ``kind`` name) in a frame, or None when it can.

    The one home of the rule: the topology loader refuses such names before declaring anything,
    and the wire error map (:func:`amqpjobs.wire.errors.unaddressable`) words pamqp's refusal
    of an existing queue with :data:`ADDRESSABLE_CHARS`. Empty is not a problem here (the
    broker names the queue).
    """
    if not ADDRESSABLE_NAME.fullmatch(name):
        return f"{kind} name {printable(repr(name))} has characters the AMQP client refuses (only {ADDRESSABLE_CHARS})"
    if len(name) > MAX_CLIENT_NAME[kind]:
        return (f"{kind} name {printable(repr(name))[:40]}... is {len(name)} characters; the AMQP client takes at most "
                f"{MAX_CLIENT_NAME[kind]}")  # fmt: skip
    return None


def queue_name_problem(name: str) -> str | None:
    """What makes ``name`` unusable as a queue name we would send the broker, or None when it is fine.

    AMQP 0-9-1 carries names as a short string: at most 255 bytes of UTF-8 (the client
    library raises a bare ``ValueError`` beyond that). Empty names and names with control
    characters, line breaks or terminal escapes (:func:`amqpjobs.printable.printable`) are
    refused too: we never create one, and an operator typing one meant something else.
    """
    if not name:
        return "queue name is empty"
    if printable(name) != name:
        return f"queue name {printable(repr(name))} has control characters; queue names are printable text"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return f"queue name {printable(name[:40])}... is {size} bytes of UTF-8; AMQP allows at most {MAX_NAME_BYTES}"
    return None


def vhost_problem(vhost: str) -> str | None:
    """What makes ``vhost`` unusable as a vhost name, or None when it is fine (the one home of the rule).

    AMQP 0-9-1 carries it in ``connection.open`` as a short string (at most 255 bytes of UTF-8);
    control characters, line breaks and terminal escapes are refused as in queue names
    (:func:`queue_name_problem`): no one means them, and they would be written into definitions
    and logs. Empty is left to the caller (a URL without a path means ``/``). ``.`` and ``..`` are
    refused: the management API can't address them (RabbitMQ answers 405 to ``/api/vhosts/%2E``,
    as to any dot segment of a path, RFC 3986 5.2.4).
    """
    if vhost in (".", ".."):
        return f"vhost {vhost!r} can't be named in a management API URL (a dot segment); give the vhost another name"
    if printable(vhost) != vhost:
        return f"vhost {printable(repr(vhost))} has control characters; vhost names are printable text"
    size = len(vhost.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return f"vhost {printable(vhost[:40])}... is {size} bytes of UTF-8; AMQP allows at most {MAX_NAME_BYTES}"
    return None


def ledger_marker_name(app: str) -> str:
    """The durable queue whose existence says app ``app`` has had a ledger: ``amqpjobs.ledger.<app>``."""
    return f"{LEDGER_PREFIX}{app}"


def work_queue_name(job_queue: str, shard: int | None = None) -> str:
    """Name of the work queue (or of shard ``shard``) of job queue ``job_queue``."""
    return job_queue if shard is None else f"{job_queue}{SHARD_INFIX}{shard}"


def tier_queue_name(work_queue: str, ttl_seconds: float) -> str:
    """Name of the delay queue of ``work_queue`` whose TTL is ``ttl_seconds`` seconds."""
    return f"{work_queue}{RETRY_INFIX}{format_duration(ttl_seconds)}"


def quarantine_exchange_name(job_queue: str) -> str:
    """Name of the (fanout) quarantine exchange of job queue ``job_queue``."""
    return f"{job_queue}{QUARANTINE_SUFFIX}"


def shards_exchange_name(job_queue: str) -> str:
    """Name of the ``x-modulus-hash`` exchange bound to every shard of ``job_queue`` (RabbitMQ 4.3+)."""
    return f"{job_queue}{SHARDS_SUFFIX}"


def quarantine_queue_name(job_queue: str) -> str:
    """Name of the quarantine queue of job queue ``job_queue``."""
    return f"{job_queue}{QUARANTINE_SUFFIX}"


def suspects_queue_name(job_queue: str) -> str:
    """Name of the queue where jobs whose start ended without an outcome wait to run alone."""
    return f"{job_queue}{SUSPECTS_SUFFIX}"


def parked_queue_name(job_queue: str) -> str:
    """Name of the queue where an operator parks quarantined jobs of ``job_queue`` (``amqpjobs quarantine park``)."""
    return f"{job_queue}{PARKED_SUFFIX}"


def pause_signal_key(job_queue: str) -> str:
    """Routing key of ``job_queue``'s pause signals on :data:`SIGNAL_EXCHANGE`: ``amqpjobs.pause.<job queue>``."""
    return f"amqpjobs.pause.{job_queue}"


def paused_flag_name(job_queue: str) -> str:
    """Name of the queue whose existence says an operator paused ``job_queue`` (:mod:`amqpjobs.wire.flags`)."""
    return f"{job_queue}{PAUSED_SUFFIX}"


def breaker_queue_name(job_queue: str, job: str) -> str:
    """Name of the durable queue whose arguments record that ``job``'s breaker is open (it holds no messages)."""
    return f"{job_queue}{BREAKER_INFIX}{job}"


def breaker_probe_name(job_queue: str, job: str) -> str:
    """Name of the exclusive queue held by the one worker probing ``job``'s half-open breaker."""
    return f"{job_queue}{BREAKER_PROBE_INFIX}{job}"


@dataclass(frozen=True)
class RateQueues:
    """The queues of one rate-limited job (README "Flow control" -> "Rate limits").

    Attributes:
        waiting: Its waiting room: deliveries moved out of the work queue until a token comes.
        tokens: Its token queue (one token at most).
        emitter: The exclusive queue whose holder mints its tokens (a lock: :mod:`amqpjobs.wire.lock`).
    """

    waiting: str
    tokens: str
    emitter: str


def rate_queue_names(job_queue: str, job: str) -> RateQueues:
    """The queues of rate-limited job ``job`` served from ``job_queue``."""
    return RateQueues(*(f"{job_queue}{infix}{job}" for infix in RATE_INFIXES))


def own_queue_problem(names: Iterable[str]) -> tuple[str, str] | None:
    """(name, why) for the first of a job's own queue ``names`` the broker or the client can't take, or None.

    A job's breaker and rate-limit queues hold its name (:data:`JOB_MARKERS`), so a job name
    can make them too long or unaddressable.
    """
    for name in names:
        if problem := queue_name_problem(name) or unaddressable_problem(name, "queue"):
            return name, problem
    return None


def app_names_problem(app: str, names: Iterable[str], what: str) -> str | None:
    """Why app ``app``'s name can't go into the names of its ``what`` (``names``), or None.

    It goes into its ledger marker (:func:`ledger_marker_name`), scheduler queues: :func:`own_queue_problem`'s rule.
    """
    if (found := own_queue_problem(names)) is None:
        return None
    name = printable(repr(found[0]))[:60]
    return (f"app name {printable(repr(app))[:60]} goes into the name of its {what} ({name}...): {found[1]}; "
            "give the App a name those queue names can take")  # fmt: skip


def rate_names_problem(job_queue: str, job: str) -> str | None:
    """Why job ``job`` of ``job_queue`` can't have a rate limit (its queue names can't be sent), or None."""
    names = rate_queue_names(job_queue, job)
    if found := own_queue_problem((names.waiting, names.emitter)):
        return f"a rate-limited job's name goes into queue names ({found[0][:60]!r}...): {found[1]}"
    return None


def event_routing_key(job_queue: str, outcome: str) -> str:
    """Routing key of an outcome event: ``<job queue>.<outcome>`` (a topic key; bind ``<job queue>.*`` for all)."""
    return f"{job_queue}.{outcome}"


def shard_routing_key(routing_key: str, shard: int) -> str:
    """Routing key that reaches shard ``shard`` for a job queue bound with ``routing_key``."""
    return f"{routing_key}{SHARD_INFIX}{shard}"


@dataclass(frozen=True)
class QueueName:
    """What a queue's name says by our naming scheme (see :func:`parse_queue_name`).

    Attributes:
        kind: ``work`` (any name not matched otherwise), ``shard``, ``tier``,
            ``quarantine``, ``suspects``, ``parked``, ``paused`` (a pause flag), a scheduler queue:
            ``leader``, ``ticks``, ``running``, an app's ledger marker: ``ledger``, a job's breaker
            queues: ``breaker``, ``breaker-probe``, or a rate-limited job's ``waiting``, ``tokens``, ``emitter``.
        job_queue: The job queue it belongs to ("" for scheduler queues).
        work_queue: The work queue (the shard for a shard or a shard's tier; "" when none).
        shard: The shard index, for a shard and a shard's tier.
        tier: The tier's name (e.g. ``30s``), for a tier.
        app: The app, for a scheduler queue and a ledger marker.
        schedule: The schedule, for ``ticks`` and ``running``.
        job: The job, for a job's breaker and rate-limit queues.

    """

    kind: QueueKind
    job_queue: str = ""
    work_queue: str = ""
    shard: int | None = None
    tier: str | None = None
    app: str | None = None
    schedule: str | None = None
    job: str | None = None


#: The markers of a job's own queues (breaker, rate limit) and the kind each names.
_JOB_KINDS: dict[str, QueueKind] = {
    BREAKER_INFIX: "breaker", BREAKER_PROBE_INFIX: "breaker-probe",
    WAITING_INFIX: "waiting", TOKENS_INFIX: "tokens", EMITTER_INFIX: "emitter",
}  # fmt: skip


def _is_tier_name(tier: str) -> bool:
    """Whether ``tier`` is a tier name we would create: :func:`format_duration` of its own duration."""
    try:
        return format_duration(parse_duration(tier)) == tier
    except ValueError:
        return False


def _work(name: str) -> QueueName:
    base, infix, index = name.rpartition(SHARD_INFIX)
    if infix and base and ascii_digits(index) and str(int(index)) == index:
        return QueueName("shard", base, name, shard=int(index))
    return QueueName("work", name, name)


def own_queue_words(q: QueueName) -> str:
    """What a queue that is not a work queue is, in words (``the quarantine queue of job queue urgent``).

    For a queue name given where a job queue's name belongs (``status --queues urgent.quarantine``).
    """
    job_queue = printable(q.job_queue)
    if q.kind == "shard":
        return f"shard {q.shard} of job queue {job_queue}"
    if q.kind == "tier":
        return f"retry tier {q.tier} of work queue {printable(q.work_queue)} (job queue {job_queue})"
    if q.kind in ("leader", "ticks", "running"):
        return f"a scheduler queue of app {printable(q.app or '')}"
    if q.kind == "ledger":
        return f"the ledger marker of app {printable(q.app or '')}"
    if q.job is not None:
        return f"job {printable(q.job)}'s {q.kind} queue in job queue {job_queue}"
    return f"the {'pause flag' if q.kind == 'paused' else q.kind + ' queue'} of job queue {job_queue}"


@lru_cache(maxsize=65536)  # a pure reading; status over 100 job queues asked it 150,000 times of 500 names
def parse_queue_name(name: str) -> QueueName:
    """Read a queue name by our naming scheme: the one parser of queue names (no I/O).

    A job's own queues (breaker, rate limit: :data:`JOB_MARKERS`) come first: the earliest such
    marker splits job queue and job (``q.breaker.j`` is job ``j``'s breaker state in job queue
    ``q``, whatever ``j`` holds; the topology refuses job queue names with one). Otherwise the
    last marker wins (``a.retry.30s`` is a tier of work queue ``a``). Only names we would
    create count as ours: a tier part must be a duration in the tiers' own form
    (:func:`~amqpjobs.durations.format_duration`: ``5s``, not ``5s.bak``, ``05s`` or ``5000ms``)
    and a shard index is decimal digits without a leading zero. Anything else (``mail.retry.5s.bak``)
    is a work queue of a job queue of that whole name, as are names with none of our markers.
    """
    if name.startswith(SCHEDULER_PREFIX):
        rest = name.removeprefix(SCHEDULER_PREFIX)
        if rest.endswith(".leader") and len(rest) > len(".leader"):
            return QueueName("leader", app=rest.removesuffix(".leader"))
        for kind in ("ticks", "running"):
            app, marker, schedule = rest.partition(f".{kind}.")
            if marker and app and schedule:
                return QueueName(kind, app=app, schedule=schedule)
    if name.startswith(LEDGER_PREFIX) and len(name) > len(LEDGER_PREFIX):
        return QueueName("ledger", app=name.removeprefix(LEDGER_PREFIX))
    found = [(at, infix) for infix in JOB_MARKERS if (at := name.find(infix)) > 0]
    if found:  # the earliest: a job queue's name holds none, a job's name may hold anything
        at, infix = min(found)
        if job := name[at + len(infix) :]:
            return QueueName(_JOB_KINDS[infix], name[:at], job=job)
    if name.endswith(QUARANTINE_SUFFIX) and len(name) > len(QUARANTINE_SUFFIX):
        return QueueName("quarantine", name.removesuffix(QUARANTINE_SUFFIX))
    if name.endswith(SUSPECTS_SUFFIX) and len(name) > len(SUSPECTS_SUFFIX):
        return QueueName("suspects", name.removesuffix(SUSPECTS_SUFFIX))
    if name.endswith(PARKED_SUFFIX) and len(name) > len(PARKED_SUFFIX):
        return QueueName("parked", name.removesuffix(PARKED_SUFFIX))
    if name.endswith(PAUSED_SUFFIX) and len(name) > len(PAUSED_SUFFIX):
        return QueueName("paused", name.removesuffix(PAUSED_SUFFIX))
    work_queue, infix, tier = name.rpartition(RETRY_INFIX)
    if infix and work_queue and _is_tier_name(tier):
        work = _work(work_queue)
        return QueueName("tier", work.job_queue, work_queue, shard=work.shard, tier=tier)
    return _work(name)
