"""``amqpjobs schedule run|list``: cron schedules."""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime

import click

from amqpjobs.cli._common import (
    WholeNumber,
    comma_items,
    declares,
    errors_to_exit_codes,
    long_running_url_options,
    settings,
    verbose,
)
from amqpjobs.cli._filters import time_option
from amqpjobs.cli._root import main, release_held_signals_unless
from amqpjobs.durations import format_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.cron import Schedule, format_tick
from amqpjobs.printable import listed, logfmt_value
from amqpjobs.runtime import held_signals
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.logs import configure_logging
from amqpjobs.runtime.processes import run_scheduler
from amqpjobs.runtime.scheduler import SchedulerOptions


@main.group()
def schedule() -> None:
    """Cron schedules: run a scheduler replica, list the next fire times."""
    release_held_signals_unless("run")


@schedule.command("run")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option(
    "--schedules",
    "-s",
    help="Comma-separated schedule names (default: all of the app's); every replica of an app must run the same set.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@long_running_url_options
@errors_to_exit_codes
@declares
def schedule_run(
    app_ref: str, schedules: str | None, log_json: bool, url: str | None, management_url: str | None
) -> None:
    """Run a scheduler replica for MODULE:APP until SIGTERM/SIGINT (then exit 0).

    Run as many replicas as you like: the broker elects one, which enqueues each tick
    once; when it dies another takes over within seconds.
    """
    names = None if schedules is None else comma_items("--schedules", schedules, "fast,paris-daily")
    configure_logging(logging.DEBUG if verbose() else logging.INFO, json_lines=log_json)
    held_signals.exit_on_signal()  # until the loop's handlers: a signal exits 0 at once (nothing taken yet)
    app = load_app(app_ref)
    if names == ():
        raise ConfigurationError(
            f"--schedules names no schedule: give names separated by commas (the app has "
            f"{listed(s.name for s in app.schedules())}), or leave it out to run them all"
        )
    sys.exit(asyncio.run(run_scheduler(app, settings(url, management_url), SchedulerOptions(schedules=names))))


@schedule.command("list")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--count", type=WholeNumber(1, 100), default=3, show_default=True, help="Fire times per schedule.")
@click.option("--after", help="Count from this ISO-8601 time instead of now (e.g. 2026-03-29T00:00Z).")
@errors_to_exit_codes
def schedule_list(app_ref: str, count: int, after: str | None) -> None:
    """Each schedule of MODULE:APP with its next fire times, in UTC and in the schedule's local time."""
    app = load_app(app_ref, reading=True)
    expected = "give an ISO-8601 time such as 2026-03-29T00:00Z"
    start = datetime.now(UTC) if after is None else time_option("--after", after, expected)
    schedules = app.schedules()
    if not schedules:
        click.echo(f"app {app.name!r} has no schedules")
    for s in schedules:
        for line in _describe(s, start, count):
            click.echo(line)


def _describe(s: Schedule, start: datetime, count: int) -> list[str]:
    """The schedule's line, then its next ``count`` fire times after ``start`` (UTC and local)."""
    lines = [
        f"{logfmt_value(s.name)}  job={logfmt_value(s.job)}  cron={s.rule.expression!r}  tz={s.rule.tz}  "
        f"missed={s.missed}  overlap={s.overlap}  grace={format_duration(s.grace)}"
    ]
    for tick in s.rule.upcoming(start, count):
        local = tick.astimezone(s.rule.zone)
        offset = local.isoformat()[-6:]
        lines.append(f"  {format_tick(tick)}  {local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({offset})")
    return lines
