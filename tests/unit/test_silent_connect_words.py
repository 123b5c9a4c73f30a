"""A one-shot command whose broker takes the TCP connection and never answers says how to wait longer.

Session 48: a live node busy with other work answered the AMQP handshake after the one-shot
commands' 5 s (``--connect-timeout``), and the command said only "unreachable after 5s:
TimeoutError: no answer within 5s", as if the node were down.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from tests.silent_port import silent_port

pytestmark = pytest.mark.version_independent


def test_a_node_that_takes_the_connection_and_never_answers_is_said_with_the_longer_wait_to_give() -> None:
    with silent_port() as (port, _):
        result = CliRunner().invoke(
            main, ["quarantine", "list", "work", "--connect-timeout", "1s", "--url",
                   f"amqp://guest:s3cr3tpw@127.0.0.1:{port}/", "--management-url", "http://127.0.0.1:1/"],
        )  # fmt: skip
    assert result.exit_code == 3, result.output
    said = result.stderr
    assert f"broker at amqp://guest:***@127.0.0.1:{port}/ unreachable after 1s" in said, said
    assert "TimeoutError: no answer within 2s" in said  # an attempt gets 2 s at least (ATTEMPT_FLOOR)
    assert (
        "a node that is up but busy may answer later: give a longer connect timeout "
        "(--connect-timeout 30s, or AMQPJOBS_CONNECT_TIMEOUT=30s)"
    ) in said, said
    assert "s3cr3tpw" not in result.output


def test_a_refused_port_gets_no_such_hint() -> None:
    result = CliRunner().invoke(
        main, ["quarantine", "list", "work", "--connect-timeout", "1s", "--url", "amqp://guest:guest@127.0.0.1:1/"]
    )
    assert result.exit_code == 3, result.output
    assert "unreachable after 1s" in result.stderr, result.stderr
    assert "busy" not in result.stderr
