"""The console refuses a blank basic-auth password and an --allowed-host that is no host name (exit 2, named)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.console import app as console_app
from amqpjobs.console.config import PASSWORD_ENV, USER_ENV, ConsoleConfig, credentials_from_env
from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.settings import broker_settings

pytestmark = pytest.mark.version_independent

BROKER = broker_settings("amqp://guest:guest@127.0.0.1:1/", "http://guest:guest@127.0.0.1:2")


@pytest.mark.parametrize("password", ["", " ", "\t\n", "sekret\n", " sekret"])
def test_a_blank_or_padded_password_is_refused_naming_it(password: str) -> None:
    with pytest.raises(ConfigurationError, match=PASSWORD_ENV) as caught:
        credentials_from_env({USER_ENV: "ops", PASSWORD_ENV: password})
    assert "sekret" not in str(caught.value)


def test_a_password_set_alone_and_blank_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=PASSWORD_ENV):
        credentials_from_env({PASSWORD_ENV: ""})


def test_a_good_password_is_taken() -> None:
    assert credentials_from_env({USER_ENV: "ops", PASSWORD_ENV: "two words"}).required


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("https://jobs.example.com", "scheme"),
        ("jobs.example.com/console", "path"),
        ("jobs.example.com:8443", "port"),
    ],
)
def test_an_allowed_host_that_is_no_host_name_is_refused(tmp_path: Path, host: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match="--allowed-host") as caught:
        ConsoleConfig(BROKER, audit_path=tmp_path / "a.jsonl", allowed_hosts=("ok.example.com", host))
    assert why in str(caught.value)


@pytest.mark.parametrize("host", ["jobs.example.com", "JOBS.example.com", "10.0.0.5", "[2001:db8::1]", "2001:db8::1"])
def test_an_allowed_host_name_or_address_is_taken(tmp_path: Path, host: str) -> None:
    config = ConsoleConfig(BROKER, audit_path=tmp_path / "a.jsonl", allowed_hosts=(host,))
    assert host.strip("[]").lower() in config.host_names()


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--allowed-host", "https://jobs.example.com"], {}, "--allowed-host"),
        ([], {USER_ENV: "ops", PASSWORD_ENV: "   "}, PASSWORD_ENV),
    ],
)
def test_the_cli_exits_2_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    served: list[object] = []
    monkeypatch.setattr(console_app, "serve", lambda config, listening: served.append(config))
    cmd = ["console", "--port", "0", "--audit-log", str(tmp_path / "a.jsonl"), *args]
    result = CliRunner().invoke(main, cmd, env={"AMQPJOBS_URL": "amqp://x:1/", **env})
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert served == []
