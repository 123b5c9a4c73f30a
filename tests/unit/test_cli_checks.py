"""CLI refusals that happen before any connection (exit 2), and the commands that need no broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import TOPOLOGY, cli

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")  # nothing listens: a refusal must come first


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["status", "--queues", "work", "--max-age", "old"], "--max-age: 'old' is not a duration"),
        (["status", "--queues", " , "], "--queues is empty: give job queue names, or a topology PATH"),
        (["quarantine", "list"], "give a quarantine QUEUE or --all"),
        (["quarantine", "show", "work", "--job", " "], "--job is empty: give a value or leave it out"),
        (["quarantine", "show", "work", "--error-type", ""], "--error-type is empty"),
        (["replay", "work", "--reason", ""], "--reason is empty"),
    ],
)
def test_refused_before_connecting(args: list[str], words: str):
    result = cli(NOWHERE, *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr


def test_status_without_a_topology_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    result = cli(NOWHERE, "status")
    assert result.exit_code == 2
    assert "give a topology PATH or --queues (no ./topology here)" in result.stderr


def test_export_writes_the_file_it_names(tmp_path: Path):
    out = tmp_path / "defs.json"
    result = cli(NOWHERE, "topology", "export", str(TOPOLOGY), "--vhost", "shop", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr
    doc = json.loads(out.read_text())
    assert {q["vhost"] for q in doc["queues"]} == {"shop"}
    assert "urgent.quarantine" in {q["name"] for q in doc["queues"]}


def test_schedule_list_of_an_app_without_schedules():
    result = cli(NOWHERE, "schedule", "list", "tests.integration.procapp:app")
    assert result.exit_code == 0, result.output
    assert result.output == "app 'procapp' has no schedules\n"


@pytest.mark.parametrize(
    "management_url", ["ftp://127.0.0.1:15682", "not a url", "http://", "http://127.0.0.1:port", "//h:1"]
)
def test_a_management_url_that_is_no_http_url_is_a_usage_error(management_url: str) -> None:
    """Exit 2 naming the value and the form it must have, not 3 ('unreachable'): nothing was asked of a broker."""
    url = "amqp://guest:pw-sekret@127.0.0.1:1/"
    result = cli(broker_settings(url, "http://127.0.0.1:1"), "status", "--management-url", management_url)
    assert result.exit_code == 2, result.output
    assert "is not an http(s) URL" in result.output  # named as far as it is safe (a password may be in it)
    assert "http://host:15672 or https://host:15671" in result.output
    assert "pw-sekret" not in result.output


@pytest.mark.parametrize(("left", "limit"), [(30.0, 10.0), (10.0, 10.0), (3.0, 3.0), (0.5, 2.0), (-1.0, 2.0)])
def test_a_connect_attempt_takes_what_is_left_between_2_and_10_seconds(left: float, limit: float) -> None:
    from amqpjobs.wire.rotation import attempt_timeout

    assert attempt_timeout(left) == limit
