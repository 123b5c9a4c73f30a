"""The ``amqpjobs`` command line: a thin click layer over the library.

Exit codes: 0 success; 1 the check found something (plan conflicts); 2 bad input
(invalid topology files, bad options); 3 the broker or its management API failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from amqpjobs import __version__
from amqpjobs.durations import parse_duration
from amqpjobs.errors import (
    BrokerError,
    ConfigurationError,
    InvalidPayloadError,
    PublishError,
    TopologyConflictError,
    TopologyValidationError,
)
from amqpjobs.runtime.deploy import apply_topology, export_topology, plan_topology
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.logs import configure_logging
from amqpjobs.runtime.worker import WorkerOptions, run_worker
from amqpjobs.wire.settings import MANAGEMENT_URL_ENV, URL_ENV, BrokerSettings, broker_settings

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FOUND = 1
EXIT_BAD_INPUT = 2
EXIT_BROKER = 3


def _errors_to_exit_codes(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TopologyValidationError as exc:
            click.echo(f"error: {exc}", err=True)
            click.echo("nothing was declared", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except TopologyConflictError as exc:
            click.echo(exc.report)
            click.echo("conflicts found: nothing was declared", err=True)
            sys.exit(EXIT_FOUND)
        except ConfigurationError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (InvalidPayloadError, PublishError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except BrokerError as exc:
            click.echo(f"broker error: {exc}", err=True)
            sys.exit(EXIT_BROKER)

    return wrapper  # type: ignore[return-value]


def _url_options(func: F) -> F:
    func = click.option(
        "--management-url",
        envvar=MANAGEMENT_URL_ENV,
        help=f"Management API URL (default: ${MANAGEMENT_URL_ENV}, else the AMQP host, port + 10000).",
    )(func)
    func = click.option(
        "--url", envvar=URL_ENV, help=f"AMQP URL amqp://user:pass@host:port/vhost (default: ${URL_ENV})."
    )(func)
    return func


def _settings(url: str | None, management_url: str | None) -> BrokerSettings:
    return broker_settings(url, management_url)


@click.group()
@click.version_option(__version__, prog_name="amqpjobs")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Reliable background jobs on RabbitMQ."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--queues", "-q", help="Comma-separated job queues to consume (default: all the app's jobs use).")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Slots per work queue; each holds at most one unacked delivery (prefetch 1).",
)
@click.option("--grace", default="30s", show_default=True, help="Time in-flight jobs get to finish on SIGTERM.")
@click.option(
    "--consumer-timeout",
    default="30m",
    show_default=True,
    help="The broker's consumer_timeout; job timeouts above it are warned about.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@_url_options
@_errors_to_exit_codes
def consume(
    app_ref: str,
    queues: str | None,
    concurrency: int,
    grace: str,
    consumer_timeout: str,
    log_json: bool,
    url: str | None,
    management_url: str | None,
) -> None:
    """Run a worker for the app MODULE:APP until SIGTERM/SIGINT (then drain and exit 0)."""
    try:
        options = WorkerOptions(
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
            concurrency=concurrency,
            grace=parse_duration(grace),
            consumer_timeout=parse_duration(consumer_timeout),
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    configure_logging(json_lines=log_json)
    app = load_app(app_ref)
    settings = _settings(url, management_url)
    sys.exit(asyncio.run(run_worker(app, settings, options)))


@main.group()
def topology() -> None:
    """Plan, apply and export the declarative topology (exchanges, job queues, tiers, quarantine)."""


@topology.command("plan")
@click.argument("path", type=click.Path())
@_url_options
@_errors_to_exit_codes
def topology_plan(path: str, url: str | None, management_url: str | None) -> None:
    """Compare the topology at PATH with the live vhost: create / unchanged / CONFLICT.

    Exit 0 without conflicts, 1 with conflicts, 2 when PATH is invalid, 3 on broker errors.
    """
    settings = _settings(url, management_url)
    result = asyncio.run(plan_topology(path, settings))
    for warning in result.loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"broker {settings.safe_url} (RabbitMQ {'.'.join(map(str, result.broker_version))})")
    click.echo(result.plan.report())
    if result.plan.conflicts:
        sys.exit(EXIT_FOUND)


@topology.command("apply")
@click.argument("path", type=click.Path())
@_url_options
@_errors_to_exit_codes
def topology_apply(path: str, url: str | None, management_url: str | None) -> None:
    """Declare the topology at PATH; with any conflict, declare nothing and print the plan.

    Idempotent: a second run creates nothing and says so.
    """
    settings = _settings(url, management_url)
    result = asyncio.run(apply_topology(path, settings))
    for warning in result.loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    created = result.plan.creates
    for item in created:
        click.echo(f"created   {item.desired.kind:<8} {item.desired.name}")
    unchanged = result.plan.counts()["unchanged"]
    if created:
        click.echo(f"applied to {settings.safe_url}: {len(created)} created, {unchanged} unchanged")
    else:
        click.echo(f"nothing to create on {settings.safe_url}: all {unchanged} objects unchanged")


@topology.command("export")
@click.argument("path", type=click.Path())
@click.option("--vhost", default="/", show_default=True, help="Vhost written into every object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write (default stdout).")
@_errors_to_exit_codes
def topology_export(path: str, vhost: str, output: str | None) -> None:
    """Write RabbitMQ definitions JSON for the topology at PATH (for `rabbitmqctl import_definitions`)."""
    text = json.dumps(export_topology(path, vhost), indent=2, sort_keys=True)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)
