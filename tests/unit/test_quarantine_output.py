"""What ``quarantine show --json`` / ``export`` write: strict JSON, UTF-8 that encodes (a lone surrogate as ``?``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from amqpjobs.console.views import payload_view
from amqpjobs.jobs.quarantine import QuarantinedJob
from amqpjobs.printable import json_text, logfmt_value, printable, printable_block, printable_lines
from amqpjobs.runtime.quarantine import QuarantinedMessage
from amqpjobs.wire.delivery import Delivery


def _message(body: bytes, headers: dict[str, Any] | None = None) -> QuarantinedMessage:
    delivery = Delivery(
        body, headers or {}, "application/json", None, "m-1", "echo", None, 0, None, None, None, True,
        "jobs", "work", "work.quarantine", 1, cast(Any, None),
    )  # fmt: skip
    when = datetime(2026, 12, 1, tzinfo=UTC)
    item = QuarantinedJob("echo", "m-1", "undecodable", "DecodeError", "bad", 0, when, when, "work", 0, False)
    return QuarantinedMessage(delivery, item)


def _strict(text: str) -> Any:
    """``text`` parsed as strict JSON (NaN, Infinity refused)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("body", [b'{"n": NaN}', b'{"n": -Infinity}', b'{"n": 1e400}', b'{"l": [1, -1e99999]}'])
def test_a_payload_that_is_not_strict_json_is_shown_as_its_text(body: bytes) -> None:
    doc = _strict(json_text(_message(body).to_json()))
    assert doc["payload"] is None
    assert doc["payload_text"] == body.decode()
    assert doc["body_b64"]


def test_a_strict_payload_has_no_payload_text() -> None:
    doc = _strict(json_text(_message(b'{"n": 1.5}').to_json()))
    assert doc["payload"] == {"n": 1.5}
    assert "payload_text" not in doc


def test_a_lone_surrogate_is_written_as_a_question_mark() -> None:
    text = json_text(_message(b'{"msg": "bad \\ud800 end", "\\udc00k": 1}').to_json())
    text.encode("utf-8")  # encodes: no lone surrogate left
    assert _strict(text)["payload"] == {"msg": "bad ? end", "?k": 1}
    assert printable("bad \ud800 end\n") == "bad ? end\\n"


def test_json_text_writes_a_non_finite_header_float_as_text() -> None:
    assert json_text({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5}) == (
        '{"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 1.5}'
    )
    assert json_text({"x": "\u2028\x9b"}) == '{"x": "\\u2028\\u009b"}'  # still terminal-safe (json_safe)


def test_every_printable_form_writes_a_lone_surrogate_as_a_question_mark() -> None:
    assert printable_lines("a\ud800") == "a?"
    assert logfmt_value("a\ud800") == "a?"
    assert printable_block("x\udc00\ny") == "    x?\n    y"


def test_the_console_shows_a_lone_surrogate_in_a_payload_as_a_question_mark() -> None:
    assert payload_view(b'{"msg": "bad \\ud800 end"}') == ("JSON: 25 bytes", '{\n  "msg": "bad ? end"\n}', "")
