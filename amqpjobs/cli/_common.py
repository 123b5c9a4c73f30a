"""What every command shares: exit codes, the error-to-exit-code wrapper, the URL options and filters.

The exit codes' home is :mod:`amqpjobs.exit_codes` (re-exported here).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, Protocol, TypeVar

import click

from amqpjobs.durations import parse_duration
from amqpjobs.errors import (
    AmqpJobsError,
    BrokerError,
    BusyError,
    ConfigurationError,
    InvalidPayloadError,
    LedgerUnavailableError,
    PayloadStoreError,
    PublishError,
    ResultsUnavailableError,
    TopologyConflictError,
    TopologyValidationError,
)
from amqpjobs.exit_codes import EXIT_BAD_INPUT as EXIT_BAD_INPUT
from amqpjobs.exit_codes import EXIT_BROKEN_PIPE as EXIT_BROKEN_PIPE
from amqpjobs.exit_codes import EXIT_BROKER as EXIT_BROKER
from amqpjobs.exit_codes import EXIT_BUSY as EXIT_BUSY
from amqpjobs.exit_codes import EXIT_FOUND as EXIT_FOUND
from amqpjobs.exit_codes import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from amqpjobs.exit_codes import EXIT_UNSIGNALLED as EXIT_UNSIGNALLED
from amqpjobs.exit_codes import exit_code
from amqpjobs.printable import printable, printable_lines
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.logs import flush_logs
from amqpjobs.runtime.mover_names import acting_as
from amqpjobs.runtime.results import ResultsStore
from amqpjobs.topology.naming import queue_name_problem
from amqpjobs.wire.channel_room import with_limit_fix
from amqpjobs.wire.errors import LIBRARY_ERRORS, library_error
from amqpjobs.wire.settings import CONNECT_TIMEOUT_ENV, MANAGEMENT_URL_ENV, URL_ENV, BrokerSettings, broker_settings
from amqpjobs.wire.urls import redact_text

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: ``--connect-timeout`` defaults: one-shot commands give up soon, long-running ones wait for
#: a broker still starting (README "Workers").
ONE_SHOT_CONNECT_TIMEOUT = "5s"
LONG_RUNNING_CONNECT_TIMEOUT = "30s"
_CONNECT_TIMEOUT_KEY = "amqpjobs.connect_timeout"


def verbose() -> bool:
    """True when the command line has ``-v``/``--verbose``, before the subcommand (the root's) or after it."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("verbose"))


def _keep_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:  # the root group's callback already ran (click parses a subcommand after it): same effect now
        ctx.find_root().params["verbose"] = True
        logging.getLogger().setLevel(logging.DEBUG)


def verbose_option(func: F) -> F:
    """``-v``/``--verbose`` on a subcommand: the same as the root's (``amqpjobs consume -v app:app``)."""
    return click.option(
        "-v", "--verbose", is_flag=True, expose_value=False, callback=_keep_verbose, is_eager=True,
        help="Log debug details (as amqpjobs -v).",
    )(func)  # fmt: skip


def _broken_pipe() -> None:
    """Stdout's reader is gone: point stdout at /dev/null (so the exit flush can't fail too) and exit quietly.

    The recipe of Python's ``signal`` module docs, "Note on SIGPIPE".
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_BROKEN_PIPE)


def declares(func: F) -> F:
    """Mark a command that declares on the broker (below :func:`errors_to_exit_codes`).

    Its invalid topology adds ``nothing was declared``: a command that only reads
    (``status``, ``topology plan``) would not have declared anything anyway.
    """
    func.declares_topology = True  # type: ignore[attr-defined]
    return func


def error_text(exc: BaseException) -> str:
    """The text of ``exc`` as an error line prints it: credentials redacted, then control characters escaped.

    An error's text can hold what a publisher, a queue name, a file or an option put there; a line
    feed in it would forge a line, an escape sequence steer the terminal (:func:`~amqpjobs.printable.printable`).
    An invalid topology keeps its one line per problem (each problem escaped).
    """
    if isinstance(exc, TopologyValidationError):
        head = str(exc).split("\n", 1)[0]
        return "\n".join([head, *(f"  - {printable(redact_text(str(p)))}" for p in exc.problems)])
    return printable(redact_text(str(exc)))


def errors_to_exit_codes(func: F) -> F:
    """Wrap a command so our errors print one line and exit with the documented code.

    The line is :func:`error_text`: credentials redacted and control characters escaped.
    """
    nothing_declared = getattr(func, "declares_topology", False)

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context(silent=True)
        try:
            with acting_as(ctx.command_path if ctx is not None else ""):  # a mover it holds names the command
                return _with_tracebacks(func, *args, **kwargs)
        except BrokenPipeError:
            _broken_pipe()
        except KeyboardInterrupt:  # Ctrl-C; a command with more to say (replay's summary) catches it first
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except TopologyValidationError as exc:
            click.echo(f"error: {error_text(exc)}", err=True)
            if nothing_declared:
                click.echo("nothing was declared", err=True)
            sys.exit(exit_code(exc))
        except TopologyConflictError as exc:
            click.echo(printable_lines(redact_text(exc.report)))
            if exc.declared_nothing:
                click.echo("conflicts found: nothing was declared", err=True)
            sys.exit(exit_code(exc))
        except ConfigurationError as exc:
            click.echo(f"error: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except (InvalidPayloadError, PublishError) as exc:
            # the outcome is unknown (no confirm, closed under it), or an alarm blocks publishers: the broker's side
            broker_side = exit_code(exc) == EXIT_BROKER
            click.echo(f"{'broker error' if broker_side else 'error'}: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except BusyError as exc:
            click.echo(f"busy: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except BrokerError as exc:
            click.echo(f"broker error: {with_limit_fix(error_text(exc))}", err=True)
            sys.exit(exit_code(exc))
        except ResultsUnavailableError as exc:  # a service failed us, like the broker
            click.echo(f"results store error: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except LedgerUnavailableError as exc:  # likewise
            click.echo(f"ledger error: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except PayloadStoreError as exc:  # likewise
            click.echo(f"payload store error: {error_text(exc)}", err=True)
            sys.exit(exit_code(exc))
        except LIBRARY_ERRORS as exc:  # a client-library error no wire call translated: the broker's side, not a file
            click.echo(f"broker error: {error_text(library_error(exc))}", err=True)
            sys.exit(EXIT_BROKER)
        except OSError as exc:  # files given on the command line
            if exc.errno == errno.EPIPE:
                _broken_pipe()
            what = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
            click.echo(f"error: {printable(redact_text(what))}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]


def _with_tracebacks(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the command; with ``-v``, an error of ours also prints its traceback (and its cause's) first."""
    try:
        try:
            return func(*args, **kwargs)
        finally:  # the log lines kept for the end of a loop turn go out before any error line
            flush_logs()
    except (AmqpJobsError, OSError) as exc:
        if verbose() and not isinstance(exc, BrokenPipeError):
            traceback.print_exception(exc, file=sys.stderr)
        raise


def duration_option(option: str, value: str) -> float:
    """A CLI option's duration in seconds (``"30s"``, ``"5m"``, plain seconds).

    Raises:
        ConfigurationError: not a positive duration; the message starts with ``option``
            and shows the accepted forms (exit 2).

    """
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigurationError(f"{option}: {exc}") from None


class WholeNumber(click.IntRange):
    """click's ``IntRange`` for the digits 0-9 only: ``int()`` also reads other scripts' digits (``'٣'``, ``'５'``).

    Every number option of ours has this type (or :class:`Decimal`): a test walks the commands.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """``value`` as an int in the range; text holding anything but ASCII is refused (exit 2)."""
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{printable(repr(value))} is not a whole number in the digits 0-9", param, ctx)
        if isinstance(value, str):
            try:
                int(value)
            except ValueError:  # click would say "is not a valid integer range"
                self.fail(f"{printable(repr(value))} is not a whole number: give one such as 4, no unit", param, ctx)
        return super().convert(value, param, ctx)


class Decimal(click.FloatRange):
    """click's ``FloatRange`` for the digits 0-9 only (as :class:`WholeNumber`)."""

    def _describe_range(self) -> str:
        """No range in the help when there is none (click would show ``x<=None``)."""
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """``value`` as a float in the range; text holding anything but ASCII is refused (exit 2)."""
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{printable(repr(value))} is not a number in the digits 0-9", param, ctx)
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:  # click would say "is not a valid float range"
                self.fail(f"{printable(repr(value))} is not a number: give one such as 50 or 0.5, no unit", param, ctx)
        return super().convert(value, param, ctx)


def _keep_connect_timeout(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    ctx.meta[_CONNECT_TIMEOUT_KEY] = seconds
    return seconds


def connect_timeout_option(default: str) -> Callable[[F], F]:
    """``--connect-timeout``: how long to retry a refused first connect; read by :func:`settings`.

    Not passed to the command function (``expose_value=False``): :func:`settings` reads it
    from the click context, so every command gets it without a new parameter. Given neither,
    ``$AMQPJOBS_CONNECT_TIMEOUT`` (:data:`~amqpjobs.wire.settings.CONNECT_TIMEOUT_ENV`), else
    ``default``; a bad value is refused naming the variable (exit 2).
    """
    return click.option(
        "--connect-timeout", default=default, show_default=True, expose_value=False,
        envvar=CONNECT_TIMEOUT_ENV, show_envvar=True, callback=_keep_connect_timeout,
        help="Keep retrying a refused connect this long (a duration: '30s'); a log line per node, then one a minute.",
    )  # fmt: skip


def _joined(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """``--url`` given several times: one comma-separated list (as ``AMQPJOBS_URL``); an empty one is refused.

    ``AMQPJOBS_URL`` is taken as written: click splits it at blanks, which would make ``"a, b"``
    the list ``a,,b``, an empty item :func:`~amqpjobs.wire.settings.broker_settings` refuses.
    """
    if ctx.get_parameter_source(param.name or "url") is click.core.ParameterSource.ENVIRONMENT:
        return os.environ.get(URL_ENV) or None
    if any(not one.strip() for one in value):
        raise click.BadParameter(
            f"--url is empty: give amqp://user:pass@host:5672/vhost, or leave it out to use ${URL_ENV}"
        )
    return ",".join(value) or None


def comma_items(option: str, value: str, example: str, item: str = "name") -> tuple[str, ...]:
    """The items of comma-separated option ``value``, spaces stripped; ``()`` when it names none (``""``, ``" , "``).

    The one rule for every comma-list option (``--queues``, ``--schedules``; ``--url`` by
    :func:`~amqpjobs.wire.settings.broker_settings`, which must not show it: it holds a password):
    an empty item beside others is a typo that would drop a name without a word.

    Raises:
        ConfigurationError: an item is empty (a leading, trailing or doubled comma, or only spaces between two);
            the message names ``option``, ``value`` and a good ``example`` (exit 2).

    """
    items = tuple(one.strip() for one in value.split(","))
    if not any(items):
        return ()
    if "" in items:
        raise ConfigurationError(
            f"{option} {value!r} has an empty {item} (a comma with nothing but spaces before or after it): "
            f"separate the {item}s with single commas, e.g. {option} {example}"
        )
    return items


def url_options(func: F) -> F:
    """Add ``--url``, ``--management-url`` and ``--connect-timeout`` (5 s) to a one-shot command."""
    return _url_options(connect_timeout_option(ONE_SHOT_CONNECT_TIMEOUT)(func))


def long_running_url_options(func: F) -> F:
    """:func:`url_options` for commands that run until stopped (``--connect-timeout`` 30 s)."""
    return _url_options(connect_timeout_option(LONG_RUNNING_CONNECT_TIMEOUT)(func))


def _url_options(func: F) -> F:
    func = verbose_option(func)
    func = click.option(
        "--management-url",
        envvar=MANAGEMENT_URL_ENV,
        help=f"Management API URL (default: ${MANAGEMENT_URL_ENV}, else each node's AMQP host, port + 10000).",
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
    """The broker settings from the URL options (and ``--connect-timeout``, when the command has it)."""
    broker = broker_settings(url, management_url)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and _CONNECT_TIMEOUT_KEY in ctx.meta:
        broker = broker.with_connect_timeout(ctx.meta[_CONNECT_TIMEOUT_KEY])
    return broker


def queue_name_arg(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback for a queue name given on the command line (QUEUE arguments, ``--to``).

    The rule is :func:`amqpjobs.topology.naming.queue_name_problem` (the one home): a name
    AMQP cannot carry is exit 2 with what is wrong, before any connect.
    """
    if value is not None and (problem := queue_name_problem(value)):
        raise click.BadParameter(problem)
    return value


def app_results_option(func: F) -> F:
    """``--app MODULE:APP``: record what the command does in that app's results store (park, replay)."""
    return click.option(
        "--app", "app_ref", metavar="MODULE:APP", default=None,
        help="Record each moved job's new state in this app's results store (App(results=...)); "
        "without --app nothing is recorded.",
    )(func)  # fmt: skip


def app_results(app_ref: str | None, required: bool = True) -> ResultsStore | None:
    """The results store of the app ``app_ref`` names (None without ``--app``).

    ``required=False`` (``replay``, whose ``--app`` also checks ``--to``): an app without a
    results store gives None.

    Raises:
        ConfigurationError: the app can't be loaded, or (``required``) it has no results store.
    """
    if app_ref is None:
        return None
    app = load_app(app_ref, existing=True)  # a results file that is not there is a wrong path, not a new store
    if app.results is None and not required:
        return None
    if app.results is None:
        raise ConfigurationError(f"app {app_ref!r} has no results store (App(..., results=...)); leave --app out")
    return app.results


class _Closable(Protocol):
    async def close(self) -> None: ...


async def closing_store(coro: Awaitable[T], store: _Closable | None) -> T:
    """Await ``coro``, then close ``store`` on the same event loop (its connections belong to it)."""
    try:
        return await coro
    finally:
        if store is not None:
            await store.close()
