"""``amqpjobs quarantine park``: move known failures out of quarantine, so ``status`` is healthy again."""

from __future__ import annotations

import asyncio

import click

from amqpjobs.cli._census import confirm_take, echo_no_match
from amqpjobs.cli._common import (
    app_results,
    app_results_option,
    closing_store,
    errors_to_exit_codes,
    filter_options,
    selection,
    settings,
    url_options,
)
from amqpjobs.cli.quarantine import quarantine
from amqpjobs.jobs.census import Census
from amqpjobs.printable import printable
from amqpjobs.runtime.parking import park


@quarantine.command("park")
@click.argument("queue")
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
        confirm_take("Park", queue, chosen, broker.safe_url)
    census = Census()
    report = asyncio.run(closing_store(park(broker, queue, chosen, census, store), store))
    click.echo(
        f"parked {report.taken} message(s) from {printable(report.queue)} in {printable(report.target)}; "
        f"{report.left} left in {printable(report.queue)}"
    )
    if report.left:
        click.echo(f"next: amqpjobs quarantine list {printable(report.queue)} (what is still quarantined)")
    else:
        click.echo(f"next: amqpjobs status (parked jobs do not make it unhealthy; they wait in {report.target})")
    echo_no_match(census, chosen)
