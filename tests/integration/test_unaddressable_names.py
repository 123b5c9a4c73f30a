"""A legal RabbitMQ queue name the AMQP client (pamqp) refuses: a clear error, never a traceback or a bare 500.

RabbitMQ accepts any UTF-8 name up to 255 bytes; pamqp only accepts ``[a-zA-Z0-9-_.:@#,/+ ]``
in a queue name and raises ``ValueError("Invalid value for queue")`` before sending a frame.
Such a queue is made through the management API, as an operator's other tools could.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from amqpjobs.console.app import create_app
from amqpjobs.console.config import ConsoleConfig
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

ODD = "café(1).quarantine"


def make_odd_queue(broker: BrokerSettings) -> None:
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/queues/{quote(broker.vhost, safe='')}/{quote(ODD, safe='')}", json={"durable": True})
        mgmt.request("PUT", f"/queues/{quote(broker.vhost, safe='')}/ok.quarantine", json={"durable": True})


def test_quarantine_list_names_the_queue_the_client_cannot_address(broker: BrokerSettings):
    make_odd_queue(broker)
    one = cli(broker, "quarantine", "list", ODD)
    every = cli(broker, "quarantine", "list", "--all")
    for result in (one, every):
        assert isinstance(result.exception, SystemExit), result.output  # an exit code, not a crash
        assert "Traceback" not in result.output
        assert f"queue {ODD!r} can't be addressed by the AMQP client" in result.output, result.output
        assert "rename it" in result.output
    assert one.exit_code == 2
    assert every.exit_code == 2
    assert "ok.quarantine: 0 message(s)" in every.output  # the others are still listed


def test_status_and_the_console_overview_report_it_as_a_problem(broker: BrokerSettings, tmp_path: Path):
    make_odd_queue(broker)
    status = cli(broker, "status", "--queues", "café(1),ok")
    assert isinstance(status.exception, SystemExit) or status.exception is None, status.output
    assert f"UNHEALTHY café(1): queue {ODD!r} can't be addressed by the AMQP client" in status.output, status.output
    config = ConsoleConfig(broker, audit_path=tmp_path / "audit.jsonl")
    with TestClient(create_app(config, csrf_token="t" * 24), base_url="http://127.0.0.1:8480") as c:
        page = c.get("/")
        group = c.get("/quarantine", params={"queue": ODD})
    assert page.status_code == 200, page.text
    assert "can&#39;t be addressed by the AMQP client" in page.text, page.text
    assert "café(1)" in page.text
    assert "ok.quarantine" in page.text
    assert group.status_code == 404, group.text  # as any queue it cannot read
    assert "can&#39;t be addressed by the AMQP client" in group.text


def test_the_overview_shows_a_question_mark_not_0_for_a_queue_it_cannot_read(broker: BrokerSettings, tmp_path: Path):
    make_odd_queue(broker)
    config = ConsoleConfig(broker, audit_path=tmp_path / "audit.jsonl")
    with TestClient(create_app(config, csrf_token="t" * 24), base_url="http://127.0.0.1:8480") as c:
        page = c.get("/fragments/overview")
    assert page.status_code == 200, page.text
    row = re.search(r'<tr [^>]*data-job-queue="café\(1\)">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    cell = re.search(r'<td class="quarantine"[^>]*>(.*?)</td>', row.group(1), re.S)
    assert cell is not None, row.group(1)
    assert cell.group(1) == "?"  # unknown, not 0 (and no link to a page that can't read it)
    ok = re.search(r'<tr [^>]*data-job-queue="ok">.*?<td class="quarantine"[^>]*>(.*?)</td>', page.text, re.S)
    assert ok is not None
    assert ">0</a>" in ok.group(1)
