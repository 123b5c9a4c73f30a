"""``consume --start-timeout``: a duration, at least ``--connect-timeout``, refused before anything starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.runtime.supervisor import DEFAULT_START_TIMEOUT, Supervisor

URL = ["--url", "amqp://guest:guest@127.0.0.1:1/"]


def test_the_default_bound_is_well_above_the_connect_retry_of_a_start() -> None:
    assert DEFAULT_START_TIMEOUT == 120.0  # a start: import, a connect retried up to 30 s, checks
    assert Supervisor.__init__.__defaults__ is not None
    assert DEFAULT_START_TIMEOUT in Supervisor.__init__.__defaults__


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("10s", "--start-timeout 10s is shorter than --connect-timeout (30s): a child still retrying its first "
                "connect would be killed; give it more"),
        ("soon", "--start-timeout: 'soon' is not a duration"),
        ("0", "--start-timeout: '0' must be a positive"),
    ],
)  # fmt: skip
def test_a_bad_start_timeout_is_refused_before_anything_starts(value: str, words: str) -> None:
    result = CliRunner().invoke(
        main, ["consume", "examples.shop:app", "--processes", "2", "--start-timeout", value, *URL]
    )
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_start_timeout_with_one_process_is_not_judged_as_a_childs_bound() -> None:
    """One process has no child to kill: no refusal in a child's words; said to be ignored, and the start goes on."""
    result = CliRunner().invoke(main, ["consume", "no_such_module_h185:app", "--start-timeout", "5s", *URL])
    assert "a child still retrying its first connect would be killed" not in result.output, result.output
    assert (
        "--start-timeout bounds the start of a --processes child; with one process there is none, so it is "
        "ignored (give --processes 2 or more, or leave the option out)"
    ) in result.output, result.output
    assert "cannot import module 'no_such_module_h185'" in result.output  # it went on to load the app
    assert result.exit_code == 2, result.output
    quiet = CliRunner().invoke(main, ["consume", "no_such_module_h185:app", *URL])  # the default: nothing said
    assert "--start-timeout" not in quiet.output, quiet.output
