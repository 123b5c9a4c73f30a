"""Issue 26 review, item 9: the message page shows every AMQP property, caps the payload it shows, and
never writes a control character of a message raw into the HTML (binary bodies as a hex dump)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import Handler, client, quarantine_six

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture
def quarantined(broker: BrokerSettings, tmp_path: Path) -> Handler:
    """The topology, and 6 real failures in work.quarantine (:func:`~tests.integration.console_env.quarantine_six`)."""
    return quarantine_six(broker, tmp_path)


#: What a hostile publisher puts in text: an escape sequence (repaints a terminal), a right-to-left
#: override (makes text read backwards), a NUL, a C1 CSI and a line separator.
NASTY = "red\x1b[31m rtl\u202egnp.exe nul\x00 csi\x9b2J ls\u2028end"


def publish(broker: BrokerSettings, body: bytes, properties: dict[str, Any]) -> None:
    """Publish to work.quarantine through the management API (every property as given, none added)."""
    doc = {"properties": properties, "routing_key": "work.quarantine",
           "payload": base64.b64encode(body).decode(), "payload_encoding": "base64"}  # fmt: skip
    with ManagementClient(broker) as mgmt:
        answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/amq.default/publish", json=doc)
    assert answer == {"routed": True}


def row(page: str, name: str) -> str:
    found = re.search(rf"<tr><th>{re.escape(name)}</th><td>(.*?)</td></tr>", page, re.S)
    assert found is not None, f"no row {name!r}"
    return found.group(1)


def test_every_property_a_capped_payload_and_no_raw_control_character(broker, tmp_path: Path, quarantined):
    body = ("first line\n" + NASTY + "\n" + "x" * 70_000).encode()
    properties = {
        "content_type": "text/plain", "content_encoding": "identity", "delivery_mode": 2, "priority": 3,
        "correlation_id": "corr-7", "reply_to": "replies", "expiration": "600000", "message_id": "big-1",
        "timestamp": 1_796_000_000, "type": "billing.mail", "user_id": "guest", "app_id": "billing",
        "headers": {"x-note": NASTY, "x-count": 3},
    }  # fmt: skip
    publish(broker, body, properties)
    with client(broker, tmp_path) as c:
        page = c.get("/message", params={"queue": "work.quarantine", "id": "big-1"})
        assert c.app.state.console.templates.env.autoescape is True  # type: ignore[attr-defined]
    assert page.status_code == 200, page.text
    text = page.text
    expected = {
        "content_type": "text/plain", "content_encoding": "identity", "delivery_mode": "2 (persistent)",
        "priority": "3", "correlation_id": "corr-7", "reply_to": "replies", "expiration": "600000 ms",
        "message_id": "big-1", "timestamp": "2026-11-30T00:53:20.000Z (1796000000)", "type": "billing.mail",
        "user_id": "guest", "app_id": "billing", "cluster_id": "-", "headers": "2 header(s), below",
        "exchange": "(default)", "routing_key": "work.quarantine", "redelivered": "False",
    }  # fmt: skip
    assert {name: row(text, name) for name in expected} == expected
    shown = re.search(r'<pre class="payload" id="payload">(.*?)</pre>', text, re.S)
    assert shown is not None
    assert len(shown.group(1).encode()) <= 64 * 1024 + 200  # the cap, plus what escaping adds
    assert re.search(r'id="payload-note">truncated: [\d,]+ bytes in all, the first 65,536 shown<', text), text[:3000]
    assert f"{len(body):,} bytes in all" in text
    assert shown.group(1).startswith("first line\nred\\x1b[31m rtl\\u202egnp.exe nul\\x00 csi\\x9b2J ls\\u2028end\n")
    for raw in ("\x1b", "\u202e", "\x00", "\x9b", "\u2028"):  # in the payload, the header, the evidence ...
        assert raw not in text, repr(raw)
    assert "red\\x1b[31m" in row(text, "x-note")


def test_a_binary_payload_is_a_hex_dump(broker: BrokerSettings, tmp_path: Path, quarantined):
    publish(broker, bytes(range(256)) * 2, {"message_id": "bin-1"})
    with client(broker, tmp_path) as c:
        page = c.get("/message", params={"queue": "work.quarantine", "id": "bin-1"})
    assert page.status_code == 200
    shown = re.search(r'<pre class="payload hex" id="payload">(.*?)</pre>', page.text, re.S)
    assert shown is not None, page.text
    lines = shown.group(1).split("\n")
    assert len(lines) == 32  # 512 bytes, 16 a line
    assert lines[0] == "00000000  00 01 02 03 04 05 06 07  08 09 0a 0b 0c 0d 0e 0f  |................|"
    assert lines[4] == "00000040  40 41 42 43 44 45 46 47  48 49 4a 4b 4c 4d 4e 4f  |@ABCDEFGHIJKLMNO|"
    assert lines[3] == "00000030  30 31 32 33 34 35 36 37  38 39 3a 3b 3c 3d 3e 3f  |0123456789:;&lt;=&gt;?|"
    assert "binary (not UTF-8): 512 bytes, as a hex dump" in page.text


def test_evidence_that_is_no_text_is_said_by_its_amqp_type_never_a_python_repr(broker, tmp_path: Path, quarantined):
    """helper-207: a table error type read ``{'a': 1}`` (Python's repr) on the console's pages."""
    headers = {"amqpjobs-reason": "exhausted", "amqpjobs-job": ["x"], "amqpjobs-error-type": {"a": 1},
               "amqpjobs-error-message": True}  # fmt: skip
    publish(broker, b"{}", {"message_id": "odd-types-1", "type": "mail", "headers": headers})
    with client(broker, tmp_path) as c:
        listing = c.get("/quarantine", params={"queue": "work.quarantine"})
        one = c.get("/message", params={"queue": "work.quarantine", "id": "odd-types-1"})
    assert listing.status_code == one.status_code == 200
    assert "<td>(a table)</td>" in listing.text
    assert row(one.text, "amqpjobs-error-type") in ("{&#34;a&#34;: 1}", "<code>{&#34;a&#34;: 1}</code>")  # as JSON
    assert row(one.text, "amqpjobs-job") in ("[&#34;x&#34;]", "<code>[&#34;x&#34;]</code>")
    for page in (listing.text, one.text):
        assert "{&#39;a&#39;: 1}" not in page
        assert "[&#39;x&#39;]" not in page
