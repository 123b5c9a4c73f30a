"""Numbers on the command line and in the console's forms are written in the digits 0-9 only.

``int()`` and ``float()`` (and so click's INT, FLOAT, IntRange, FloatRange) read other scripts'
digits: ``--concurrency ٣`` (Arabic-Indic three) ran three slots, ``--processes ٢`` two children,
``replay --rate ٥`` five a second. Every other reader of our values (RabbitMQ, libpq, a shell
script, the duration parser) refuses them, so a value taken here is one nobody can read back
from a config or a log. Now each is refused with exit 2 naming the option, before any connect.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.cli._common import Decimal, WholeNumber
from amqpjobs.console.forms import FormError, positive_number
from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.process_count import process_count

ARABIC_THREE = "\u0663"  # ٣
FULL_WIDTH_FIVE = "\uff15"  # ５
URL = ["--url", "amqp://guest:guest@127.0.0.1:1/"]


def every_option() -> list[tuple[str, click.Parameter]]:
    found: list[tuple[str, click.Parameter]] = []

    def walk(cmd: click.Command, path: str) -> None:
        found.extend((path, p) for p in cmd.params)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(main, "")
    return found


def test_every_number_option_takes_the_digits_0_to_9_only() -> None:
    kinds = (click.types.IntParamType, click.types.FloatParamType)
    numbers = [(path, p) for path, p in every_option() if isinstance(p.type, kinds)]
    assert numbers  # --concurrency, --limit, --rate, --port, ...
    loose = [f"{path} {p.name}" for path, p in numbers if not isinstance(p.type, WholeNumber | Decimal)]
    assert loose == []


def test_no_help_shows_a_range_of_none() -> None:
    """Before: `replay --help` and `quarantine park/unpark --help` showed `--rate FLOAT RANGE ... [x<=None]`."""
    shown = []
    for path, param in every_option():
        if isinstance(param, click.Option) and isinstance(param.type, Decimal | WholeNumber):
            record = param.get_help_record(click.Context(main, info_name="amqpjobs"))
            if record is not None and "None" in record[1]:
                shown.append(f"{path} {param.name}: {record[1]}")
    assert shown == []


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["consume", "examples.shop:app", "--concurrency", ARABIC_THREE, *URL], "'--concurrency' / '-c'"),
        (["consume", "examples.shop:app", "--metrics-port", "80" + FULL_WIDTH_FIVE, *URL], "'--metrics-port'"),
        (["replay", "work", "--rate", ARABIC_THREE, *URL], "'--rate'"),
        (["replay", "work", "--limit", ARABIC_THREE, *URL], "'--limit'"),
        (["quarantine", "show", "work", "--limit", ARABIC_THREE, *URL], "'--limit'"),
        (["schedule", "list", "examples.shop:app", "--count", FULL_WIDTH_FIVE], "'--count'"),
        (["console", "--port", ARABIC_THREE, *URL], "'--port'"),
    ],
    ids=["concurrency", "metrics-port", "rate", "replay-limit", "show-limit", "count", "console-port"],
)
def test_another_scripts_digits_are_refused_naming_the_option(args: list[str], option: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}" in result.output
    assert "in the digits 0-9" in result.output


def test_ascii_numbers_are_still_taken() -> None:
    assert WholeNumber(1, 256).convert(" 3 ", None, None) == 3
    assert Decimal().convert("2.5", None, None) == 2.5


def test_processes_in_another_scripts_digits_is_refused() -> None:
    assert process_count("2", 4) == 2
    with pytest.raises(ConfigurationError, match="give a positive number of processes"):
        process_count("\u0662", 4)  # ٢


def test_a_console_form_number_in_another_scripts_digits_is_refused() -> None:
    assert positive_number({"rate": "5"}, "rate", 100, "messages per second", "10") == 5
    with pytest.raises(FormError):
        positive_number({"rate": ARABIC_THREE}, "rate", 100, "messages per second", "10")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["replay", "work", "--rate", "-1s", *URL], "'-1s' is not a number: give one such as 50 or 0.5, no unit"),
        (["replay", "work", "--rate", "1s", *URL], "'1s' is not a number: give one such as 50 or 0.5, no unit"),
        (["quarantine", "purge", "work", "--rate", "fast", *URL], "'fast' is not a number"),
        (["consume", "m:app", "--concurrency", "2x"], "'2x' is not a whole number: give one such as 4, no unit"),
        (["consume", "m:app", "--concurrency", "2.5"], "'2.5' is not a whole number: give one such as 4, no unit"),
    ],
)
def test_a_number_with_a_unit_or_a_word_is_told_what_to_give(args: list[str], said: str) -> None:
    """Before: click's "'-1s' is not a valid float range" / "'2x' is not a valid integer range" (a fresh user)."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert said in result.output, result.output
    assert "valid float range" not in result.output
    assert "valid integer range" not in result.output
