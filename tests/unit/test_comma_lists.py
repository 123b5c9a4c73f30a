"""Every comma-separated CLI option refuses an empty item (a leading, trailing or doubled comma), naming the option.

Before: ``schedule run --schedules 'fast,'``, ``consume --queues 'urgent,,billing'``, ``status
--queues 'work,'`` and ``--url 'amqp://a/,'`` (or ``$AMQPJOBS_URL``, ``App(url=)``) dropped the
empty item without a word, so a name lost to a typo (``fast,,nightly`` meant three schedules?)
ran what was left. ``" , "`` (no name at all) keeps its own error (test_cli_papercuts,
test_cli_checks, test_consume_refusals).
No broker: every refusal comes before a connect (the URL points at port 1).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import cli

pytestmark = pytest.mark.version_independent

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")

#: (command and option up to the value, the option, a good example, what an item is)
OPTIONS = [
    (["consume", "examples.shop:app", "--connect-timeout", "1s", "--queues"], "--queues", "mail,billing", "name"),
    (["schedule", "run", "tests.unit.test_cron:listed", "--connect-timeout", "1s", "--schedules"], "--schedules",
     "fast,paris-daily", "name"),
    (["status", "--queues"], "--queues", "mail,billing", "name"),
]  # fmt: skip
VALUES = ["urgent,", ",urgent", "urgent,,billing", "urgent, ,billing", "urgent,billing, "]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(("args", "option", "example", "item"), OPTIONS, ids=["consume", "schedule-run", "status"])
def test_an_empty_item_in_a_comma_list_is_refused_naming_the_option(
    args: list[str], option: str, example: str, item: str, value: str
) -> None:
    result = cli(NOWHERE, *args, value)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: {option} {value!r} has an empty {item} (a comma with nothing but spaces before or after it): "
        f"separate the {item}s with single commas, e.g. {option} {example}\n"
    )


URL_LIST = (
    "the broker URL list (--url, $AMQPJOBS_URL or App(url=...)) has an empty URL (a comma with nothing but spaces "
    "before or after it): separate the nodes' URLs with single commas, e.g. amqp://node1:5672/jobs,"
    "amqp://node2:5672/jobs"
)


@pytest.mark.parametrize("value", ["amqp://guest:secret@127.0.0.1:1/,", "amqp://guest:secret@127.0.0.1:1/,,amqp://b/"])
@pytest.mark.parametrize("given", ["--url", "env"])
def test_an_empty_url_in_the_url_list_is_refused_without_printing_the_password(value: str, given: str) -> None:
    args, env = (["--url", value], {}) if given == "--url" else ([], {"AMQPJOBS_URL": value})
    result = CliRunner().invoke(main, ["status", "--queues", "work", *args], env=env)
    assert result.exit_code == 2, result.output
    assert "secret" not in result.output
    assert result.stderr == f"error: {URL_LIST}\n"


def test_an_app_given_an_empty_url_in_its_list_is_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:
        broker_settings("amqp://guest:secret@127.0.0.1:1/, ,amqp://guest:secret@127.0.0.2:1/")
    assert str(caught.value) == URL_LIST
