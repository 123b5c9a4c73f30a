"""``amqpjobs quarantine park``: move known failures out of quarantine, so ``status`` is healthy again."""

from __future__ import annotations

import sys

import click

from amqpjobs.cli._census import confirm_take, echo_no_match
from amqpjobs.cli._common import (
    EXIT_FOUND,
    app_results,
    app_results_option,
    closing_store,
    errors_to_exit_codes,
    queue_name_arg,
    settings,
    url_options,
)
from amqpjobs.cli._filters import filter_options, selection
from amqpjobs.cli._signals import run_until_signal, signals_held
from amqpjobs.cli.next_steps import command
from amqpjobs.cli.quarantine import quarantine
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.printable import printable
from amqpjobs.runtime.parking import TakeReport, park


@quarantine.command("park")
@click.argument("queue", callback=queue_name_arg)
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask.")
@app_results_option
@url_options
@errors_to_exit_codes
def quarantine_park(
    queue: str, job: str | None, error_type: str | None, reason: str | None, since: str | None, yes: bool,
    app_ref: str | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Move QUEUE's messages that match the filters to the job queue's parked queue (<job queue>.parked).

    Each is published to the parked queue with a publisher confirm, then acked: it keeps
    every header (its evidence) and property. Parked jobs are counted by `amqpjobs status`
    but do not make it unhealthy; `quarantine list/show/replay/purge` take the parked queue.
    Exit 4 (nothing moved) while another process moves QUEUE's messages (e.g. a replay).
    """
    broker = settings(url, management_url)
    store = app_results(app_ref)
    chosen = selection(job, error_type, reason, since)
    if not yes:
        confirm_take("Park", queue, chosen, broker.safe_url, "park")
    census, report = Census(), TakeReport(queue)
    stopped = run_until_signal(closing_store(park(broker, queue, chosen, census, report=report, results=store), store))
    with signals_held():
        if stopped is not None:  # the move under way was cut short, the held messages are back
            click.echo(
                f"interrupted: parked {report.taken} in {printable(report.target or '?')}, left {report.left} in "
                f"{printable(report.queue)}", err=True,
            )  # fmt: skip
            sys.exit(stopped)
        _park_end(report, census, chosen)


def _park_end(report: TakeReport, census: Census, chosen: Selection) -> None:
    """What a park that ran to its end prints, and its exit code (1: some could not be parked, named)."""
    click.echo(
        f"parked {report.taken} message(s) from {printable(report.queue)} in {printable(report.target)}; "
        f"{report.left} left in {printable(report.queue)}"
    )
    if report.left:
        click.echo(f"next: {command('quarantine', 'list', report.queue)} (what is still quarantined)")
    else:
        click.echo(f"next: {command('status')} (parked jobs do not make it unhealthy; they wait in "
                   f"{printable(report.target)})")  # fmt: skip
    echo_no_match(census, chosen)
    for line in report.not_moved:
        click.echo(f"not parked {line}; it stays in {printable(report.queue)}", err=True)
    if report.not_moved:
        sys.exit(EXIT_FOUND)
