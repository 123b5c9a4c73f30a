"""Issue 21 review (tired-operator findings), the parts that need no broker."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.cli.next_steps import after_replay, command
from amqpjobs.runtime.status import layout_from_names
from amqpjobs.topology.naming import parse_queue_name


@pytest.mark.parametrize("name", ["mail.retry.5s.bak", "mail.retry.1s.shard-0", "mail.retry.fast", "mail.retry.05s"])
def test_only_names_we_would_create_parse_as_tiers(name: str) -> None:
    parsed = parse_queue_name(name)
    assert parsed.kind != "tier"
    assert parsed.job_queue != "mail"


def test_a_real_tier_and_a_shards_tier_still_parse() -> None:
    assert parse_queue_name("mail.retry.5s").tier == "5s"
    tier = parse_queue_name("mail.shard-2.retry.250ms")
    assert (tier.kind, tier.job_queue, tier.work_queue, tier.shard, tier.tier) == (
        "tier",
        "mail",
        "mail.shard-2",
        2,
        "250ms",
    )


def test_a_stray_shard_does_not_hide_the_real_work_queue() -> None:
    works, _, _ = layout_from_names("mail", ["mail", "mail.quarantine", "mail.retry.5s", "mail.shard-1"])
    assert "mail" in works


def test_suggested_commands_quote_for_the_shell_and_paste_back_to_the_same_argument() -> None:
    assert command("replay", "work", "--job", "it's") == "amqpjobs replay work --job 'it'\"'\"'s'"
    line = command("quarantine", "show", "work", "--job", "a\nb\x1bc")
    assert "\n" not in line
    assert "\x1b" not in line
    assert line.endswith("--job $'a\\nb\\x1bc'")
    echoed = subprocess.run(["bash", "-c", "printf %s " + line.split(" ", 5)[5]], capture_output=True).stdout
    assert echoed == b"a\nb\x1bc"  # bash reads it back to the very same value
    assert shlex.split(command("status", "plain name")) == ["amqpjobs", "status", "plain name"]


def test_canary_timeout_without_canary_is_refused() -> None:
    result = CliRunner().invoke(main, ["replay", "work", "--canary-timeout", "5s"], env={"AMQPJOBS_URL": "amqp://x:1/"})
    assert result.exit_code == 2, result.output
    assert "--canary-timeout needs --canary" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "work", "--to", "a\x01b"],
        ["replay", "work", "--to", "é" * 200],
        ["quarantine", "list", "bad\nname"],
        ["quarantine", "show", "x" * 300],
        ["quarantine", "park", "bad\x00", "--yes"],
        ["quarantine", "purge", "bad\x7f", "--yes"],
        ["replay", "bad\tq"],
        ["status", "--queues", "ok,bad\x02"],
    ],
)
def test_queue_names_amqp_forbids_are_refused_before_any_connect(args: list[str]) -> None:
    result = CliRunner().invoke(main, args, env={"AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/"})
    assert result.exit_code == 2, result.output
    assert "queue name" in result.output
    assert "Traceback" not in result.output


def test_verbose_is_accepted_after_the_subcommand() -> None:
    result = CliRunner().invoke(main, ["consume", "-v", "no_such_module_xyz:app"])
    assert "No such option" not in result.output
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize("text", ["plain-job", "it's", "évil\n2026\x1b[2J", "x\u2028y", "\x85z"])
def test_a_suggested_filter_pastes_back_exactly_under_any_locale(text: str) -> None:
    from amqpjobs.printable import shell_quote

    quoted = shell_quote(text)
    for lang in ("C", "C.UTF-8"):  # bash turns \uHHHH into a character only under a UTF-8 locale
        out = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, env={"LANG": lang}, check=True)
        assert out.stdout.decode("utf-8", "surrogateescape") == text


def test_a_finished_replay_names_the_queue_it_replayed_from() -> None:
    assert after_replay("work.quarantine", 0) == "next: amqpjobs status (the quarantine is empty)"
    assert after_replay("work.parked", 0) == (
        "next: amqpjobs status (parked queue work.parked is empty; a replayed job that fails again goes to quarantine)"
    )
    assert after_replay("work.parked", 3) == "next: amqpjobs quarantine list work.parked (3 still there)"
