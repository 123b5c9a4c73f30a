"""``amqpjobs consume`` and ``amqpjobs asyncapi``: run a worker, describe the app."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import click
from click.core import ParameterSource

from amqpjobs.cli._common import (
    WholeNumber,
    comma_items,
    declares,
    duration_option,
    errors_to_exit_codes,
    long_running_url_options,
    settings,
    verbose,
)
from amqpjobs.cli._outputs import output_target
from amqpjobs.cli._root import main
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.asyncapi import asyncapi_document
from amqpjobs.jobs.outcome import REPORT_LEVELS
from amqpjobs.runtime import held_signals
from amqpjobs.runtime.child import ChildSpec
from amqpjobs.runtime.handler_threads import bound_the_exit, want_exit_bound
from amqpjobs.runtime.loading import LOOPS, load_app, loop_factory
from amqpjobs.runtime.logs import configure_logging
from amqpjobs.runtime.preflight import check_before_children
from amqpjobs.runtime.process_count import process_count, usable_cpus
from amqpjobs.runtime.processes import run_worker
from amqpjobs.runtime.supervisor import Supervisor
from amqpjobs.runtime.worker_config import WorkerOptions, check_worker, require_served


@main.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--queues", "-q", help="Comma-separated job queues to consume (default: all the app's jobs use).")
@click.option(
    "--concurrency",
    "-c",
    type=WholeNumber(1, 256),
    default=1,
    show_default=True,
    help=(
        "Slots per job queue: at most this many unacked deliveries at once (one consumer with this "
        "prefetch per work queue; a sharded job queue's shards share the slots)."
    ),
)
@click.option("--grace", default="30s", show_default=True, help="Time in-flight jobs get to finish on SIGTERM.")
@click.option(
    "--consumer-timeout",
    default="30m",
    show_default=True,
    help="The broker's consumer_timeout; job timeouts above it are warned about.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@click.option(
    "--log-outcomes",
    type=click.Choice(REPORT_LEVELS),
    default="all",
    show_default=True,
    help="Which job outcomes get a log line: all, failures (not succeeded/duplicate/skipped) or none "
    "(metrics count all).",
)
@click.option(
    "--outcome-events",
    type=click.Choice(REPORT_LEVELS),
    default="all",
    show_default=True,
    help="Which job outcomes are published as outcome events (a replayed job's always is).",
)
@click.option(
    "--loop",
    type=click.Choice(LOOPS),
    default="asyncio",
    show_default=True,
    help="Event loop: asyncio, or uvloop (pip install 'amqpjobs[uvloop]').",
)
@click.option("--metrics-port", type=WholeNumber(0, 65535), help="Serve /metrics, /healthz, /readyz on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Interface for --metrics-port.")
@click.option(
    "--processes",
    "-p",
    default="1",
    show_default=True,
    help=(
        "Worker processes, each with --concurrency slots, or 'auto' (one per CPU): a supervisor restarts "
        "a child that dies and serves one --metrics-port for all. At most 4 per CPU."
    ),
)
@click.option(
    "--new-ledger",
    is_flag=True,
    help="Begin with a new, empty idempotency ledger although the app had one (its file lost, another "
    "database): the jobs it had marked done may run again. Without it such a start is refused.",
)
@click.option(
    "--start-timeout",
    default="2m",
    show_default=True,
    help="With --processes: a child not ready this long after its start (its app's import hangs) is killed and "
    "counted as a failed start (five within 60 s stop the supervisor). At least --connect-timeout.",
)
@long_running_url_options
@errors_to_exit_codes
@declares
def consume(
    app_ref: str,
    queues: str | None,
    concurrency: int,
    grace: str,
    consumer_timeout: str,
    log_json: bool,
    log_outcomes: str,
    outcome_events: str,
    loop: str,
    metrics_port: int | None,
    metrics_host: str,
    processes: str,
    new_ledger: bool,
    start_timeout: str,
    url: str | None,
    management_url: str | None,
) -> None:
    """Run a worker for the app MODULE:APP until SIGTERM/SIGINT (then drain and exit 0)."""
    named = None if queues is None else comma_items("--queues", queues, "mail,billing")
    if named == ():
        raise ConfigurationError(
            "--queues names no job queue: give them comma-separated (e.g. --queues mail,billing), "
            "or leave the option out to consume every job queue the app's jobs use"
        )
    options = WorkerOptions(
        queues=named,
        concurrency=concurrency,
        grace=duration_option("--grace", grace),
        consumer_timeout=duration_option("--consumer-timeout", consumer_timeout),
        log_outcomes=log_outcomes,
        outcome_events=outcome_events,
        new_ledger=new_ledger,
    )
    count = process_count(processes, usable_cpus())
    start_bound = duration_option("--start-timeout", start_timeout)
    level = logging.DEBUG if verbose() else logging.INFO
    configure_logging(level, json_lines=log_json)
    held_signals.exit_on_signal()  # until the loop's handlers: a signal exits 0 at once (nothing taken yet)
    broker = settings(url, management_url)
    if count == 1:  # no child whose start it could bound: not judged against --connect-timeout
        if click.get_current_context().get_parameter_source("start_timeout") != ParameterSource.DEFAULT:
            click.echo(f"warning: {START_TIMEOUT_UNUSED}", err=True)
    elif start_bound < broker.connect_timeout:
        raise ConfigurationError(
            f"--start-timeout {start_timeout} is shorter than --connect-timeout ({broker.connect_timeout:g}s): a "
            "child still retrying its first connect would be killed; give it more"
        )
    factory = loop_factory(loop)
    want_exit_bound()  # threads the app left running never keep this process, however the command ends
    if count > 1:
        # what each child would refuse at its start: refused here, at once (and its store files opened first)
        opened = check_before_children(app_ref, options)
        spec = ChildSpec(app_ref, 0, options, broker, log_level=level, log_json=log_json, loop=loop,
                         stores_opened=opened)  # fmt: skip
        with asyncio.Runner() as runner:  # the supervisor only waits on its children: the default loop
            sys.exit(runner.run(Supervisor(spec, count, metrics_host, metrics_port, start_bound).run()))
    app = load_app(app_ref)
    check_worker(app, options)  # its refusals first, as the supervisor's check_before_children orders them
    require_served(app, options)
    with asyncio.Runner(loop_factory=factory) as runner:
        code = runner.run(run_worker(app, broker, options, metrics_port, metrics_host))
        bound_the_exit(code)  # threads the app left running don't keep the process (nor the Runner's close)
    sys.exit(code)


#: Said when ``--start-timeout`` is given to a one-process ``consume`` (``--processes`` 1, or auto on one CPU).
START_TIMEOUT_UNUSED = (
    "--start-timeout bounds the start of a --processes child; with one process there is none, so it is ignored "
    "(give --processes 2 or more, or leave the option out)"
)


@main.command("asyncapi")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option(
    "-o",
    "--output",
    type=click.Path(allow_dash=True),
    help="File to write (default, or -: stdout).",
)
@errors_to_exit_codes
def asyncapi(app_ref: str, output: str | None) -> None:
    """Write an AsyncAPI 3.0 document of MODULE:APP: a channel per job queue and shard, a message per job.

    For publishers in other languages: exchange, routing key and AMQP bindings of each
    channel, each job's payload JSON Schema (from its pydantic model) and our headers' schema.
    """
    out = output_target("-o/--output", output)  # left out, - or /dev/stdout: stdout
    app = load_app(app_ref, reading=True)
    text = json.dumps(asyncapi_document(app.name, app.app_version, app, app.topology()), indent=2)
    out.write(text + "\n")
    if out.path is not None:
        click.echo(f"wrote {out.shown}", err=True)
