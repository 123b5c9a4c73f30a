"""Every duration a user gives the library is refused with a ConfigurationError naming it (never a bare ValueError)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from amqpjobs import App, Breaker, FilePayloadStore
from amqpjobs.cli import main
from amqpjobs.durations import DurationTooLongError, parse_duration
from amqpjobs.errors import ConfigurationError, TopologyValidationError
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.runtime.results_postgres import PostgresResults
from amqpjobs.topology.loader import load_topology
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


# ---------------------------------------------------------------- a duration beyond a float (flow control review)
HUGE = 10**400  # an int float() can't take: OverflowError, not a ValueError


@pytest.mark.parametrize(
    "value", [HUGE, "1" * 400 + "s", "9" * 400, "1" * 320 + "d"], ids=["int", "seconds", "digits", "days"]
)
def test_a_duration_beyond_a_float_is_too_long_never_an_overflow_traceback(value: object) -> None:
    with pytest.raises(DurationTooLongError) as caught:
        parse_duration(value)  # type: ignore[arg-type]
    assert "is longer than 100 years (36500d), the longest duration taken" in str(caught.value)
    assert len(str(caught.value)) < 600  # the value is not written out digit by digit


FLOW_CASES: list[tuple[str, Callable[[Path], object]]] = [
    ("App(blocked_timeout=...)", lambda tmp: _app(tmp, blocked_timeout=HUGE)),
    ("App(queue_full_wait=...)", lambda tmp: _app(tmp, queue_full_wait=HUGE)),
    ("payload store 'file': grace", lambda tmp: FilePayloadStore(tmp, grace=HUGE)),
    ("Breaker(window=", lambda tmp: Breaker(window=HUGE)),
]


@pytest.mark.parametrize(("argument", "make"), FLOW_CASES, ids=[c[0] for c in FLOW_CASES])
def test_flow_control_settings_beyond_a_float_are_configuration_errors(
    tmp_path: Path, argument: str, make: Callable[[Path], object]
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make(tmp_path)
    assert str(caught.value).startswith(argument), str(caught.value)


def test_a_topology_max_age_beyond_a_float_is_a_validation_problem(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        f'[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\nmax_age = {HUGE}\n'
    )
    with pytest.raises(TopologyValidationError) as caught:
        load_topology(path)
    assert "max_age" in str(caught.value)
    assert "longer than 100 years" in str(caught.value)


@pytest.mark.parametrize("text", ["\u0661s", "\uff15m", "\uff11", "1.\u0665s", "\u0661\u0660"])
def test_a_duration_is_written_with_ascii_digits(text: str) -> None:
    """Was: '١s' and '５m' were 1 s and 5 min (regex \\d and float() take any Unicode digit) (helper-177)."""
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
    done = CliRunner().invoke(main, ["status", "--connect-timeout", text, "nowhere"])
    assert done.exit_code == 2, done.output
    assert "is not a duration" in done.output


def test_a_postgres_dsn_port_in_other_digits_is_refused_before_connecting() -> None:
    from amqpjobs.runtime.pg_connection import dsn_problem

    assert dsn_problem("postgresql://u@127.0.0.1:\u0665432/db") is not None
    assert dsn_problem("host=127.0.0.1 port=\uff15\uff14\uff13\uff12 dbname=db") == "names a port that is not a number"
    assert dsn_problem("host=127.0.0.1 port=5432 dbname=db") is None


def test_the_connect_timeout_comes_from_its_variable_when_the_option_is_not_given(tmp_path: Path) -> None:
    """``AMQPJOBS_CONNECT_TIMEOUT`` sets ``--connect-timeout`` once for every command; the option still wins."""
    closed = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1: each connect is refused at once
    env = {"AMQPJOBS_URL": closed, "AMQPJOBS_MANAGEMENT_URL": "http://127.0.0.1:1", "AMQPJOBS_CONNECT_TIMEOUT": "1s"}
    done = CliRunner().invoke(main, ["quarantine", "list", "work.quarantine"], env=env)
    assert done.exit_code == 3, done.output
    assert "after 1s" in done.output, done.output
    given = CliRunner().invoke(main, ["quarantine", "list", "work.quarantine", "--connect-timeout", "2s"], env=env)
    assert "after 2s" in given.output, given.output
    bad = CliRunner().invoke(
        main, ["quarantine", "list", "work.quarantine"], env={**env, "AMQPJOBS_CONNECT_TIMEOUT": "soon"}
    )
    assert bad.exit_code == 2, bad.output
    assert "(env var: 'AMQPJOBS_CONNECT_TIMEOUT'): 'soon' is not a duration" in bad.output


@pytest.mark.parametrize("text", ["6M", "1M", "1h30M", "2d1M"])
def test_an_upper_case_m_is_refused_as_ambiguous(tmp_path: Path, text: str) -> None:
    """helper-194: '6M' was read as 6 minutes (parse_duration('6M') == 360.0); systemd.time and ISO 8601
    (P6M) read it as 6 months, so PostgresResults(retention='6M') kept results 6 minutes."""
    with pytest.raises(ValueError, match="is ambiguous") as caught:
        parse_duration(text)
    assert str(caught.value) == (
        f"{text!r} is ambiguous: an upper-case 'M' is a month in systemd and ISO 8601 (P6M), not a minute; "
        "write minutes as 'm' ('30m') and months as days ('180d')"
    )
    with pytest.raises(ConfigurationError, match=r"^SqliteResults\(retention=\.\.\.\): .* is ambiguous"):
        SqliteResults(tmp_path / "r.db", retention=text)
    assert (parse_duration("5m"), parse_duration("5MS"), parse_duration("1H"), parse_duration("2D")) == (
        300.0,
        0.005,
        3600.0,
        172800.0,
    )
