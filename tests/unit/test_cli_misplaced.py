"""A command typed under the wrong group names where it lives (README "Quarantine and replay")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main

pytestmark = pytest.mark.version_independent


def test_quarantine_replay_names_the_replay_command() -> None:
    # before: "Error: No such command 'replay'." (exit 2), the fix named nowhere; the README said `quarantine replay`
    result = CliRunner().invoke(main, ["quarantine", "replay", "urgent.quarantine", "--rate", "5"])
    assert result.exit_code == 2, result.output
    assert "replay is a command of its own, not of quarantine: amqpjobs replay urgent.quarantine --rate 5" in (
        result.output
    ), result.output


def test_another_unknown_quarantine_command_is_still_unknown() -> None:
    result = CliRunner().invoke(main, ["quarantine", "nosuch"])
    assert result.exit_code == 2, result.output
    assert "No such command 'nosuch'" in result.output, result.output


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        (["it's"], "amqpjobs replay 'it'\"'\"'s'"),
        (["wo rk", "--to", "$(x)"], "amqpjobs replay 'wo rk' --to '$(x)'"),
        (["a\tb"], "amqpjobs replay $'a\\tb'"),
    ],
    ids=["quote", "space-and-substitution", "tab"],
)
def test_the_named_command_pastes_back_as_typed(typed: list[str], shown: str) -> None:
    """README: suggested commands paste back exactly (shell-quoted; control characters in bash's $'...')."""
    # before: "amqpjobs replay it's" (an open quote), "amqpjobs replay wo rk --to $(x)", a raw tab
    result = CliRunner().invoke(main, ["quarantine", "replay", *typed])
    assert result.exit_code == 2, result.output
    assert result.output.rstrip().endswith(f"not of quarantine: {shown}"), result.output
