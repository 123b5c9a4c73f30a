"""What a replay is asked to do and what it reports: options, report, and the confirm window (pure).

:class:`ReplayOptions` and :class:`ReplayReport` are the shapes the CLI, the console and
:mod:`amqpjobs.runtime.replay` share (README "Replaying quarantined jobs").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import shortstr_problem
from amqpjobs.jobs.quarantine import QuarantinedJob, Selection
from amqpjobs.printable import printable, shell_quote
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import own_queue_words, parse_queue_name
from amqpjobs.topology.orphans import Route, replay_route

#: Ceilings of a replay asked for by a person, the same in the CLI (``replay --rate/--canary/
#: --canary-timeout``, exit 2) and the console (HTTP 400 naming the field): a slip such as
#: ``1e308`` is refused, not run. Messages per second, canary jobs, seconds to wait for the
#: canaries (1 h). README "Replaying quarantined jobs".
MAX_REPLAY_RATE: Final = 10_000.0
#: The floor of ``--rate`` (replay, park, unpark; the console's too), messages per second: one move
#: each 1000 s. Below it a slip (``1e-300``) moved one job, then waited for ever holding the mover lock.
MIN_REPLAY_RATE: Final = 0.001
MAX_CANARY: Final = 10_000
MAX_CANARY_TIMEOUT: Final = 3600.0
#: Seconds a canary replay waits for its canaries' outcomes unless told (CLI, console form and server alike).
DEFAULT_CANARY_TIMEOUT: Final = 60.0


def check_rate(rate: float) -> float:
    """``rate`` (messages per second) when a mover may pace by it, between the floor and the ceiling.

    Raises:
        ConfigurationError: NaN, infinite, below :data:`MIN_REPLAY_RATE` or above
            :data:`MAX_REPLAY_RATE` (the message names ``--rate`` and both bounds).

    """
    if not (MIN_REPLAY_RATE <= rate <= MAX_REPLAY_RATE):  # NaN fails every comparison
        raise ConfigurationError(
            f"--rate must be a positive, finite number of messages per second, at least {MIN_REPLAY_RATE:g} (one "
            f"message each {1 / MIN_REPLAY_RATE:g} s) and at most {MAX_REPLAY_RATE:g} (got {_as_given(rate)})"
        )
    return rate


def _as_given(number: float) -> str:
    """``number`` short (``20000``), unless that rounds it (``10000.0000000001`` is not "10000", a bound)."""
    short = f"{number:g}"
    return short if float(short) == number or number != number else repr(number)  # NaN: "nan"


def check_replay_target(to: str | None) -> None:
    """Refuse a replay's ``to`` (``--to``) that is not a work queue (or a shard of one).

    A quarantine, parked, suspects or delay-tier queue is no place to run jobs: they would
    wait there unseen, or go round.

    Raises:
        ConfigurationError: ``to`` names a queue of another kind (the message says which).

    """
    kind = None if to is None else parse_queue_name(to).kind
    if to is not None and kind not in ("work", "shard"):
        raise ConfigurationError(
            f"--to {to!r} is a {kind} queue: replay sends jobs back to a work queue (or leave --to out to send "
            "each to the queue it failed on)"
        )


#: Queues of a job queue that hold its jobs but run none: a message whose evidence names one goes back to
#: the job queue's work queue. A retry tier dead-letters there by itself; the quarantine, suspects and
#: parked queues and a rate-limited job's waiting room are where its jobs wait (README "Quarantine and replay").
HOLDING_KINDS: Final = ("tier", "quarantine", "suspects", "parked", "waiting")


@dataclass(frozen=True)
class Destination:
    """Where a quarantined message goes back to, or why it can't: :func:`destination`.

    Attributes:
        route: Where its copy is published; None when it stays (``skip`` says why).
        why: Why ``route`` is not the queue its evidence names ("" when it is): a dropped shard
            re-routed, or a queue that runs no jobs sent to its work queue.
        skip: ``no-origin`` (no queue named), ``far`` (a name over 255 bytes, which no publish
            can address), ``no-work-queue`` (a queue of ours that holds no jobs of a job queue),
            or "" when it goes.
        problem: For ``no-work-queue``, what its evidence names, in words, and the fix.

    """

    route: Route | None
    why: str = ""
    skip: str = ""
    problem: str = ""


def destination(named: str, key: str, to: str | None, layouts: Mapping[str, JobQueueLayout] | None) -> Destination:
    """Where a quarantined message whose evidence names queue ``named`` goes back to: the one home of the rule.

    ``to`` (``--to``) wins. Else a work queue or shard goes back there (a shard the topology no
    longer has by the current shard rule: :func:`~amqpjobs.topology.orphans.replay_route`). A queue
    that holds a job queue's jobs but runs none (:data:`HOLDING_KINDS`: a retry tier, the
    quarantine, suspects or parked queue, a waiting room) sends it to that job queue's work queue,
    as the broker would from a tier: the tier's own work queue, else the job queue's (a sharded one
    of ``layouts`` by the shard rule, keyed ``key``: its tenant, else its job id). Without the app's
    layouts a sharded job queue has no queue of its name: that message then stays, its target
    missing. Any other queue of ours (a pause flag, a scheduler's, breaker's or token queue)
    holds no jobs: it stays, with the fix (``--to``). The names are read by
    :func:`~amqpjobs.topology.naming.parse_queue_name`; nothing is asked of the broker.
    """
    if to:
        return Destination(Route("", to, to))
    if not named:
        return Destination(None, skip="no-origin")
    if shortstr_problem("queue", named) is not None:  # no routing key can name it
        return Destination(None, skip="far")
    parsed = parse_queue_name(named)
    if parsed.kind in ("work", "shard"):
        return Destination(*replay_route(named, key, layouts))
    said = f"its evidence names {printable(named)}, {own_queue_words(parsed)}, which runs no jobs"
    if parsed.kind not in HOLDING_KINDS:
        return Destination(None, skip="no-work-queue", problem=f"{said}: replay it with --to QUEUE")
    home = f"{said}: back to its work queue"
    layout = (layouts or {}).get(parsed.job_queue)
    if parsed.kind != "tier" and layout is not None and (layout.shard_routing_keys or layout.shards_exchange):
        exchange, routing_key = layout.publish_target(key)  # sharded: the shard rule picks, as for an enqueue
        shown = exchange if exchange == layout.shards_exchange else layout.work_queue_for(routing_key)
        return Destination(Route(exchange, routing_key, shown), home)
    work_queue = parsed.work_queue if parsed.kind == "tier" else parsed.job_queue
    route, rerouted = replay_route(work_queue, key, layouts)
    return Destination(route, f"{home}; {rerouted}" if rerouted else home)


@dataclass(frozen=True)
class ReplayOptions:
    """What to replay and how fast.

    Attributes:
        rate: Messages per second, at most (> 0).
        to: Target work queue for every message; None = each message's original queue.
        limit: At most this many messages replayed (None: all that match).
        selection: Filters; the rest stay in quarantine.
        dry_run: Only report what would move.
        stop_after_failures: Stop once this many replayed jobs came back to quarantine.
        canary: Move this many first and go on only if each succeeds (its outcome event,
            :mod:`amqpjobs.runtime.canary`); None: no canary.
        canary_timeout: Seconds to wait for the canaries' outcomes.
        job_queues: Job name -> the job queue whose workers handle it (from the app), to
            refuse a ``to`` whose workers would not handle the jobs moved, and, without ``to``,
            to leave in quarantine a job that the app does not serve from the job queue it
            would go back to (:func:`unserved`); None: unknown.
        app: The app's name (from the app), for the words of :func:`unserved`.
        layouts: Job queue -> its current layout (from the app): a job of a shard no longer in
            the topology (``shards`` lowered) goes by the current shard rule
            (:func:`~amqpjobs.topology.orphans.replay_route`); None: unknown, each goes back
            to the queue it failed on.
        idempotent: Job names declared ``idempotent=True`` (from the app): a copy of one whose job
            succeeded since it failed is replayed (acked as a duplicate, its effect not run again),
            where another job's stays (with the app's results store: ``DoneSince`` of
            :mod:`amqpjobs.runtime.replay_checks`).

    """

    rate: float = 50.0
    to: str | None = None
    limit: int | None = None
    selection: Selection = field(default_factory=Selection)
    dry_run: bool = False
    stop_after_failures: int | None = None
    canary: int | None = None
    canary_timeout: float = DEFAULT_CANARY_TIMEOUT
    job_queues: Mapping[str, str] | None = None
    app: str = ""
    layouts: Mapping[str, JobQueueLayout] | None = None
    idempotent: frozenset[str] = frozenset()


@dataclass
class ReplayReport:
    """What a replay did.

    Attributes:
        queue: The quarantine queue.
        replayed: Messages moved back (or, on a dry run, that would move).
        skipped: Messages looked at that did not match, had no known original queue, were
            replayed by this run and came back, or can't be sent (``not_moved``).
        no_origin: Of ``skipped``, those that matched but name no queue to go back to
            (neither evidence nor ``x-death``: published straight into the queue) with no
            ``to`` given; the summary says so and how to move them.
        far_origin: Of ``skipped``, those that matched but whose evidence names a queue over 255
            bytes of UTF-8 (another stack's evidence, or a forged one), which no publish can address
            (the routing key is an AMQP short string), with no ``to`` given; the summary says so and how to move them.
        not_moved: Of ``skipped``, one line for each matching message that can't go, and why: its copy
            can't be sent (``job 'mail' id 'q-1': its copy would be too large: ...``, counted in
            ``too_large``), or its target queue does not exist (``missing``); it stays in quarantine.
        too_large: Of ``not_moved``, those whose copy would be too large to send.
        done_since: Of ``not_moved``, copies whose job succeeded after they failed (read from the app's
            results store): replayed, each would run once more.
        misdirected: Of ``not_moved``, those whose evidence names a queue of ours that holds no jobs
            of a job queue (a pause flag, a scheduler's or breaker's queue: :func:`destination`).
        unserved: Of ``not_moved``, jobs the app (``ReplayOptions.job_queues``) does not serve from the
            job queue they would go back to (:func:`unserved`): its workers would quarantine them again.
        missing: Of ``not_moved``, target queue -> messages for it that stayed because it does not exist
            (found so before the first move to it, or deleted under the run: its publish came back unroutable).
        left: Messages in the quarantine queue at the end.
        returned: Replayed jobs that came back to quarantine during the run.
        stopped_early: True when ``stop_after_failures`` stopped the run.
        limit_reached: The ``limit`` when it stopped the run with messages still to look at; else None.
        elapsed: Seconds from the first to the last move.
        moves: (job id, target queue) of each move done, once its copy is confirmed (on a dry run: each planned move).
        rerouted: Job id -> why it went elsewhere than the queue it failed on (a dropped shard).
        phase: ``canary`` while the canaries move and are waited for, ``rest`` after they
            passed, "" without a canary.
        canary_failures: One line per canary that did not succeed (the run stopped then).
        canary_moved: Canaries actually moved (fewer than K when fewer matched).
        canary_failed: Canaries known to have failed (an event said so, or they came back);
            the others of ``canary_failures`` had no outcome event in time.

    """

    queue: str
    replayed: int = 0
    skipped: int = 0
    no_origin: int = 0
    far_origin: int = 0
    not_moved: list[str] = field(default_factory=list)
    too_large: int = 0
    done_since: int = 0
    misdirected: int = 0
    unserved: int = 0
    missing: dict[str, int] = field(default_factory=dict)
    left: int = 0
    returned: int = 0
    stopped_early: bool = False
    limit_reached: int | None = None
    elapsed: float = 0.0
    moves: list[tuple[str, str]] = field(default_factory=list)
    rerouted: dict[str, str] = field(default_factory=dict)
    phase: str = ""
    canary_failures: list[str] = field(default_factory=list)
    canary_moved: int = 0
    canary_failed: int = 0

    def summary(self, canary: bool) -> str:
        """The line a finished replay reports (``replay`` prints it; the console shows it).

        ``replayed 20, skipped 0, left 0 in work.quarantine (2.1s including the canary wait, 9.1/s)``:
        the rate is moves per second between the first and the last move, left out with fewer than 2 moves.
        """
        waited = " including the canary wait" if canary and self.replayed > self.canary_moved else ""
        # a rate needs two moves and time between them: one move has none ("0.0/s" said nothing)
        rate = f", {(self.replayed - 1) / self.elapsed:.1f}/s" if self.replayed > 1 and self.elapsed > 0 else ""
        return (
            f"replayed {self.replayed}, skipped {self.skipped}, left {self.left} in {printable(self.queue)} "
            f"({self.elapsed:.1f}s{waited}{rate}){self.skip_reason()}"
        )

    @property
    def partial(self) -> bool:
        """True when matching messages stayed in quarantine for a reason to act on (``replay`` exits 1).

        Each is counted in the summary (:meth:`skip_reason`) with its fix: ``not_moved`` (named one by
        one), ``no_origin`` and ``far_origin``. A message this run replayed that came back, or one the
        filters left out, is no such reason.
        """
        return bool(self.not_moved or self.no_origin or self.far_origin)

    def stays(self, line: str) -> None:
        """Count a matching message that can't go as skipped, ``line`` naming it and why; it stays in quarantine."""
        self.not_moved.append(line)
        self.skipped += 1

    def target_missing(self, item: QuarantinedJob, target: str) -> None:
        """Count ``item`` as skipped because its target queue ``target`` does not exist; it stays, named."""
        self.missing[target] = self.missing.get(target, 0) + 1
        self.stays(item.stays(f"its target queue {printable(repr(target))} does not exist (apply the topology: "
                              "amqpjobs topology apply, or replay it with --to QUEUE)"))  # fmt: skip

    def cut_short(self, rate: float, why: object, dry_run: bool = False) -> str:
        """The error of a run at ``rate`` messages/s the broker cut short (``why``): how many moved, what may be twice.

        ``replay from 'work.quarantine' interrupted after 4 moved (the one in flight may be in both
        places: a duplicate, never a loss): NOT_FOUND ...``; every move whose copy was confirmed counts.
        A ``dry_run`` moved nothing, and says so.
        """
        if dry_run:
            return (f"replay --dry-run from {self.queue!r} interrupted after {self.replayed} that would move "
                    f"(nothing moved): {why}")  # fmt: skip
        note = in_flight_note(replay_window(rate))
        return f"replay from {self.queue!r} interrupted after {self.replayed} moved ({note}): {why}"

    def stopped_by_alarm(self, alarm: str, held: int) -> str:
        """The error of a run a resource alarm (``alarm``: ``"memory"``) stopped: :func:`stopped_by_alarm`."""
        return stopped_by_alarm("replay", "replayed", self.queue, self.replayed, self.left, alarm, held)

    def skip_reason(self) -> str:
        """Why messages that matched were skipped, and where ``limit`` stopped the run ("" when neither).

        ``; 1 skipped: no queue to go back to ...``, ``; stopped at --limit 2 (the rest were not looked at)``.
        """
        why = ""
        if self.limit_reached is not None:
            why = f"; stopped at --limit {self.limit_reached} (the rest were not looked at)"
        if self.too_large:
            why += f"; {self.too_large} skipped: too large to send, still in {printable(self.queue)}"
        if self.done_since:
            why += (f"; {self.done_since} skipped: done since they failed (amqpjobs job show names them), still in "
                    f"{printable(self.queue)}")  # fmt: skip
        if self.missing:
            many = len(self.missing) > 1
            names = ", ".join(printable(repr(t)) + (f" ({n})" if many else "") for t, n in sorted(self.missing.items()))
            why += (f"; {sum(self.missing.values())} skipped: target queue{'s' if many else ''} {names} "
                    f"do{'' if many else 'es'} not exist, still in {printable(self.queue)}: apply the topology "
                    "(amqpjobs topology apply) or replay them with amqpjobs replay --to QUEUE")  # fmt: skip
        if self.misdirected:
            why += (f"; {self.misdirected} skipped: the queue their evidence names runs no jobs, still in "
                    f"{printable(self.queue)}: replay them with amqpjobs replay --to QUEUE")  # fmt: skip
        if self.unserved:
            why += (f"; {self.unserved} skipped: the app does not serve them from the job queue they would go back to "
                    f"(each named with its fix), still in {printable(self.queue)}")  # fmt: skip
        if self.far_origin:
            why += (f"; {self.far_origin} skipped: the queue their evidence names is over 255 bytes, which no publish "
                    "can address (another stack's evidence?): replay them with amqpjobs replay --to QUEUE")  # fmt: skip
        if not self.no_origin:
            return why
        return why + (
            f"; {self.no_origin} skipped: no queue to go back to (neither evidence of a worker nor x-death "
            "names one; published straight into the queue?): replay them with amqpjobs replay --to QUEUE"
        )


def unserved(job: str, job_queue: str, options: ReplayOptions) -> str | None:
    """Why job ``job`` can't go back to job queue ``job_queue`` with the app's jobs ``options.job_queues``, or None.

    A worker of the app quarantines a delivery of a job it does not serve from the job queue it
    consumes as ``unknown-job`` (:mod:`amqpjobs.runtime.deliveries`): replayed there, the job would
    only come back. None also when the app is unknown (``job_queues`` None) or ``to`` is given
    (checked before the run: :func:`~amqpjobs.runtime.replay_checks.check_jobs_belong`).
    """
    served = options.job_queues
    if served is None or options.to or served.get(job) == job_queue:
        return None
    app, again = printable(repr(options.app)), "its workers would quarantine it again as unknown-job"
    if job not in served:
        none = "" if served else " (it has no jobs: no @app.job was registered when its module was imported)"
        return (f"app {app} has no job {printable(repr(job))}{none}: {again}; replay it with --app of the app that "
                "runs it, or without --app")  # fmt: skip
    home = printable(repr(served[job]))
    return (f"app {app} serves job {printable(repr(job))} from job queue {home}, not from "
            f"{printable(repr(job_queue))} where its evidence sends it: {again}; replay it with --job "
            f"{printable(shell_quote(job))} --to {printable(shell_quote(served[job]))}")  # fmt: skip


def replay_window(rate: float) -> int:
    """Replays in flight at once (copy published, confirm not back yet) at ``rate`` messages/s.

    A confirm takes 1-3 ms on a local broker, so one move at a time caps a replay near
    400/s. The window holds 20 ms worth of messages, at least 1 (100/s: 2; 500/s: 10). A
    quarantined message is acked only after its copy is confirmed, so a replay killed
    mid-run loses nothing but can leave up to this many jobs both in quarantine and in the
    work queue (duplicates, which replaying an idempotent job tolerates).
    """
    return max(1, math.ceil(rate * 0.02))


def in_flight_note(window: int) -> str:
    """What a move cut short may leave, ``window`` moves being in flight at once (:func:`replay_window`; park: 1).

    The one note of a replay or park the broker interrupts: a copy confirmed whose original's
    ack did not go, or one sent whose confirm never came, is in both places.
    """
    if window == 1:
        return "the one in flight may be in both places: a duplicate, never a loss"
    return f"the {window} at most in flight may be in both places: duplicates, never losses"


def stopped_by_alarm(action: str, done: str, queue: str, moved: int, left: int, alarm: str, held: int) -> str:
    """The error of a mover (``action``: ``replay``, ``park``) a resource alarm stopped, in the operator's words.

    ``replay of 'work.quarantine' stopped: the broker is blocking publishers: resource alarm (memory): 12
    replayed before it, 288 still in work.quarantine (the 1 copy the broker held unread was dropped with
    the connection, so that job stays there; none is in both places); run it again once the alarm clears``.
    ``done`` is the past of ``action`` (``replayed``); ``moved`` the copies confirmed, ``left`` the
    messages counted in ``queue`` at the end, ``held`` the copies held unread, dropped with their
    connection (:func:`amqpjobs.wire.reset.reset`): their jobs stay in ``queue``.
    """
    copies = f"the {held} copies the broker held unread were" if held != 1 else "the 1 copy the broker held unread was"
    jobs = "those jobs stay" if held != 1 else "that job stays"
    return (
        f"{action} of {queue!r} stopped: the broker is blocking publishers: resource alarm ({alarm}): {moved} "
        f"{done} before it, {left} still in {printable(queue)} ({copies} dropped with the connection, so {jobs} "
        "there; none is in both places); run it again once the alarm clears"
    )
