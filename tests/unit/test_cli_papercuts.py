"""A fresh user's CLI papercuts (review of 2026-12-01): each refusal is exit 2, one line, says what to do.

None of these needs a broker: every refusal comes before a connect (nothing listens on port 1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.durations import DurationTooLongError, parse_duration
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import ROOT, TOPOLOGY, cli, cli_refused

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")


# ---------------------------------------------------------------- durations: one parser says "positive"
@pytest.mark.parametrize("value", ["-1s", "-1", " -5m", "-1h30m", "-250ms"])
def test_a_negative_duration_is_said_to_be_negative(value: str) -> None:
    with pytest.raises(ValueError, match="must be a positive") as caught:
        parse_duration(value)
    assert str(caught.value) == f"{value!r} must be a positive, finite duration (e.g. '5s')"


def test_a_negative_duration_option_says_it_must_be_positive() -> None:
    assert (
        cli_refused(NOWHERE, "status", "--queues", "work", "--max-age=-1s")
        == "error: --max-age: '-1s' must be a positive, finite duration (e.g. '5s')\n"
    )


# ---------------------------------------------------------------- ports: one rule for every URL option
@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_an_amqp_url_port_out_of_range_is_named(port: str) -> None:
    assert cli_refused(NOWHERE, "status", "--queues", "work", "--url", f"amqp://guest:pw-sekret@127.0.0.1:{port}/") == (
        f"error: bad broker URL amqp://guest:***@127.0.0.1:{port}/: port {port} is out of range; "
        "a port must be 1-65535\n"
    )


def test_a_port_out_of_range_in_a_list_names_the_item_and_never_a_password() -> None:
    url = "amqp://guest:pw-sekret@127.0.0.1:5682/,amqp://guest:pw-sekret@127.0.0.2:70000/"
    result = cli(NOWHERE, "status", "--queues", "work", "--url", url)
    assert result.exit_code == 2, result.output
    assert "bad broker URL 2 of 2 amqp://guest:***@127.0.0.2:70000/: port 70000 is out of range" in result.stderr
    assert "pw-sekret" not in result.output


@pytest.mark.parametrize("port", ["99999", "0"])
def test_a_management_url_port_out_of_range_is_named(port: str) -> None:
    assert cli_refused(NOWHERE, "status", "--queues", "work", "--management-url", f"http://127.0.0.1:{port}") == (
        f"error: management URL 'http://127.0.0.1:{port}': port {port} is out of range; a port must be 1-65535 "
        "(--management-url or AMQPJOBS_MANAGEMENT_URL)\n"
    )


def test_a_derived_management_port_out_of_range_asks_for_the_management_url() -> None:
    env = {"AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:60000/", "AMQPJOBS_MANAGEMENT_URL": None}
    result = CliRunner().invoke(main, ["status", "--queues", "work"], env=env, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: the management port can't be derived from broker URL amqp://guest:***@127.0.0.1:60000/: "
        "port 60000 + 10000 is out of range (a port must be 1-65535); give --management-url or "
        "AMQPJOBS_MANAGEMENT_URL\n"
    )


# ---------------------------------------------------------------- vhosts: control characters refused
@pytest.mark.parametrize("vhost", ["a\nb", "shop\x1b[31m", "\t"])
def test_export_refuses_a_vhost_with_control_characters(vhost: str) -> None:
    result = cli(NOWHERE, "topology", "export", str(TOPOLOGY), "--vhost", vhost)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    shown = repr(vhost).replace("\x1b", "\\x1b")
    assert result.stderr == f"error: --vhost: vhost {shown} has control characters; vhost names are printable text\n"


def test_a_url_vhost_with_control_characters_is_refused_before_connecting() -> None:
    assert cli_refused(NOWHERE, "status", "--queues", "work", "--url", "amqp://guest:guest@127.0.0.1:1/a%0Ab") == (
        "error: bad broker URL amqp://guest:***@127.0.0.1:1/a%0Ab: vhost 'a\\nb' has control characters; "
        "vhost names are printable text\n"
    )


# ---------------------------------------------------------------- lists as people write them
def test_listed_joins_names_with_commas() -> None:
    from amqpjobs.printable import listed

    assert listed(["urgent", "batch"]) == "batch, urgent"
    assert listed([]) == "none"
    assert listed(["a\nb"]) == "a\\nb"


def test_consume_an_unknown_queue_lists_the_known_ones_with_commas() -> None:
    assert cli_refused(NOWHERE, "consume", "tests.integration.procapp:app", "-q", "nosuchq") == (
        f"error: job queue 'nosuchq' is not in the topology (loaded from {TOPOLOGY}); known: batch, billing, urgent\n"
    )


# ---------------------------------------------------------------- output files
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["topology", "export", str(TOPOLOGY), "-o"], "-o/--output"),
        (["asyncapi", "examples.shop:app", "-o"], "-o/--output"),
        (["quarantine", "export", "urgent.quarantine"], "FILE"),
    ],
)
def test_an_output_file_in_a_missing_folder_is_named_with_what_to_do(
    tmp_path: Path, args: list[str], option: str
) -> None:
    target = tmp_path / "missing" / "x.json"
    result = cli(NOWHERE, *args, str(target))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: {option} {target}: folder {target.parent} does not exist; create it (mkdir -p {target.parent}) "
        "or give another path\n"
    )
    assert "Errno" not in result.output


def test_an_output_file_that_is_a_folder_is_named(tmp_path: Path) -> None:
    result = cli(NOWHERE, "topology", "export", str(TOPOLOGY), "-o", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "Errno" not in result.output
    assert result.stderr == f"error: -o/--output {tmp_path} is a folder; give the path of a file to write\n"


# ---------------------------------------------------------------- the demo: the URL's vhost counts
def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_the_demo_uses_the_vhost_of_its_url() -> None:
    proc = demo("--url", "amqp://guest:guest@127.0.0.1:1/shop-demo")  # nothing listens: it stops after step 1
    assert "[1/6] broker amqp://guest:***@127.0.0.1:1/shop-demo " in proc.stdout, proc.stdout + proc.stderr


def test_the_demo_refuses_a_url_vhost_and_another_vhost_option() -> None:
    proc = demo("--url", "amqp://guest:guest@127.0.0.1:1/shop-demo", "--vhost", "other")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.endswith(
        "demo.py: error: --vhost 'other' and the vhost of --url 'shop-demo' differ: give the vhost once\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--vhost", "/"],  # was taken: the demo deleted and re-created the default vhost, and all in it (helper-177)
        ["--url", "amqp://guest:guest@127.0.0.1:1/%2F"],
        ["--url", "amqp://guest:guest@127.0.0.1:1/%2F", "--vhost", "/"],
    ],
)
def test_the_demo_never_takes_the_default_vhost_whichever_way_it_is_named(args: list[str]) -> None:
    if "--url" not in args:
        args = [*args, "--url", "amqp://guest:guest@127.0.0.1:1"]  # nothing listens: had it gone on, step 1 ends it
    proc = demo(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[1/6]" not in proc.stdout
    assert proc.stderr.endswith(
        "demo.py: error: the vhost '/' is the broker's default: the demo deletes and re-creates its vhost, so it "
        "never uses '/'; give another (--vhost, or the URL's path), or leave both out (vhost amqpjobs-demo)\n"
    ), proc.stderr


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:99999/x@127.0.0.1/",  # an unencoded '/' in the password: '99999' is a piece of it
        "amqp://guest:99999,amqp://guest:pw@127.0.0.2/",  # a comma in the password cut it: '99999' is a piece
    ],
)
def test_digits_of_a_password_are_never_named_as_a_port(url: str) -> None:
    result = cli(NOWHERE, "status", "--queues", "work", "--url", url)
    assert result.exit_code == 2, result.output
    assert "99999" not in result.output
    assert "not a URL" in result.stderr


def test_an_out_of_range_port_without_credentials_is_shown_as_given() -> None:
    result = cli(NOWHERE, "status", "--queues", "work", "--url", "amqp://127.0.0.1:99999/")
    assert (
        result.stderr
        == "error: bad broker URL amqp://127.0.0.1:99999/: port 99999 is out of range; a port must be 1-65535\n"
    )


def test_digits_of_a_password_in_a_management_url_are_never_named_as_a_port() -> None:
    result = cli(NOWHERE, "status", "--queues", "work", "--management-url", "http://guest:99999/x@127.0.0.1:15672")
    assert result.exit_code == 2, result.output
    assert "99999" not in result.output
    assert "is not an http(s) URL" in result.stderr


# ---------------------------------------------------------------- review of 2026-12-01 (cron10): L1-L4, L9, L11
@pytest.mark.parametrize("value", ["100000000000000000000s", "99999999999999999999h", "36501d"])
def test_a_duration_beyond_a_hundred_years_is_refused_by_the_one_parser(value: str) -> None:
    with pytest.raises(DurationTooLongError) as caught:
        parse_duration(value)
    assert str(caught.value) == f"{value!r} is longer than 100 years (36500d), the longest duration taken"
    assert parse_duration("36500d") == 36500 * 86400.0


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (("replay", "work.quarantine", "--dry-run"), "100000000000000000000s"),
        (("quarantine", "park", "work.quarantine", "--yes"), "99999999999999999999h"),
        (("quarantine", "show", "work.quarantine"), "5000000d"),
    ],
)
def test_a_since_too_far_back_is_exit_2_with_the_duration_rule(command: tuple[str, ...], value: str) -> None:
    # review L1: an OverflowError traceback, exit 1
    assert cli_refused(NOWHERE, *command, "--since", value) == (
        f"error: --since {value!r}: {value!r} is longer than 100 years (36500d), the longest duration taken\n"
    )


def test_schedule_list_past_the_end_of_the_calendar_is_exit_2_in_one_line() -> None:
    # review L2: OverflowError: date value out of range
    assert cli_refused(NOWHERE, "schedule", "list", "tests.unit.test_cron:listed", "--after", "9999-12-31T23:59Z") == (
        "error: cron expression '* * * * * */20': no tick after 9999-12-31T23:59:40Z: the calendar ends at "
        "9999-12-31T23:59:59Z\n"
    )


def test_every_reason_the_quarantine_list_shows_is_a_reason_to_select() -> None:
    # review L3: --reason no-evidence was refused although `quarantine list` shows it
    from amqpjobs.cli._filters import selection

    for reason in ("no-evidence", "x-death:unknown", "x-death:expired", "exhausted"):
        assert selection(None, None, reason, None).reason == reason
    result = cli(NOWHERE, "quarantine", "show", "work.quarantine", "--reason", "no-evidenc")
    assert result.exit_code == 2, result.output
    assert "no-evidence" in result.stderr
    assert "x-death:unknown" in result.stderr


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("work.suspects", "suspects"),
        ("work.retry.5s", "tier"),
        ("work.quarantine", "quarantine"),
        ("work.parked", "parked"),
    ],
)
def test_replay_to_anything_but_a_work_queue_is_refused_before_any_warning(target: str, kind: str) -> None:
    # review L4 (a suspects queue was accepted) and L9 (the --app warning came before the refusal)
    assert cli_refused(NOWHERE, "replay", "work.quarantine", "--to", target) == (
        f"error: --to {target!r} is a {kind} queue: replay sends jobs back to a work queue (or leave --to out "
        "to send each to the queue it failed on)\n"
    )


@pytest.mark.parametrize("value", ["", " , "])
def test_schedule_run_refuses_an_empty_selection(value: str) -> None:
    # review L11: --schedules '' ran every schedule
    assert cli_refused(NOWHERE, "schedule", "run", "tests.unit.test_cron:listed", "--schedules", value) == (
        "error: --schedules names no schedule: give names separated by commas (the app has fast, paris-daily), "
        "or leave it out to run them all\n"
    )


# ---------------------------------------------------------------- an outsider's papercuts (2026-12-05)
def test_topology_export_to_dash_writes_stdout_not_a_file_named_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    result = cli(NOWHERE, "topology", "export", str(TOPOLOGY), "-o", "-")
    assert result.exit_code == 0, result.output
    assert '"queues"' in result.stdout
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("queues", ["", " , ", ","])
def test_consume_with_an_empty_queues_option_is_refused_not_every_queue(queues: str):
    assert cli_refused(NOWHERE, "consume", "examples.shop:app", "--queues", queues) == (
        "error: --queues names no job queue: give them comma-separated (e.g. --queues mail,billing), "
        "or leave the option out to consume every job queue the app's jobs use\n"
    )


def test_quarantine_export_to_dash_means_stdout_not_a_file_named_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # it was refused (the summary line went to stdout); now the summary goes to stderr (test_output_doors)
    monkeypatch.chdir(tmp_path)
    result = cli(NOWHERE, "quarantine", "export", "work.quarantine", "-")
    assert result.exit_code == 3, result.output  # it got as far as the broker
    assert not (tmp_path / "-").exists()


# ---------------------------------------------------------------- a file name the operator gave, echoed escaped
@pytest.mark.parametrize("command", [["topology", "export", str(TOPOLOGY)], ["asyncapi", "examples.shop:app"]])
def test_the_file_a_command_wrote_is_named_with_its_control_characters_escaped(
    tmp_path: Path, command: list[str]
) -> None:
    """A name holding an escape sequence or a line feed (a script's variable) must not repaint nor forge a line."""
    out = tmp_path / "defs\x1b[2J\n.json"
    result = CliRunner().invoke(main, [*command, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("{")
    assert result.stderr == f"wrote {tmp_path}/defs\\x1b[2J\\n.json\n"


# ---------------------------------------------------------------- a blank job id to look up (helper-172)
@pytest.mark.parametrize("value", ["", "  "])
def test_job_show_of_a_blank_id_asks_for_the_id_not_for_leaving_it_out(value: str) -> None:
    result = cli(NOWHERE, "job", "show", value)
    assert result.exit_code == 2, result.output
    assert "job_id is empty or blank; give the id of the job to look up" in result.stderr
    assert "leave it out" not in result.stderr


@pytest.mark.parametrize("value", ["", "  "])
async def test_job_status_of_a_blank_id_asks_for_the_id(value: str) -> None:
    from amqpjobs import App
    from amqpjobs.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as caught:
        await App("a").job_status(value)
    assert str(caught.value).startswith("job_id is empty or blank; give the id of the job to look up")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://guest:s3cr3tpw@127.0.0.1:notaport/", "bad broker URL amqp://guest:***@127.0.0.1:notaport/: port "
         "'notaport' is not a number; a port must be 1-65535"),
        ("amqp://127.0.0.1:56 72/", None),  # a blank: the run-together rule says it
        # no '@': what follows ':' may be a password (user:password, the host left out): never shown, both said
        ("amqp://h:5672x/", "bad broker URL <unparseable URL>: not a URL (a port must be a number 1-65535; a "
         "password's reserved characters must be %-encoded: # as %23, / as %2F, ? as %3F, , as %2C)"),
    ],
)  # fmt: skip
def test_a_port_that_is_no_number_is_named_not_blamed_on_the_password(url: str, said: str | None) -> None:
    """helper-229: a bad port after the '@' was told "a password's reserved characters must be %-encoded"."""
    result = cli(NOWHERE, "status", "--queues", "work", "--url", url)
    assert result.exit_code == 2, result.output
    assert "s3cr3tpw" not in result.output
    if said is not None:
        assert result.stderr == f"error: {said}\n"


@pytest.mark.parametrize(
    "url", ["amqp://guest:s3cr3tpw@[::1/", "amqp://guest:s3cr3tpw@[::1:5672/", "amqp://guest:s3[cr3tpw@h/"]
)
def test_an_unclosed_bracket_is_named_for_the_ipv6_host_and_the_password(url: str) -> None:
    """helper-229: an unclosed '[' got the generic "not a URL" hint about '#', '/', '?' and ','."""
    result = cli(NOWHERE, "status", "--queues", "work", "--url", url)
    assert result.exit_code == 2, result.output
    assert "s3cr3tpw" not in result.output
    assert "s3[cr" not in result.output
    assert "an IPv6 host takes both brackets ([::1])" in result.stderr, result.stderr
    assert "'[' or ']' in a password must be %-encoded (%5B, %5D)" in result.stderr, result.stderr
