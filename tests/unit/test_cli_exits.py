"""Ctrl-C in any command: one line and exit 130, not click's "Aborted!" and 1 (no broker)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from amqpjobs.cli._common import errors_to_exit_codes


@click.command()
@errors_to_exit_codes
def interrupted() -> None:
    raise KeyboardInterrupt


def test_ctrl_c_in_any_command_exits_130_with_one_line():
    result = CliRunner().invoke(interrupted, [])
    assert (result.exit_code, result.stderr, result.stdout) == (130, "interrupted\n", "")
