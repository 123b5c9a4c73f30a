"""Every duration a user gives the library is refused with a ConfigurationError naming it (never a bare ValueError)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from amqpjobs import App
from amqpjobs.cli import main
from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.runtime.results_postgres import PostgresResults
from amqpjobs.topology.models import Topology

pytestmark = pytest.mark.version_independent

DSN = "postgresql://nobody@127.0.0.1:1/none"


def _app(tmp: Path, **kwargs: Any) -> App:
    return App("durations", topology=Topology(), **kwargs)


CASES: list[tuple[str, Callable[[Path], object]]] = [
    ("SqliteLedger(retention=...)", lambda tmp: SqliteLedger(tmp / "l.db", retention="soon")),
    ("PostgresLedger(retention=...)", lambda tmp: PostgresLedger(DSN, retention="-5s")),
    ("SqliteResults(retention=...)", lambda tmp: SqliteResults(tmp / "r.db", retention="forever")),
    ("PostgresResults(retention=...)", lambda tmp: PostgresResults(DSN, retention=0)),
    ("App(quarantine_retention=...)", lambda tmp: _app(tmp, quarantine_retention="a week")),
]


@pytest.mark.parametrize(("argument", "make"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_duration_names_the_argument_and_the_forms(
    tmp_path: Path, argument: str, make: Callable[[Path], object]
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make(tmp_path)
    message = str(caught.value)
    assert message.startswith(argument + ":"), message
    assert "'30s'" in message


async def test_result_timeout_and_poll_are_named(tmp_path: Path) -> None:
    app = _app(tmp_path, results=SqliteResults(tmp_path / "r.db"))
    with pytest.raises(ConfigurationError, match=r"^App\.result\(timeout=\.\.\.\): 'never'"):
        await app.result("some-id", timeout="never")
    with pytest.raises(ConfigurationError, match=r"^App\.result\(poll=\.\.\.\): -1"):
        await app.result("some-id", timeout="1s", poll=-1)


@pytest.mark.parametrize(("option", "value"), [("--grace", "later"), ("--consumer-timeout", "-3s")])
def test_consume_names_the_option_with_a_bad_duration(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["consume", "nowhere:app", option, value])
    assert result.exit_code == 2, result.output
    assert f"{option}: {value!r}" in result.output, result.output
    assert "Traceback" not in result.output
