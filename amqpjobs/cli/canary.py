"""``replay --canary K``: its options and what it prints (the run is :mod:`amqpjobs.runtime.canary`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqpjobs.cli.next_steps import command, filter_args
from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.quarantine import ReplayReport, Selection

F = TypeVar("F", bound=Callable[..., Any])


def canary_options(func: F) -> F:
    """Add ``--canary`` and ``--canary-timeout`` to a command."""
    func = click.option(
        "--canary-timeout", default="60s", show_default=True,
        help="How long to wait for the canaries' outcomes (a duration: '60s', '2m').",
    )(func)  # fmt: skip
    func = click.option(
        "--canary", type=click.IntRange(1),
        help="Move K jobs first and go on only if all K succeed (their outcome events); else stop, exit 1.",
    )(func)  # fmt: skip
    return func


def canary_timeout(value: str) -> float:
    """Seconds of ``--canary-timeout``.

    Raises:
        ConfigurationError: not a positive duration.

    """
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigurationError(f"--canary-timeout: {exc}") from None
    if seconds <= 0:
        raise ConfigurationError(f"--canary-timeout must be above 0 (got {value!r})")
    return seconds


def phase_reporter(canary: int | None) -> Callable[[ReplayReport], None]:
    """A progress hook printing each phase change of a canary replay once (to stdout)."""
    shown = {""}

    def on_progress(report: ReplayReport) -> None:
        if report.phase in shown:
            return
        shown.add(report.phase)
        if report.phase == "rest":
            click.echo(f"canary passed: {canary} of {canary} succeeded; replaying the rest")

    return on_progress


def start_line(canary: int, timeout: float) -> str:
    """What a canary replay says before it starts."""
    return f"canary: moving {canary} job(s) first, then waiting up to {format_duration(timeout)} for their outcomes"


def failure_lines(report: ReplayReport, canary: int, chosen: Selection) -> list[str]:
    """What a stopped canary replay prints (to stderr): which canaries failed, why, and what to run next."""
    park = command("quarantine", "park", report.queue, *filter_args(chosen))
    return [
        f"canary failed: {len(report.canary_failures)} of {canary} did not succeed; the rest stay in {report.queue}:",
        *(f"  {line}" for line in report.canary_failures),
        f"fix the cause and replay again, or park the failing jobs: {park}",
    ]
