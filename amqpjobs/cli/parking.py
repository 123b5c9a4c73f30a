"""``amqpjobs quarantine park`` and ``unpark``: known failures out of quarantine (``status`` healthy), and back."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqpjobs.cli._census import confirm_take, echo_no_match
from amqpjobs.cli._common import (
    EXIT_FOUND,
    WholeNumber,
    app_results,
    app_results_option,
    closing_store,
    errors_to_exit_codes,
    queue_name_arg,
    settings,
    url_options,
)
from amqpjobs.cli._filters import filter_options, move_rate, rate_option, selection
from amqpjobs.cli._signals import run_until_signal, signals_held
from amqpjobs.cli.next_steps import command
from amqpjobs.cli.quarantine import quarantine
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.holding_moves import DONE, MoveOptions
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.printable import printable
from amqpjobs.runtime.parking import TakeReport, park, unpark

F = TypeVar("F", bound=Callable[..., Any])


def move_options(func: F) -> F:
    """The options park and unpark share: the filters, ``--limit``, ``--rate``, ``--dry-run``, ``--yes``, ``--app``."""
    for option in (
        url_options,
        app_results_option,
        click.option("--yes", is_flag=True, help="Do not ask."),
        click.option("--dry-run", is_flag=True, help="Take the lock and check each copy; move nothing."),
        rate_option,
        click.option("--limit", type=WholeNumber(1), help="Move at most this many."),
        filter_options,
    ):
        func = option(func)
    return func


def _options(
    job: str | None, error_type: str | None, reason: str | None, since: str | None, limit: int | None,
    rate: float | None, dry_run: bool,
) -> MoveOptions:  # fmt: skip
    chosen = selection(job, error_type, reason, since)
    return MoveOptions(chosen, limit, move_rate(rate), dry_run)


@quarantine.command("park")
@click.argument("queue", callback=queue_name_arg)
@move_options
@errors_to_exit_codes
def quarantine_park(
    queue: str, job: str | None, error_type: str | None, reason: str | None, since: str | None, limit: int | None,
    rate: float | None, dry_run: bool, yes: bool, app_ref: str | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Move QUEUE's messages that match the filters to the job queue's parked queue (<job queue>.parked).

    Each is published to the parked queue with a publisher confirm, then acked: it keeps
    every header (its evidence) and property. Parked jobs are counted by `amqpjobs status`
    but do not make it unhealthy; `quarantine list/show/replay/purge/unpark` take the parked
    queue. Exit 4 (nothing moved) while another process moves QUEUE's or the parked queue's
    messages (e.g. a replay).
    """
    broker = settings(url, management_url)
    store = app_results(app_ref)
    options = _options(job, error_type, reason, since, limit, rate, dry_run)
    if not yes and not dry_run:
        confirm_take("Park", queue, options.selection, broker.safe_url, "park")
    census, report = Census(), TakeReport(queue)
    run = park(broker, queue, census=census, report=report, results=store, options=options)
    _end("park", run_until_signal(closing_store(run, store)), report, census, options.selection)


@quarantine.command("unpark")
@click.argument("queue", callback=queue_name_arg)
@move_options
@errors_to_exit_codes
def quarantine_unpark(
    queue: str, job: str | None, error_type: str | None, reason: str | None, since: str | None, limit: int | None,
    rate: float | None, dry_run: bool, yes: bool, app_ref: str | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Move QUEUE's parked jobs that match the filters back to the job queue's quarantine queue, running none.

    QUEUE is a parked queue (<job queue>.parked) or its job queue. The way back from a park
    that took the wrong jobs: each is published to the quarantine queue with a publisher
    confirm, then acked, in order, keeping every header (its evidence) and property but
    amqpjobs-parked-at. Exit 4 (nothing moved) while another process moves the parked or the
    quarantine queue's messages (e.g. a replay).
    """
    broker = settings(url, management_url)
    store = app_results(app_ref)
    options = _options(job, error_type, reason, since, limit, rate, dry_run)
    if not yes and not dry_run:
        confirm_take("Unpark", queue, options.selection, broker.safe_url, "unpark")
    census, report = Census(), TakeReport(queue)
    run = unpark(broker, queue, options, census, report=report, results=store)
    _end("unpark", run_until_signal(closing_store(run, store)), report, census, options.selection)


def _end(action: str, stopped: int | None, report: TakeReport, census: Census, chosen: Selection) -> None:
    """What a park or unpark prints, and its exit code (1: some could not be moved, named; 130/143: a signal)."""
    done = DONE[action]
    with signals_held():
        if stopped is not None:  # the move under way was cut short, the held messages are back
            click.echo(
                f"interrupted: {done} {report.taken} in {printable(report.target or '?')}, left {report.left} in "
                f"{printable(report.queue)}", err=True,
            )  # fmt: skip
            click.echo(
                f"the one job in flight at the interrupt may now be in both {printable(report.queue)} and "
                f"{printable(report.target or '?')} (its copy sent, its original back): a duplicate, never a loss",
                err=True,
            )  # as a replay's window (README "Quarantine")
            sys.exit(stopped)
        limited = f"; stopped at --limit {report.limit_reached} (the rest were not looked at)"
        limited = limited if report.limit_reached is not None else ""
        if report.dry_run:
            for job_id in report.job_ids:
                click.echo(f"would {action} {printable(job_id)} -> {printable(report.target)}")
            click.echo(f"dry run: {report.taken} would be {done} from {printable(report.queue)} to "
                       f"{printable(report.target)}, nothing moved{limited}")  # fmt: skip
        else:
            click.echo(report.summary(action))
            _next(action, report)
        echo_no_match(census, chosen)
        for line in report.not_moved:
            click.echo(f"{'would not' if report.dry_run else 'not'} {done} {line}; it stays in "
                       f"{printable(report.queue)}", err=True)  # fmt: skip
        if report.not_moved:
            sys.exit(EXIT_FOUND)


def _next(action: str, report: TakeReport) -> None:
    """The next command a park or unpark names."""
    if action == "unpark":
        click.echo(f"next: {command('quarantine', 'list', report.target)} (the unparked jobs, back in quarantine)")
    elif report.left:
        click.echo(f"next: {command('quarantine', 'list', report.queue)} (what is still quarantined)")
    else:
        click.echo(f"next: {command('status')} (parked jobs do not make it unhealthy; they wait in "
                   f"{printable(report.target)})")  # fmt: skip
