"""What the quarantine commands print about the messages they look at: counts, no-match hints, progress, interrupts."""

from __future__ import annotations

import sys

import click

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import ReplayReport, replay_window
from amqpjobs.printable import printable


def echo_no_match(census: Census, chosen: Selection) -> None:
    """When the filters matched none of the messages looked at, print (stderr) what is there, with counts."""
    for line in census.no_match_lines(chosen):
        click.echo(line, err=True)


def stdin_is_terminal() -> bool:
    """Whether someone can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def confirm_take(verb: str, queue: str, chosen: Selection, safe_url: str, action: str) -> None:
    """Ask before a park or purge (``action``) takes messages: ``Park the matching messages in quarantine 'x' on ...?``.

    Raises:
        click.Abort: the operator said no.
        ConfigurationError: stdin is not a terminal (a script, cron, a pipe): nobody can answer,
            so ``--yes`` must say it (exit 2, nothing taken).

    """
    if not stdin_is_terminal():
        raise ConfigurationError(
            f"refusing to {action} without --yes when stdin is not a terminal (add --yes to a script's command)"
        )
    what = "every message" if chosen == Selection() else "the matching messages"
    click.confirm(f"{verb} {what} in quarantine {printable(repr(queue))} on {safe_url}?", abort=True)


def shown_line(shown: int, census: Census, limit: int, chosen: Selection) -> str:
    """``3 of 8 message(s) in work.quarantine shown``, with the filter and ``--limit`` figures when they apply."""
    line = f"{shown} of {census.depth} message(s) in {printable(census.queue)} shown"
    if chosen != Selection():
        line += f" ({census.matched} of the {census.looked_at} looked at match the filters)"
    if shown >= limit and census.looked_at < census.depth:
        line += f"; --limit {limit} reached: raise it to see more"
    return line


def interrupted_lines(report: ReplayReport, rate: float, dry_run: bool) -> list[str]:
    """What a replay stopped by Ctrl-C did: moved, skipped, left, and the jobs that may now be in two places."""
    if dry_run:
        return [f"interrupted dry run: {report.replayed} would have moved, {report.skipped} skipped, nothing moved"]
    window = replay_window(rate)
    return [
        f"interrupted: moved {report.replayed}, skipped {report.skipped}, left {report.left} in "
        f"{printable(report.queue)}{report.skip_reason()}",
        f"up to {window} job(s) in flight at the interrupt (the --rate {rate:g} window) may now be in both "
        f"{printable(report.queue)} and in their work queue: duplicates, which an idempotent job tolerates",
    ]


def progress_line(report: ReplayReport, canary: int | None) -> str:
    """The live progress line of a replay (stderr on a terminal), naming the phase of a ``--canary`` run.

    ``canary: replayed 2 of 2, waiting for their outcomes``, then ``rest: replayed 40 (50/s)``;
    ``replayed 40 (50/s)`` without a canary. The rate is moves per second since the first.
    """
    if report.phase == "canary" and canary is not None:
        line = f"canary: replayed {report.replayed} of {canary}"
        return line + (", waiting for their outcomes" if report.replayed >= canary else "")
    line = f"replayed {report.replayed} ({report.replayed / max(report.elapsed, 1e-9):.0f}/s)"
    return f"{report.phase}: {line}" if report.phase else line
