"""The one line a CLI error prints: credentials redacted and control characters escaped; times named rightly.

No broker: every refusal here comes before a connect (nothing listens on port 1), or is raised by
a command made for the test.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
import pytest
from click.testing import CliRunner

from amqpjobs.cli._common import errors_to_exit_codes
from amqpjobs.errors import BrokerError, BusyError, ConfigurationError, PublishError, TopologyValidationError
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import cli

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")
#: Text a publisher, a queue name or a file can put into an error: a line feed that forges a line,
#: a terminal escape that clears the screen, a C1 CSI, a right-to-left override.
FORGING = "q-1\nerror: forged line\x1b[2J\x9b31m\u202e"
ESCAPED = "q-1\\nerror: forged line\\x1b[2J\\x9b31m\\u202e"


def _raising(exc: Exception) -> click.Command:
    @click.command()
    @errors_to_exit_codes
    def command() -> None:
        raise exc

    return command


@pytest.mark.parametrize(
    ("exc", "code", "prefix"),
    [
        (ConfigurationError(f"no queue {FORGING}"), 2, "error: "),
        (BrokerError(f"no queue {FORGING}"), 3, "broker error: "),
        (PublishError(f"job {FORGING} may or may not be stored"), 3, "broker error: "),
        (BusyError(f"queue {FORGING} is busy", "q", None), 4, "busy: "),
        (OSError(f"no such file {FORGING}"), 2, "error: "),
    ],
)
def test_an_error_prints_one_line_with_its_control_characters_escaped(exc: Exception, code: int, prefix: str):
    result = CliRunner().invoke(_raising(exc), [])
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert ESCAPED in result.stderr
    assert not {"\x1b", "\x9b", "\u202e"} & set(result.stderr)
    assert result.stderr.startswith(prefix)


def test_an_error_still_has_its_credentials_redacted_before_it_is_escaped():
    exc = BrokerError("cannot connect to amqp://guest:pw-sekret@127.0.0.1:1/\x1b[2J")
    result = CliRunner().invoke(_raising(exc), [])
    assert result.exit_code == 3
    assert "pw-sekret" not in result.stderr
    assert result.stderr == "broker error: cannot connect to amqp://guest:***@127.0.0.1:1/\\x1b[2J\n"


def test_an_invalid_topology_keeps_one_line_per_problem_and_escapes_what_is_in_them(tmp_path):
    from amqpjobs.errors import Problem

    exc = TopologyValidationError([Problem("t.toml", "job_queue[0].name", f"bad name {FORGING}", "rename it")])
    result = CliRunner().invoke(_raising(exc), [])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: invalid topology (1 problem(s)):"
    assert len(lines) == 2, result.stderr
    assert ESCAPED in lines[1]


@pytest.mark.parametrize("command", [("quarantine", "show", "work.quarantine"), ("replay", "work", "--dry-run")])
@pytest.mark.parametrize("value", ["0001-01-01T00:00+01:00", "0001-01-01T00:30:00+05:00"])
def test_a_since_whose_utc_falls_before_year_1_is_called_so_not_an_iso_time(command: tuple[str, ...], value: str):
    result = cli(NOWHERE, *command, "--since", value)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: --since {value!r} is an ISO-8601 time, but in UTC it falls before the year 1, earlier than any "
        "time this reads; give a later one\n"
    )


def test_a_since_that_is_no_time_is_still_called_so():
    result = cli(NOWHERE, "quarantine", "show", "work.quarantine", "--since", "yesterday")
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --since 'yesterday': give a duration ('2h', '30m') or an ISO-8601 time ('2026-11-29T08:00Z')\n"
    )


def test_schedule_list_after_a_time_whose_utc_falls_after_year_9999_is_called_so():
    result = cli(NOWHERE, "schedule", "list", "tests.unit.test_cron:listed", "--after", "9999-12-31T23:59-01:00")
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --after '9999-12-31T23:59-01:00' is an ISO-8601 time, but in UTC it falls after the year 9999, "
        "later than any time this reads; give an earlier one\n"
    )


def test_a_resource_alarm_that_blocks_publishers_is_the_brokers_side_exit_3():
    from amqpjobs.errors import BrokerBlockedError

    exc = BrokerBlockedError("replay of 'work.quarantine': the broker is blocking publishers", alarm="memory")
    result = CliRunner().invoke(_raising(exc), [])
    assert (result.exit_code, result.stderr) == (
        3,
        "broker error: replay of 'work.quarantine': the broker is blocking publishers\n",
    )


def test_the_warning_of_a_pause_whose_signal_was_not_sent_is_escaped_too(capsys: pytest.CaptureFixture[str]):
    from amqpjobs.cli.flow import _signalled
    from amqpjobs.errors import SignalNotSentError

    async def refused() -> None:
        raise SignalNotSentError(f"paused job queue work: flag set, but the signal could not be sent ({FORGING})",
                                 "work", True)  # fmt: skip

    with pytest.raises(SystemExit) as exited:
        _signalled(refused())
    assert exited.value.code == 5
    err = capsys.readouterr().err
    assert err == f"warning: paused job queue work: flag set, but the signal could not be sent ({ESCAPED})\n"


@pytest.mark.parametrize(
    "command",
    [
        ("quarantine", "show", "work.quarantine"),
        ("quarantine", "purge", "work.quarantine", "--yes"),
        ("quarantine", "park", "work.quarantine", "--yes"),
        ("quarantine", "unpark", "work.parked", "--yes"),
        ("replay", "work.quarantine", "--dry-run"),
    ],
)
@pytest.mark.parametrize("value", ["2999-01-01T00:00Z", "2999-01-01T01:00+01:00", "2999-01-01"])
def test_a_since_in_the_future_is_refused_before_the_broker(command: tuple[str, ...], value: str):
    # before: accepted, the whole queue read (here: exit 3, the connect to port 1 refused)
    result = cli(NOWHERE, *command, "--since", value)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --since {value!r} is 2999-01-01T00:00:00Z in UTC, later than now ("), (
        result.stderr
    )
    assert result.stderr.endswith(
        "): no failure is that recent, so it would select nothing; give a time at or before now, or a duration "
        "ago ('2h')\n"
    ), result.stderr


@pytest.mark.parametrize(
    ("value", "readings"),
    [
        ("1764493200", "56 years; as a Unix time it is 2025-11-30T09:00:00Z"),
        ("1764493200123", "55,913 years; as a Unix time it is 2025-11-30T09:00:00Z"),  # milliseconds
        (" 1000000000 ", "32 years; as a Unix time it is 2001-09-09T01:46:40Z"),
        ("99999999999999999999999", "3,168,808,781,402,895 years"),
    ],
)
def test_a_since_that_is_a_bare_number_of_31_years_or_more_is_refused_as_ambiguous(value: str, readings: str):
    # before: '1764493200' (date +%s) was read as 55.9 years ago, selecting every failure since 1971
    result = cli(NOWHERE, "replay", "work.quarantine", "--dry-run", "--since", value)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: --since {value!r} is a number without a unit: as seconds ago it reaches back {readings}; write a "
        "duration with its unit ('2h', '30d') or the time in ISO-8601 ('2026-11-29T08:00Z')\n"
    )


def test_a_since_that_is_a_short_bare_number_is_still_seconds_ago():
    from amqpjobs.cli._filters import selection

    chosen = selection(None, None, None, "3600")
    assert chosen.since is not None
    assert 3599 < (datetime.now(UTC) - chosen.since).total_seconds() < 3610


@pytest.mark.parametrize("command", [("quarantine", "purge", "work", "--yes"), ("replay", "work", "--dry-run")])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0s", "'0s' must be a positive, finite duration (e.g. '5s')"),
        ("0", "'0' must be a positive, finite duration (e.g. '5s')"),
        ("-1h", "'-1h' must be a positive, finite duration (e.g. '5s')"),
        (
            "6M",
            "'6M' is ambiguous: an upper-case 'M' is a month in systemd and ISO 8601 (P6M), not a minute; write "
            "minutes as 'm' ('30m') and months as days ('180d')",
        ),
        (
            "2h30",
            "'2h30' is not a duration; use forms like '250ms', '30s', '5m', '1h30m' (each unit once, largest first)",
        ),
    ],
)
def test_a_since_that_is_a_duration_refused_says_why_as_every_duration_option_does(
    command: tuple[str, ...], value: str, why: str
):
    # before: "error: --since '6M': give a duration ('2h', '30m') or an ISO-8601 time ('2026-11-29T08:00Z')": a
    # duration was asked of one who gave a duration, where --max-age 6M and --canary-timeout 6M say why
    result = cli(NOWHERE, *command, "--since", value)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: --since {why}; or give an ISO-8601 time ('2026-11-29T08:00Z')\n"


def test_a_broker_down_is_not_blamed_on_the_derived_management_url():
    """Nothing listens on the AMQP port nor on the API's derived one: the error says the broker is not there.

    Before: `broker error: management API at http://127.0.0.1:10001 (derived from the AMQP URL: its host, port +
    10000; give the right one with --management-url or $AMQPJOBS_MANAGEMENT_URL) unreachable: ConnectError: ...`:
    a user whose broker is down was sent to fix the management URL.
    """
    from amqpjobs.cli import main

    env = {"AMQPJOBS_URL": NOWHERE.url, "AMQPJOBS_MANAGEMENT_URL": "", "AMQPJOBS_CONNECT_TIMEOUT": "1s"}
    result = CliRunner().invoke(main, ["status", "--queues", "work"], env=env, catch_exceptions=False)
    assert result.exit_code == 3, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("broker error: management API at http://127.0.0.1:10001"), line
    assert line.endswith(
        "; the broker's AMQP port 127.0.0.1:1 refuses connections too: is the broker running there (or is the "
        "AMQP URL's host or port wrong)?"
    ), line
