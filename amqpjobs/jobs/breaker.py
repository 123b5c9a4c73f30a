"""A job's circuit breaker: its settings, which outcomes count, and its state machine (pure, no I/O).

``@app.job(..., breaker=Breaker(failures=20, window="1m", cool_down="30s"))``: after
``failures`` transient failures of the job within ``window``, workers start none of its
deliveries for ``cool_down`` (open); then one delivery runs as the probe across the app
(half-open): its success closes the breaker, its transient failure opens it again for
another cool-down (README "Flow control" → "Circuit breaker"; the pattern: M. Nygard,
*Release It!*, "Circuit Breaker").

What counts (:func:`counts_as_failure`): a delivery whose handler failed transiently, i.e.
it raised (other than a permanent exception class or ``Reject``), raised ``Retry``, or hit
its timeout, whether the job then goes to a delay tier or to quarantine as ``exhausted`` /
``timeout`` (one outcome per delivery: the runs of ``immediate_retries`` count once). Not
counted: invalid or undecodable payloads, unknown jobs, stored payloads that can't be had,
duplicates, waits (a claim, the ledger, an open breaker), hand-backs, crashes (a start
without an outcome), permanent failures and rejections: they say nothing about the health
of what the job depends on. A decision kept past a worker's stop counts once, when the next
worker carries it out (its run's worker counted nothing), if its run failed within the window.

The times here are wall-clock seconds (``time.time()``): every worker of the app counts
the same failure notices, stamped by the worker that saw the failure.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from amqpjobs.durations import DurationTooLongError, parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.outcome import Outcome, Quarantine, RetryLater
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.topology.naming import breaker_probe_name, breaker_queue_name, own_queue_problem

State = Literal["closed", "open", "half-open"]
#: The ``amqpjobs_breaker_state`` gauge's value of each state.
STATE_VALUES: dict[State, int] = {"closed": 0, "open": 1, "half-open": 2}
#: What a worker does with a delivery of a job with a breaker: start it, let it wait, or probe.
Verdict = Literal["start", "wait", "probe"]
#: The most failures a breaker may count to (``Breaker(failures=...)``).
MAX_FAILURES = 1_000_000
#: The shortest ``window`` and ``cool_down`` (seconds): failure notices travel through the
#: broker, and a worker tries the probe lock at most once a second.
MIN_SECONDS = 1.0
#: The longest ``window`` and ``cool_down`` (seconds): a day.
MAX_SECONDS = 86_400.0


@dataclass(frozen=True, init=False)
class Breaker:
    """A job's circuit breaker settings.

    Args:
        failures: Transient failures (:func:`counts_as_failure`) within ``window`` that open it (>= 1).
        window: Seconds, or a duration string such as ``"1m"``, the failures are counted over.
        cool_down: Seconds (or a duration string) it stays open before one probe may run.

    The defaults: 20 failures within 60 s open it for 30 s. Bounds: ``failures`` at most
    :data:`MAX_FAILURES`, ``window`` and ``cool_down`` from :data:`MIN_SECONDS` (1 s: failure
    notices travel through the broker, and a worker tries the probe lock once a second) to
    :data:`MAX_SECONDS` (a day): a breaker meant to stay open longer is an operator's pause
    (``amqpjobs pause``).

    Raises:
        ConfigurationError: a value is not a whole number in 1..MAX_FAILURES (``failures``)
            or a duration from 1 s to a day (``window``, ``cool_down``; 0 and negative
            numbers too); the message names the field, the bound and an example.
    """

    failures: int
    window: float
    cool_down: float

    def __init__(self, failures: int = 20, window: float | str = "1m", cool_down: float | str = "30s") -> None:
        if isinstance(failures, bool) or not isinstance(failures, int) or not 1 <= failures <= MAX_FAILURES:
            raise ConfigurationError(
                f"Breaker(failures={failures!r}): failures must be a whole number from 1 to {MAX_FAILURES:,} (the "
                "transient failures within window that open the breaker), e.g. Breaker(failures=20)"
            )
        object.__setattr__(self, "failures", failures)
        for name, value in (("window", window), ("cool_down", cool_down)):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(
                    f"Breaker({name}={value!r}): {name} must be a duration from {MIN_SECONDS:g}s to a day, e.g. "
                    f"{name}='30s'"
                )
            try:  # a number below the minimum (0, negative), "0s" or "-1s" gets the bound's message below
                if isinstance(value, int | float) and not isinstance(value, bool) and value < MIN_SECONDS:
                    seconds = float(value)
                elif isinstance(value, str) and value.strip().startswith("-"):
                    seconds = -1.0
                else:  # its message says what a duration looks like
                    seconds = parse_duration(value, allow_zero=isinstance(value, str))
            except DurationTooLongError:
                seconds = math.inf  # the bound's message below says what is allowed here
            except ValueError as exc:
                raise ConfigurationError(f"Breaker({name}={value!r}): {exc}") from None
            if seconds < MIN_SECONDS:
                raise ConfigurationError(
                    f"Breaker({name}={value!r}): {name} must be at least {MIN_SECONDS:g}s (failure notices travel "
                    f"through the broker and a worker tries the probe lock once a second), e.g. {name}='30s'"
                )
            if seconds > MAX_SECONDS:
                raise ConfigurationError(
                    f"Breaker({name}={value!r}): {name} must be at most a day ({MAX_SECONDS:g}s), e.g. {name}='30s'; "
                    "to stop a job's starts for longer, pause its job queue (amqpjobs pause)"
                )
            object.__setattr__(self, name, seconds)


def breaker_name_problem(job_queue: str, job: str, breaker: object) -> str | None:
    """Why job ``job`` of ``job_queue`` can't have ``breaker``, or None when it can.

    ``breaker`` must be a :class:`Breaker`, and the queues that carry its state
    (:func:`~amqpjobs.topology.naming.breaker_queue_name`, ``breaker_probe_name``) must be
    names the broker and the AMQP client take.
    """
    if not isinstance(breaker, Breaker):
        return f"job {job!r}: breaker must be a Breaker, e.g. Breaker(failures=20, window='1m', cool_down='30s')"
    if found := own_queue_problem((breaker_queue_name(job_queue, job), breaker_probe_name(job_queue, job))):
        return f"job {job!r}: its breaker's state queue can't be named: {found[1]}; shorten or rename the job"
    return None


def breaker_open(job: str) -> tuple[str, str, str]:
    """The failure a delivery that waits for ``job``'s open breaker is recorded with (class, message, traceback)."""
    return ("BreakerOpen", f"job {job}'s circuit breaker is open", "")


def counts_as_failure(outcome: Outcome, now: float | None = None, window: float | None = None) -> bool:
    """Whether ``outcome`` is a transient failure of its handler (see the module docstring).

    A decision an earlier run kept past its worker's stop (:attr:`Outcome.decided`: that worker's
    run never settled, so it counted nothing) counts as that run's failure, once, when carried
    out; with ``now`` and ``window`` (wall seconds), only when the run's failure time
    (:attr:`Outcome.reached_at`, from its copy's evidence) is within ``window`` before ``now``:
    an older one would have left the window already, and one without a time can't be placed in it.
    """
    if not (outcome.ran or outcome.decided):
        return False
    d = outcome.decision
    if isinstance(d, RetryLater):
        failed = not d.wait
    else:
        failed = isinstance(d, Quarantine) and d.reason in ("exhausted", "timeout")
    if failed and outcome.decided and now is not None and window is not None:
        at = parse_time(outcome.reached_at) if outcome.reached_at else None
        return at is not None and now - window < at.timestamp() <= now + window
    return failed


@dataclass
class Transition:
    """A change of state, to log and to share: ``state`` from ``at`` (wall seconds) until ``until``."""

    state: State
    at: float
    until: float = 0.0
    failures: int = 0


@dataclass
class BreakerMachine:
    """One job's breaker state in one worker (pure: every time is passed in, wall seconds).

    ``closed``: failures are counted; ``failures`` of them within ``window`` open it.
    ``open``: nothing starts until ``until``; then the first :meth:`verdict` half-opens it.
    ``half-open``: one probe may run (which worker: decided by the caller, across the app);
    :meth:`closed` and :meth:`reopened` end it. Failures seen while not closed are not
    counted (runs started before it opened).
    """

    breaker: Breaker
    state: State = "closed"
    opened_at: float = 0.0
    until: float = 0.0
    seen: deque[float] = field(default_factory=deque)

    def failure(self, at: float) -> Transition | None:
        """Count a failure stamped ``at``; the opening when it is the one that opens the breaker."""
        if self.state != "closed":
            return None
        self.seen.append(at)
        latest = max(self.seen)
        while self.seen and self.seen[0] <= latest - self.breaker.window:
            self.seen.popleft()
        if len(self.seen) < self.breaker.failures:
            return None
        count = len(self.seen)
        return self.opened(latest, latest + self.breaker.cool_down, count)

    def would_open(self, pending: Iterable[float]) -> bool:
        """Whether counting the failures stamped ``pending`` (wall seconds) too would open it (closed only).

        ``pending``: failures this worker sent notices of that it has not heard back yet.
        """
        stamps = [*self.seen, *pending]
        if self.state != "closed" or not stamps:
            return False
        latest = max(stamps)
        return sum(1 for at in stamps if at > latest - self.breaker.window) >= self.breaker.failures

    def opened(self, at: float, until: float, failures: int = 0) -> Transition | None:
        """Open it from ``at`` until ``until`` (counted here, told by another worker, or read at start).

        None when it is already open at least that long (nothing changes).
        """
        if self.state == "open" and until <= self.until:
            return None
        self.state, self.opened_at, self.until = "open", at, until
        self.seen.clear()
        return Transition("open", at, until, failures)

    def verdict(self, now: float) -> tuple[Verdict, Transition | None]:
        """What to do with a delivery at ``now``, and the half-opening when this call makes it."""
        if self.state == "closed":
            return "start", None
        if self.state == "open":
            if now < self.until:
                return "wait", None
            self.state = "half-open"
            return "probe", Transition("half-open", now)
        return "probe", None

    def closed(self, at: float) -> Transition | None:
        """Close it (a probe succeeded here or elsewhere); None when it already was."""
        if self.state == "closed":
            return None
        self.state, self.opened_at, self.until = "closed", 0.0, 0.0
        self.seen.clear()
        return Transition("closed", at)

    def reopened(self, at: float) -> Transition | None:
        """A probe failed at ``at``: open for another cool-down."""
        return self.opened(at, at + self.breaker.cool_down)

    def trusted(self, opened_at: float, until: float, now: float) -> tuple[float, float]:
        """``(opened_at, until)`` of an opening another worker wrote (a record, a notice), made believable at ``now``.

        Its clock may run ahead of ours: ``until`` is cut to at most ``now + cool_down``
        (no worker waits longer than one cool-down from now), an ``opened_at`` in the
        future to ``now``; a value that is no finite number counts as ``now`` (opened now,
        for one cool-down). The caller logs a correction (the result differs).
        """
        latest = now + self.breaker.cool_down
        opened_at = opened_at if math.isfinite(opened_at) else now
        until = until if math.isfinite(until) else latest
        return min(opened_at, now), min(until, latest)

    def waiting_tier(self, now: float, tiers: tuple[float, ...]) -> int:
        """The tier a delivery told to wait at ``now`` waits in: the longest whose delay is at most the cool-down left.

        So a delivery waits a few times per cool-down, not once per first-tier delay, and
        none comes back later than the cool-down's end plus the first tier's delay (the
        probe's start). The first tier when none fits (half-open: the probe runs elsewhere;
        less than a first tier left). ``tiers``: seconds, increasing, at least one.
        """
        left = self.until - now if self.state == "open" else 0.0
        return max((i for i, delay in enumerate(tiers) if delay <= left), default=0)


NoticeKind = Literal["failure", "open", "closed"]


@dataclass(frozen=True)
class Notice:
    """What a worker tells every worker of the app about a job's breaker (JSON on the wire).

    Attributes:
        kind: ``failure`` (a counted failure), ``open`` (a probe failed: open until
            ``until``) or ``closed`` (a probe succeeded).
        job: The job's name.
        at: Wall-clock seconds when it happened.
        until: For ``open``: wall-clock seconds the cool-down ends.
        origin: Who sent it (``host:pid:worker``).
    """

    kind: NoticeKind
    job: str
    at: float
    until: float = 0.0
    origin: str = ""

    def encode(self) -> bytes:
        """The notice as a JSON body."""
        return json.dumps(
            {"kind": self.kind, "job": self.job, "at": self.at, "until": self.until, "origin": self.origin}
        ).encode()

    @classmethod
    def decode(cls, body: bytes) -> Notice | None:
        """Read a notice; None when ``body`` is not one (it is then ignored)."""
        try:
            data: Any = json.loads(body)
            kind = data["kind"]
            if kind not in ("failure", "open", "closed"):
                return None
            at, until = float(data["at"]), float(data.get("until", 0.0))
            if not (math.isfinite(at) and math.isfinite(until)):
                return None
            return cls(kind, str(data["job"]), at, until, str(data.get("origin", "")))
        except (ValueError, KeyError, TypeError):
            return None
