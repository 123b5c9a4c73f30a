"""The ``amqpjobs`` click group every command hangs from."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import click

from amqpjobs._version import __version__
from amqpjobs.cli._common import EXIT_INTERRUPTED
from amqpjobs.printable import shell_quote
from amqpjobs.runtime import held_signals


class PointingGroup(click.Group):
    """A group that, for a command typed under it that lives elsewhere (:attr:`elsewhere`), names where it lives."""

    #: Command name -> the command it is (``amqpjobs quarantine replay Q`` is ``amqpjobs replay Q``).
    elsewhere: ClassVar[Mapping[str, str]] = MappingProxyType({"replay": "amqpjobs replay"})

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, but an unknown name of :attr:`elsewhere` is a usage error naming the command to type."""
        if args and args[0] not in self.commands and args[0] in self.elsewhere:
            typed = " ".join([self.elsewhere[args[0]], *map(shell_quote, args[1:])])  # pastes back as typed
            raise click.UsageError(f"{args[0]} is a command of its own, not of {self.name}: {typed}", ctx)
        return super().resolve_command(ctx, args)


@click.group()
@click.version_option(__version__, prog_name="amqpjobs")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Reliable background jobs on RabbitMQ."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    release_held_signals_unless("consume", "schedule")


def release_held_signals_unless(*long_running: str) -> None:
    """A group's first step: unless its subcommand is one of ``long_running``, end the signals' hold.

    The console script holds SIGTERM and SIGINT while the CLI loads
    (:mod:`amqpjobs.runtime.held_signals`); a long-running command (``consume``, ``schedule
    run``) exits 0 on one until its loop's handlers are in place, every other command gets
    Python's handling back here. A signal held meanwhile then ends the command as it would
    have: SIGTERM kills the process, Ctrl-C exits 130 with "interrupted".
    """
    if click.get_current_context().invoked_subcommand not in long_running:
        release_held_signals()


def release_held_signals() -> None:
    """End the signals' hold (when not ended yet) and act on the one held: see :func:`release_held_signals_unless`.

    The console script calls it once the CLI returns too, for what never reached a command
    (``--help``, ``--version``, a usage error).

    Raises:
        SystemExit: 130 for a held SIGINT. A held SIGTERM ends the process by that signal.
    """
    held = held_signals.release()
    if held == signal.SIGINT:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if held is not None:
        signal.raise_signal(held)
