"""What every command shares: exit codes, the error-to-exit-code wrapper, the URL options and filters."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

import click

from amqpjobs.durations import parse_duration
from amqpjobs.errors import (
    BrokerError,
    BusyError,
    ConfigurationError,
    InvalidPayloadError,
    PublishError,
    TopologyConflictError,
    TopologyValidationError,
)
from amqpjobs.jobs.outcome import REASONS
from amqpjobs.jobs.quarantine import BROKER_REASONS, Selection
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.wire.settings import MANAGEMENT_URL_ENV, URL_ENV, BrokerSettings, broker_settings

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FOUND = 1
EXIT_BAD_INPUT = 2
EXIT_BROKER = 3
EXIT_BUSY = 4


def errors_to_exit_codes(func: F) -> F:
    """Wrap a command so our errors print one line and exit with the documented code."""

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
            if exc.declared_nothing:
                click.echo("conflicts found: nothing was declared", err=True)
            sys.exit(EXIT_FOUND)
        except ConfigurationError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (InvalidPayloadError, PublishError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except BusyError as exc:
            click.echo(f"busy: {exc}", err=True)
            sys.exit(EXIT_BUSY)
        except BrokerError as exc:
            click.echo(f"broker error: {exc}", err=True)
            sys.exit(EXIT_BROKER)
        except OSError as exc:  # files given on the command line
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]


def _joined(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """``--url`` given several times: one comma-separated list (what ``AMQPJOBS_URL`` takes)."""
    return ",".join(value) or None


def url_options(func: F) -> F:
    """Add ``--url`` and ``--management-url`` (with their environment variables) to a command."""
    func = click.option(
        "--management-url",
        envvar=MANAGEMENT_URL_ENV,
        help=f"Management API URL (default: ${MANAGEMENT_URL_ENV}, else the AMQP host, port + 10000).",
    )(func)
    func = click.option(
        "--url",
        envvar=URL_ENV,
        multiple=True,
        callback=_joined,
        help=f"AMQP URL amqp://user:pass@host:port/vhost (default: ${URL_ENV}). For a cluster, one per node: "
        "comma-separated or the option repeated (a comma in a password must be %-encoded as %2C).",
    )(func)
    return func


def settings(url: str | None, management_url: str | None) -> BrokerSettings:
    """The broker settings from the URL options."""
    return broker_settings(url, management_url)


def selection(job: str | None, error_type: str | None, reason: str | None, since: str | None) -> Selection:
    """The quarantine filter the ``--job/--error-type/--reason/--since`` options give."""
    when = None
    if since is not None and not since.strip():
        raise ConfigurationError("--since is empty: give a duration ('2h') or an ISO-8601 time, or leave it out")
    for flag, value in (("--job", job), ("--error-type", error_type), ("--reason", reason)):
        if value is not None and not value.strip():
            raise ConfigurationError(f"{flag} is empty: give a value or leave it out")
    if reason is not None and reason not in REASONS and reason.removeprefix("x-death:") not in BROKER_REASONS:
        raise ConfigurationError(
            f"--reason {reason!r} is not a reason; use one of {', '.join(REASONS)}, or x-death:<reason> "
            f"({', '.join(BROKER_REASONS)}) for broker-side dead-letters"
        )
    if since:
        try:
            when = datetime.now(UTC) - timedelta(seconds=parse_duration(since))
        except ValueError:
            when = parse_time(since)
            if when is None:
                raise ConfigurationError(
                    f"--since {since!r}: give a duration ('2h', '30m') or an ISO-8601 time ('2026-11-29T08:00Z')"
                ) from None
    return Selection(job=job, error_type=error_type, reason=reason, since=when)


def filter_options(func: F) -> F:
    """Add the quarantine filter options to a command."""
    func = click.option("--since", help="Only failures at or after this: a duration ago ('2h') or an ISO time.")(func)
    func = click.option("--reason", help="Only this reason (exhausted, permanent, ..., or x-death:expired).")(func)
    func = click.option("--error-type", help="Only this error type (e.g. ValueError).")(func)
    func = click.option("--job", help="Only this job name.")(func)
    return func
