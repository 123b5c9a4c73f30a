"""``amqpjobs job show``: a job's state, attempts, history and where its message is now."""

from __future__ import annotations

import sys
from dataclasses import asdict

import click

from amqpjobs.cli._common import EXIT_BROKER, errors_to_exit_codes, settings, url_options
from amqpjobs.cli._root import main
from amqpjobs.cli._running import run_command
from amqpjobs.errors import BrokerError, BrokerUnavailableError
from amqpjobs.jobs.envelope import BLANK_AT_LOOKUP, job_id_problem
from amqpjobs.jobs.results import JobStatus
from amqpjobs.printable import json_text, printable
from amqpjobs.runtime.loading import load_app_reading_results
from amqpjobs.runtime.whereabouts import NO_TRACE, where_now


@main.group()
def job() -> None:
    """Jobs by id, from the app's results store (App(results=...))."""


def _job_id_arg(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback: the job-id rule of ``enqueue`` (:func:`amqpjobs.jobs.envelope.job_id_problem`), exit 2."""
    if problem := job_id_problem(value, blank=BLANK_AT_LOOKUP):
        raise click.BadParameter(problem)
    return value


@job.command("show")
@click.argument("job_id", callback=_job_id_arg)
@click.option("--app", "app_ref", required=True, metavar="MODULE:APP", help="The app whose results store to read.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_options
@errors_to_exit_codes
def job_show(job_id: str, app_ref: str, as_json: bool, url: str | None, management_url: str | None) -> None:
    """JOB_ID's state, attempts and history, and where its message is now (quarantine and parked are browsed).

    Exit 1 when the job is found nowhere (no record, and in no quarantine or parked queue), 2 when
    the app has no results store, 3 when the store or the broker can't be had (the
    broker: after the store's record, with ``now: not known: ...``; JSON: ``where`` null, ``where_unknown``).
    """
    app = load_app_reading_results(app_ref)  # a results file that is not there: exit 2 naming it
    broker = settings(url, management_url)

    async def run() -> tuple[JobStatus, str | None, str]:
        try:
            status = await app.job_status(job_id)
            try:
                return status, await where_now(broker, app, status), ""
            except BrokerUnavailableError as exc:  # the record still answers (an outage is when it is read)
                return status, None, str(exc)  # the wire's words: unreachable, or refused (credentials, vhost)
            except BrokerError as exc:
                return status, None, f"browsing its queues failed ({exc})"
        finally:
            await app.close()

    status, where, unknown = run_command(run())
    if as_json:
        doc = {"job_id": status.job_id, "state": status.state, "note": status.note, "where": where,
               "history": [asdict(r) for r in status.history]}  # fmt: skip
        if unknown:
            doc["where_unknown"] = unknown
        click.echo(json_text(doc))
    else:
        for line in status.report():
            click.echo(printable(line))
        said = f"not known: {unknown}; the state above is the results store's record" if unknown else where
        click.echo(f"now: {printable(said or '')}")
    if unknown:
        sys.exit(EXIT_BROKER)
    if where is not None and where.startswith(NO_TRACE):
        sys.exit(1)
