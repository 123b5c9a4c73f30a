"""``replay --canary K`` and ``--rate``: options, ceilings (the console's too) and what they print."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqpjobs.cli._common import WholeNumber, duration_option
from amqpjobs.cli.next_steps import command, filter_args
from amqpjobs.durations import format_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import (
    DEFAULT_CANARY_TIMEOUT,
    MAX_CANARY,
    MAX_CANARY_TIMEOUT,
    ReplayReport,
    check_rate,
)
from amqpjobs.printable import printable

F = TypeVar("F", bound=Callable[..., Any])


def canary_options(func: F) -> F:
    """Add ``--canary`` and ``--canary-timeout`` to a command."""
    func = click.option(
        "--canary-timeout", default=f"{DEFAULT_CANARY_TIMEOUT:g}s", show_default=True,
        help="How long to wait for the canaries' outcomes (a duration: '60s', '2m').",
    )(func)  # fmt: skip
    func = click.option(
        "--canary", type=WholeNumber(1, MAX_CANARY),
        help="Move K jobs first and go on only if all K succeed (their outcome events); else stop, exit 1.",
    )(func)  # fmt: skip
    return func


def canary_timeout(value: str) -> float:
    """Seconds of ``--canary-timeout``.

    Raises:
        ConfigurationError: not a positive duration, or above
            :data:`~amqpjobs.jobs.replay_plan.MAX_CANARY_TIMEOUT` (the console's ceiling too).

    """
    seconds = duration_option("--canary-timeout", value)
    if seconds <= 0:
        raise ConfigurationError(f"--canary-timeout must be above 0 (got {value!r})")
    if seconds > MAX_CANARY_TIMEOUT:
        most = format_duration(MAX_CANARY_TIMEOUT)
        raise ConfigurationError(f"--canary-timeout must be at most {most} (got {value!r})")
    return seconds


def replay_rate(rate: float) -> float:
    """``--rate`` of replay, park and unpark, checked (per second): :func:`~amqpjobs.jobs.replay_plan.check_rate`.

    Raises:
        ConfigurationError: NaN, infinite, below :data:`~amqpjobs.jobs.replay_plan.MIN_REPLAY_RATE` or above
            :data:`~amqpjobs.jobs.replay_plan.MAX_REPLAY_RATE` (the console's bounds too).

    """
    return check_rate(rate)


def check_canary_options(ctx: click.Context, canary: int | None) -> None:
    """Refuse ``--canary-timeout`` given without ``--canary`` (it would be silently ignored).

    Raises:
        ConfigurationError: it was.

    """
    if canary is None and ctx.get_parameter_source("canary_timeout") is not click.core.ParameterSource.DEFAULT:
        raise ConfigurationError("--canary-timeout needs --canary (how many jobs to move first, e.g. --canary 2)")


def phase_reporter(canary: int | None, timeout: float, limit: int | None = None) -> Callable[[ReplayReport], None]:
    """A progress hook printing each phase change of a canary replay once (to stdout).

    The start line comes once the replay checked and subscribed (phase ``canary``), so a
    replay that cannot run a canary says nothing about moving; it names the number that
    can move (``--canary 50`` of 20 queued: "up to 20"; with ``--limit 1``: 1).
    """
    shown = {""}

    def on_progress(report: ReplayReport) -> None:
        if report.phase in shown or canary is None:
            return
        shown.add(report.phase)
        if report.phase == "canary":
            click.echo(start_line(canary if limit is None else min(canary, limit), report.left, timeout))
        if report.phase == "rest":
            moved = report.canary_moved
            click.echo(f"canary passed: {moved} of {moved} succeeded; replaying the rest")

    return on_progress


def start_line(canary: int, queued: int, timeout: float) -> str:
    """What a canary replay says before its first move (``queued``: messages in the quarantine queue)."""
    count = f"{canary}" if canary <= queued else f"up to {queued}"
    return f"canary: moving {count} job(s) first, then waiting up to {format_duration(timeout)} for their outcomes"


def failure_lines(report: ReplayReport, chosen: Selection) -> list[str]:
    """What a stopped canary replay prints (to stderr): which canaries failed or are unknown, why, what next.

    Parking is suggested only when a canary is known to have failed: a canary without an
    outcome event may well have succeeded.
    """
    lines = [
        f"canary failed: {len(report.canary_failures)} of {report.canary_moved} did not succeed; the rest stay in "
        f"{printable(report.queue)}:",
        *(f"  {line}" for line in report.canary_failures),
    ]
    if report.canary_failed:
        park = command("quarantine", "park", report.queue, *filter_args(chosen))
        lines.append(f"fix the cause and replay again, or park the failing jobs: {park}")
    else:
        lines.append(
            "none is known to have failed: check the workers (running? consuming? their job queue paused? their "
            "event metrics), "
            f"then replay again: {command('replay', report.queue, *filter_args(chosen), '--canary', '1')}"
        )
    return lines
