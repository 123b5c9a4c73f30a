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
