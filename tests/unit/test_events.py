"""Outcome events: what the worker sends for an outcome, and what a reader makes of a body (no broker)."""

from __future__ import annotations

import dataclasses
import json

from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.events import MAX_ERROR, OutcomeEvent, decode_events, event_body, event_for, event_messages
from amqpjobs.jobs.outcome import Ack, Outcome, Quarantine, RetryLater
from amqpjobs.text import encodable
from amqpjobs.topology.naming import event_routing_key


def test_a_quarantined_outcome_becomes_an_event_with_its_reason_and_replay_id() -> None:
    outcome = Outcome(Quarantine("exhausted"), "mail", "j-1", 3, 0.1, True, queue="mail", error="E: " + "x" * 500)
    event = event_for(outcome, {q.REPLAY_ID: b"r-9"}, 1_796_000_000.5)
    assert (event.outcome, event.reason, event.replay_id, event.attempt) == ("quarantined", "exhausted", "r-9", 3)
    assert len(event.error) == MAX_ERROR
    assert event.at == "2026-11-30T00:53:20.500Z"
    assert (event.failed, event.final) == (True, True)
    assert event_routing_key(event.queue, event.outcome) == "mail.quarantined"
    doc = json.loads(event.encode())
    assert doc["v"] == 2
    assert decode_events(event.encode()) == [event]


def test_success_retry_and_deferral_are_told_apart() -> None:
    ok = event_for(Outcome(Ack(), "mail", "j", 1, 0.0, True, queue="mail"), {}, 0)
    retried = event_for(Outcome(RetryLater(2, 0, 5.0), "mail", "j", 1, 0.0, True, queue="mail", error="E: e"), {}, 0)
    waited = event_for(Outcome(RetryLater(1, 0, 5.0, wait=True), "mail", "j", 1, 0.0, True, queue="mail"), {}, 0)
    assert [(e.outcome, e.final, e.failed) for e in (ok, retried, waited)] == [
        ("succeeded", True, False), ("retried", True, True), ("deferred", False, False)
    ]  # fmt: skip
    assert retried.why() == "E: e"


def test_what_is_not_an_event_is_left_out_and_unknown_keys_are_ignored() -> None:
    for body in (b"not json", b"", b"\xff\xfe", b"[1]", b"[]", b'{"job": "x"}', b'[{"outcome": 3}]', b"null",
                 b'"succeeded"', b"[" * 100_000):  # fmt: skip
        assert decode_events(body) == [], body
    read = decode_events(b'{"outcome": "succeeded", "id": "a", "attempt": true, "new_key": 1}')  # version 1: one object
    assert read == [OutcomeEvent(job="", id="a", attempt=0, outcome="succeeded", reason="", error="", queue="")]
    mixed = decode_events(b'[{"outcome": "retried", "id": "a"}, 7, {"id": "b"}, [], {"outcome": "retried", "id": "c"}]')
    assert [e.id for e in mixed] == ["a", "c"]
    assert decode_events(memoryview(b'[{"outcome": "retried", "id": "m"}]'))[0].id == "m"
    assert decode_events('[{"outcome": "retried", "id": "s"}]')[0].id == "s"
    for not_a_body in (None, 7, object()):
        assert decode_events(not_a_body) == []  # type: ignore[arg-type]
    (odd,) = decode_events(b'[{"outcome": "succeeded", "job": 5, "id": null, "queue": ["q"], "attempt": 2.0}]')
    assert (odd.job, odd.id, odd.queue, odd.attempt, odd.reason) == ("5", "", "['q']", 0, "")


def test_a_message_carries_the_events_of_one_routing_key_in_order_as_a_json_array() -> None:
    """event_messages: one message per routing key (first-seen order), every event once, in its order within."""
    events = [OutcomeEvent("mail", f"j{n}", 1, "succeeded" if n % 3 else "retried", "", "", "mail" if n % 2 else "sms",
                           "", "t") for n in range(12)]  # fmt: skip
    batch = [(event_routing_key(e.queue, e.outcome), e.encode()) for e in events]
    messages = event_messages(batch)
    assert [key for key, _ in messages] == ["sms.retried", "mail.succeeded", "sms.succeeded", "mail.retried"]
    for key, body in messages:
        assert (body[:1], body[-1:]) == (b"[", b"]")
        assert decode_events(body) == [e for e in events if event_routing_key(e.queue, e.outcome) == key]
    assert sorted(e.id for _, body in messages for e in decode_events(body)) == sorted(e.id for e in events)
    assert event_messages([]) == []
    one = events[1].encode()
    assert event_messages([("mail.succeeded", one)]) == [("mail.succeeded", b"[" + one + b"]")]


def test_the_body_carries_every_field_of_the_event_in_order_with_the_error_cut() -> None:
    event = OutcomeEvent("mail", "j1", 2, "retried", "", "E: " + "x" * 500, "mail", "r9", "2026-11-30T03:00:00.123Z")
    doc = json.loads(event.encode())
    assert list(doc) == ["v", *(f.name for f in dataclasses.fields(OutcomeEvent))]
    assert doc["v"] == 2
    assert doc["attempt"] == 2
    assert doc["replay_id"] == "r9"
    assert doc["error"] == event.error[:MAX_ERROR]
    assert len(doc["error"]) == MAX_ERROR
    assert decode_events(event.encode()) == [OutcomeEvent(**{**dataclasses.asdict(event), "error": doc["error"]})]


def test_text_utf8_cant_encode_is_made_encodable_by_the_evidence_rule() -> None:
    """A lone surrogate (os.fsdecode of bad bytes) in any text field: '?' as in the evidence, the body still goes."""
    bad = "\udcff\udcfe"
    event = OutcomeEvent(job=f"fs{bad}", id=f"id-{bad}", attempt=1, outcome="quarantined", reason="exhausted",
                         error=f"ValueError: /data/{bad}.csv", queue="work", replay_id=bad, at="t")  # fmt: skip
    doc = json.loads(event.encode())
    assert (doc["job"], doc["id"], doc["error"], doc["replay_id"]) == (
        "fs??",
        "id-??",
        "ValueError: /data/??.csv",
        "??",
    )


def _stdlib_body(event: OutcomeEvent) -> bytes:
    """The body as the stdlib made it before orjson (compact, UTF-8 as is, lone surrogates as '?'): the reference."""
    doc = {"v": 2, **{f.name: getattr(event, f.name) for f in dataclasses.fields(OutcomeEvent)}}
    doc["error"] = doc["error"][:MAX_ERROR]
    doc = {k: encodable(v) if isinstance(v, str) else v for k, v in doc.items()}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


_CONTROLS = "".join(chr(n) for n in range(0x20)) + "\x7f"
_TRICKY = [
    OutcomeEvent(
        "mail", "7c1f0e2a", 1, "retried", "", "ValueError: bad address", "mail", "", "2026-11-30T03:00:00.123Z"
    ),
    OutcomeEvent(f"job{_CONTROLS}", "id\n\r\t", 2, "quarantined", "exhausted", f"E: {_CONTROLS}", "q\b\f", "r", "t"),
    OutcomeEvent(
        "mäil", "日本🎉", 3, "retried", "", 'E: "quoted" \\ back/slash </script>', "q\u2028\u2029", "\ufeff", ""
    ),
    OutcomeEvent("mail", "j", 2**63 - 1, "succeeded", "", "", "mail"),
    OutcomeEvent("mail", "j", 2**64, "succeeded", "", "", "mail"),  # orjson refuses beyond 64 bits
    OutcomeEvent("mail", "j", -(2**63) - 1, "succeeded", "", "", "mail"),
    OutcomeEvent("fs\udcff", "j", 1, "quarantined", "exhausted", "E: /data/\udcfe.csv", "mail", "\udcff"),  # surrogates
    OutcomeEvent("mail", "j", 1, "retried", "", "E: " + "é" * 300, "mail"),  # cut at MAX_ERROR characters, not bytes
]


def test_the_body_is_byte_for_byte_the_stdlib_one_for_tricky_text_and_numbers() -> None:
    """Control characters, non-ASCII, quotes, integers past 64 bits, lone surrogates: the body the stdlib made."""
    for event in _TRICKY:
        body = event.encode()
        assert body == _stdlib_body(event), event
        assert decode_events(body) == decode_events(_stdlib_body(event))
        assert json.loads(body)["attempt"] == event.attempt


def test_the_workers_body_of_an_outcome_is_the_events_body() -> None:
    """event_body (the worker's path, no OutcomeEvent in between) writes what event_for(...).encode() writes."""
    long = "E: " + "x" * 500
    outcomes = [
        Outcome(Quarantine("exhausted"), "mail", "j-1", 3, 0.1, True, queue="mail", error=long),
        Outcome(Ack(), "send_welcome", "7c1f0e2a", 1, 0.0, True, queue="mail"),
        Outcome(RetryLater(2, 0, 5.0), "mäil", "日本", 2, 0.0, True, queue="q\n", error="E: \x00\udcff"),
        Outcome(RetryLater(1, 0, 5.0, wait=True), "", "j", 2**64, 0.0, False, queue="mail"),
    ]
    for outcome in outcomes:
        for replay in ("", "r-9", "\udcfe"):
            expected = event_for(outcome, {q.REPLAY_ID: replay.encode("utf-8", "surrogateescape")}, 1_796_000_000.9996)
            assert event_body(outcome, outcome.kind, expected.replay_id, 1_796_000_000.9996) == expected.encode()
