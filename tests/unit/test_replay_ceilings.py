"""The CLI's replay refuses what the console refuses: the ceilings have one home (jobs/replay_plan.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.console import forms
from amqpjobs.jobs import replay_plan

pytestmark = pytest.mark.version_independent

ENV = {"AMQPJOBS_URL": "amqp://x:1/"}


@pytest.mark.parametrize(
    ("args", "option", "bound"),
    [
        (["--rate", "10001"], "--rate", "10000"),
        (["--rate", "1e308"], "--rate", "10000"),
        (["--canary", "10001"], "--canary", "10000"),
        (["--canary", "2", "--canary-timeout", "61m"], "--canary-timeout", "1h"),
    ],
)
def test_replay_refuses_above_the_consoles_ceiling(args: list[str], option: str, bound: str) -> None:
    result = CliRunner().invoke(main, ["replay", "work", *args], env=ENV)
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert bound in result.output
    assert "Traceback" not in result.output


def test_the_ceilings_have_one_home() -> None:
    console = vars(forms)  # the console uses the very objects, not copies of the values
    for name in ("MAX_REPLAY_RATE", "MAX_CANARY", "MAX_CANARY_TIMEOUT"):
        assert console[name] is getattr(replay_plan, name), name
    ceilings = (replay_plan.MAX_REPLAY_RATE, replay_plan.MAX_CANARY, replay_plan.MAX_CANARY_TIMEOUT)
    assert ceilings == (10_000.0, 10_000, 3600.0)


@pytest.mark.parametrize(
    ("held", "words"),
    [
        (1, "the 1 copy the broker held unread was dropped with the connection, so that job stays there"),
        (3, "the 3 copies the broker held unread were dropped with the connection, so those jobs stay there"),
    ],
)
def test_a_run_a_resource_alarm_stopped_says_what_moved_what_stays_and_when_to_run_again(held: int, words: str):
    from amqpjobs.jobs.replay_plan import ReplayReport

    report = ReplayReport(queue="work.quarantine", replayed=12, left=288)
    assert report.stopped_by_alarm("memory", held) == (
        "replay of 'work.quarantine' stopped: the broker is blocking publishers: resource alarm (memory): 12 "
        f"replayed before it, 288 still in work.quarantine ({words}; none is in both places); run it again once "
        "the alarm clears"
    )


@pytest.mark.parametrize("rate", ["1e-300", "5e-324", "0.0009"])
@pytest.mark.parametrize("command", [["replay", "work"], ["quarantine", "park", "work", "--yes"],
                                     ["quarantine", "unpark", "work", "--yes"]])  # fmt: skip
def test_a_rate_so_low_the_next_move_waits_for_ever_is_refused(command: list[str], rate: str) -> None:
    """Before: `replay money --rate 1e-300` moved one job, then slept 1e300 s holding the mover lock, silent
    (5e-324: 1 / rate is infinite); measured on 3.10 ('interrupted: moved 1 ... left 4')."""
    result = CliRunner().invoke(main, [*command, "--rate", rate], env=ENV)
    assert result.exit_code == 2, result.output
    assert (
        "--rate must be a positive, finite number of messages per second, at least 0.001 (one message each "
        "1000 s) and at most 10000" in result.output
    )
    assert "Traceback" not in result.output


def test_the_console_refuses_the_rate_the_cli_refuses() -> None:
    with pytest.raises(forms.FormError) as caught:
        forms.positive_number({"rate": "1e-300"}, "rate", replay_plan.MAX_REPLAY_RATE, "messages per second", "10",
                              floor=replay_plan.MIN_REPLAY_RATE)  # fmt: skip
    assert "at least 0.001 messages per second" in str(caught.value)
    assert console_floor() is replay_plan.MIN_REPLAY_RATE


def console_floor() -> float:
    return vars(forms)["MIN_REPLAY_RATE"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("args", "got"),
    [
        (["replay", "work", "--rate", "10000.0000000001"], "(got 10000.0000000001)"),
        (["replay", "work", "--rate", "0.00099999999"], "(got 0.00099999999)"),
        (["quarantine", "park", "work", "--rate", "10000.000001", "--yes"], "(got 10000.000001)"),
        (["replay", "work", "--rate", "20000"], "(got 20000)"),
    ],
)
def test_a_rate_just_past_a_bound_is_said_as_given_not_rounded_onto_it(args: list[str], got: str) -> None:
    """Before: ``--rate 10000.0000000001`` was refused "at most 10000 (got 10000)", as if 10000 were refused."""
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 2, result.output
    assert got in result.output, result.output


def _replay_form(**fields: str) -> object:
    from starlette.datastructures import FormData

    return FormData([("queue", "work.quarantine"), ("scope", "all"), ("rate", "10"), *fields.items()])


@pytest.mark.parametrize("timeout", ["5m", "forever", "0s", "2h", "60s", "1m", " 60s "])
def test_the_console_refuses_a_canary_timeout_without_a_canary_as_the_cli_does(timeout: str) -> None:
    """Before: the console's replay form with the canary emptied and its timeout changed replayed every job at
    once, the timeout ignored without a word, where ``replay --canary-timeout 5m`` without ``--canary`` exits 2."""
    cli = CliRunner().invoke(main, ["replay", "work", "--canary-timeout", timeout], env=ENV)
    assert cli.exit_code == 2, cli.output
    assert "error: --canary-timeout needs --canary (how many jobs to move first, e.g. --canary 2)" in cli.output
    with pytest.raises(forms.FormError) as caught:
        forms.action_form("replay", _replay_form(canary="", canary_timeout=timeout))
    assert caught.value.field == "canary_timeout"
    assert str(caught.value) == (
        "canary_timeout: a canary timeout needs a canary (how many jobs to move first, e.g. 2): fill in canary, "
        f"or empty the timeout (its default is 60s) (got {timeout.strip()!r})"
    )


@pytest.mark.parametrize("timeout", ["", "  "])
def test_the_consoles_untouched_canary_timeout_without_a_canary_is_no_request(timeout: str) -> None:
    # the form sends the field empty, the default only its placeholder: nothing typed is no timeout asked for
    asked = forms.action_form("replay", _replay_form(canary="", canary_timeout=timeout))
    assert (asked.canary, asked.canary_timeout) == (None, replay_plan.DEFAULT_CANARY_TIMEOUT)


@pytest.mark.parametrize(("timeout", "seconds"), [("", 60.0), ("60s", 60.0), ("45s", 45.0)])
def test_the_consoles_canary_timeout_with_a_canary_is_typed_or_the_default(timeout: str, seconds: float) -> None:
    # as ``replay --canary 2`` (no --canary-timeout) waits 60 s: an untouched field is the default
    asked = forms.action_form("replay", _replay_form(canary="2", canary_timeout=timeout))
    assert (asked.canary, asked.canary_timeout, asked.params["canary_timeout"]) == (2, seconds, seconds)
