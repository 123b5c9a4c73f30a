"""Ctrl-C in any command: one line and exit 130, not click's "Aborted!" and 1 (no broker)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.cli._common import errors_to_exit_codes


@click.command()
@errors_to_exit_codes
def interrupted() -> None:
    raise KeyboardInterrupt


def test_ctrl_c_in_any_command_exits_130_with_one_line():
    result = CliRunner().invoke(interrupted, [])
    assert (result.exit_code, result.stderr, result.stdout) == (130, "interrupted\n", "")


def _raising(exc: Exception) -> click.Command:
    @click.command()
    @errors_to_exit_codes
    def command() -> None:
        raise exc

    return command


def test_a_publish_whose_outcome_is_unknown_exits_3_as_broker_trouble_not_2():
    """Plain PublishError (no confirm, channel or connection closed under it) is the broker's side."""
    from amqpjobs.errors import PublishError, UnroutableError

    unknown = CliRunner().invoke(_raising(PublishError("job 'x' may or may not be stored")), [])
    assert (unknown.exit_code, unknown.stderr) == (3, "broker error: job 'x' may or may not be stored\n")
    refused = CliRunner().invoke(_raising(UnroutableError("exchange 'jobs' does not exist")), [])
    assert (refused.exit_code, refused.stderr) == (2, "error: exchange 'jobs' does not exist\n")


BAD_TOPOLOGY = '[[exchanges]]\nname = "jobs"\n'  # the plural tables: an invalid topology


@pytest.mark.parametrize(
    ("args", "declares"),
    [(["topology", "apply"], True), (["topology", "plan"], False), (["topology", "export"], False),
     (["status"], False)],
)  # fmt: skip
def test_an_invalid_topology_says_nothing_was_declared_only_where_a_command_declares(
    tmp_path: Path, args: list[str], declares: bool
):
    path = tmp_path / "t.toml"
    path.write_text(BAD_TOPOLOGY)
    env = {"AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/", "AMQPJOBS_MANAGEMENT_URL": "http://127.0.0.1:1"}
    result = CliRunner().invoke(main, [*args, str(path)], env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: invalid topology (1 problem(s)):\n")
    assert ("nothing was declared\n" in result.stderr) is declares
    assert result.stdout == ""
