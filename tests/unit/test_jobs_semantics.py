"""Pure job semantics: retry decisions, evidence budget, decoding rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from amqpjobs.jobs import copy_headers, envelope
from amqpjobs.jobs.evidence import (
    DEFAULT_BUDGET,
    ERROR_MESSAGE,
    ERROR_TYPE,
    EVIDENCE_HEADERS,
    JOB,
    JOB_ID,
    MIN_BUDGET,
    REASON,
    TENANT,
    TRACEBACK,
    Failure,
    evidence_headers,
    trimmed_budget,
)
from amqpjobs.jobs.outcome import Quarantine, RetryLater
from amqpjobs.jobs.retry import decide
from amqpjobs.jobs.timestamps import parse_time

TIERS = (1.0, 5.0, 30.0)


@pytest.mark.parametrize(
    ("kind", "attempt", "max_attempts", "expected"),
    [
        ("error", 1, 4, RetryLater(2, 0, 1.0)),
        ("error", 2, 4, RetryLater(3, 1, 5.0)),
        ("retry", 3, 4, RetryLater(4, 2, 30.0)),
        ("error", 4, 4, Quarantine("exhausted")),
        ("timeout", 4, 4, Quarantine("timeout")),
        ("timeout", 1, 4, RetryLater(2, 0, 1.0)),
        ("error", 5, 6, RetryLater(6, 2, 30.0)),  # beyond the tiers: the last tier again
        ("permanent", 1, 4, Quarantine("permanent")),
        ("reject", 1, 4, Quarantine("rejected")),
    ],
)
def test_decide(kind: str, attempt: int, max_attempts: int, expected: object) -> None:
    assert decide(kind, attempt, max_attempts, TIERS) == expected  # type: ignore[arg-type]


def test_decide_without_tiers_quarantines() -> None:
    assert decide("error", 1, 1, ()) == Quarantine("exhausted")


def failure(message: str, tb: str) -> Failure:
    return Failure("exhausted", "ValueError", message, tb, 4, "t1", "t2", "host", 1, "0.1.0", "", "jobs", "work",
                   "work", "mail", "id-1", "")  # fmt: skip


@pytest.mark.parametrize("size", [10, 20_000, 1_000_000])
def test_evidence_stays_under_budget(size: int) -> None:
    headers = evidence_headers(failure("m" * size, "Traceback...\n" + "t" * size + "\nValueError: boom"))
    assert set(headers) == set(EVIDENCE_HEADERS) - {envelope.TENANT}  # no tenant: no tenant header
    total = sum(len(k.encode()) + len(str(v).encode()) for k, v in headers.items())
    assert total <= DEFAULT_BUDGET
    assert str(headers[ERROR_MESSAGE]).startswith("mmm")
    assert str(headers[TRACEBACK]).endswith("ValueError: boom")  # the end of a traceback is kept
    if size == 10:
        assert headers[ERROR_MESSAGE] == "m" * 10


def test_evidence_trimmed_for_a_copy_over_its_frame_loses_the_excess() -> None:
    """A quarantine copy 5000 bytes over its frame: the evidence built again is 5000+ bytes smaller."""
    full = {"big": "z" * 120_000, **evidence_headers(failure("m" * 50_000, "t" * 50_000))}
    budget = trimmed_budget(full, 5000)
    assert budget is not None
    trimmed = evidence_headers(failure("m" * 50_000, "t" * 50_000), budget)
    size = sum(len(k.encode()) + len(str(v).encode()) + 6 for k, v in trimmed.items())  # AMQP: + length and type
    used = sum(len(k.encode()) + len(str(v).encode()) + 6 for k, v in full.items() if k in EVIDENCE_HEADERS)
    assert used - size >= 5000
    assert str(trimmed[ERROR_MESSAGE]).startswith("mmm")
    assert trimmed_budget(full, DEFAULT_BUDGET - MIN_BUDGET) is None  # too little left: rejected as it is


def test_evidence_keeps_a_long_tenant_whole() -> None:
    """No tenant limit of ours: the quarantined copy (and so its replay) keeps the tenant, and its shard."""
    tenant = "\u00e9" * 3000  # 6000 bytes, over the 1 KiB the other short evidence values are trimmed to
    headers = evidence_headers(replace(failure("m", ""), tenant=tenant))
    assert headers[TENANT] == tenant


def test_a_long_tenant_leaves_the_error_and_traceback_their_budget() -> None:
    """M2: the tenant came on the job (enqueue counted it in the frame) and is carried as it is: it takes no
    room of the evidence budget, so error message and traceback are as long as without a tenant."""
    big = failure("m" * 50_000, "t" * 50_000)
    plain = evidence_headers(big)
    tenanted = evidence_headers(replace(big, tenant="t" * 110_300))
    assert tenanted[TENANT] == "t" * 110_300
    assert (len(str(tenanted[ERROR_MESSAGE])), len(str(tenanted[TRACEBACK]))) == (
        len(str(plain[ERROR_MESSAGE])),
        len(str(plain[TRACEBACK])),
    )
    assert len(str(plain[ERROR_MESSAGE])) > 3_000
    assert len(str(plain[TRACEBACK])) > 10_000
    full = {**tenanted, "big": "z" * 5_000}  # over its frame by 5000: the tenant is no evidence to trim either
    assert trimmed_budget(full, 5_000) == trimmed_budget({**plain, "big": "z" * 5_000}, 5_000)


def test_evidence_survives_surrogates() -> None:
    """Lone surrogates (os.fsdecode of a non-UTF-8 path) can't be encoded: each becomes "?", the rest stays."""
    bad = replace(
        failure("bad \udcff text", "Traceback...\nOSError: /tmp/\udcfe.csv"),
        error_type="my\udcffmod.Error", job="mail\udcff", job_id="id-\udcff", tenant="t\udcff",
    )  # fmt: skip
    headers = evidence_headers(bad)
    for value in headers.values():
        str(value).encode("utf-8")  # every header can go on the wire
    assert headers[ERROR_MESSAGE] == "bad ? text"
    assert headers[TRACEBACK] == "Traceback...\nOSError: /tmp/?.csv"
    short = (headers[ERROR_TYPE], headers[JOB], headers[JOB_ID], headers[TENANT])
    assert short == ("my?mod.Error", "mail?", "id-?", "t?")
    assert headers[REASON] == "exhausted"


@pytest.mark.parametrize(
    ("body", "ctype", "cenc", "reason"),
    [
        (b"not json", "application/json", None, "undecodable"),
        (b"\xff\xfe\x00{", "application/json", None, "undecodable"),
        (b"", "application/json", None, "undecodable"),
        (b"[1,2]", "application/json", None, "invalid-payload"),
        (b'{"x": NaN}', "application/json", None, "undecodable"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", None, "undecodable"),
        (b"{}", "text/plain", None, "unsupported-content-type"),
        (b"{}", "application/json", "gzip", "undecodable"),
    ],
)
def test_decode_rejects(body: bytes, ctype: str, cenc: str | None, reason: str) -> None:
    with pytest.raises(envelope.DecodeError) as info:
        envelope.decode_body(body, ctype, cenc)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        (b'\xef\xbb\xbf{"a": 1}', "application/json"),
        (b'{"a": 1}', None),
        (b'{"a": 1}', "application/json; charset=utf-8"),
    ],
)
def test_decode_accepts(body: bytes, ctype: str | None) -> None:
    assert envelope.decode_body(body, ctype, None) == {"a": 1}


@pytest.mark.parametrize(
    ("raw", "attempt"),
    [
        (None, 1),
        (3, 3),
        ("abc", 1),
        (-5, 1),
        (0, 1),
        (2.0, 2),
        (2.5, 1),
        (float("inf"), 1),
        (b"4", 4),
        (bytearray(b"2"), 2),
        ("7", 7),
        (" 8 ", 8),
        (True, 1),
        (2**40, 2**40),
        ("²", 1),
        ("①", 1),
        ("9" * 5000, 2**63 - 1),  # above the range: the largest count, as 1e300 (test_header_counts)
        ({"a": 1}, 1),
    ],
)
def test_parse_attempt(raw: object, attempt: int) -> None:
    assert envelope.parse_attempt(raw) == attempt


@pytest.mark.parametrize(
    ("message_type", "headers", "name"),
    [
        ("send", {envelope.JOB: "other"}, "send"),  # the type property wins
        (None, {envelope.JOB: "send"}, "send"),
        ("", {envelope.JOB: b"send\xff"}, "send\ufffd"),  # bytes: UTF-8, bad bytes replaced
        (None, {envelope.JOB: bytearray(b"send")}, "send"),
        (None, {envelope.JOB: 7}, ""),  # an integer is no job name (README: a string or byte array)
        (None, {envelope.JOB: ""}, ""),
        (None, {}, ""),
    ],
)
def test_job_name_of(message_type: str | None, headers: dict[str, object], name: str) -> None:
    assert envelope.job_name_of(message_type, headers) == name


def test_strip_broker_headers() -> None:
    headers = {"x-death": [], "x-first-death-queue": "q", "x-last-death-reason": "r", "keep": 1, "amqpjobs-attempt": 2}
    assert copy_headers.strip_broker_headers(headers) == {"keep": 1, "amqpjobs-attempt": 2}


def test_job_message_rejects_reserved_headers_and_bad_priority() -> None:
    with pytest.raises(ValueError, match="reserved"):
        envelope.job_message("j", {}, job_id="1", now=0, headers={"x-death": 1})
    with pytest.raises(ValueError, match="priority"):
        envelope.job_message("j", {}, job_id="1", now=0, priority=256)
    with pytest.raises(ValueError, match="NaN"):
        envelope.job_message("j", {"x": float("nan")}, job_id="1", now=0)


def test_short_strings_that_are_not_utf8_decode_with_replacement_characters() -> None:
    from pamqp import decode

    from amqpjobs.wire.lenient_decoding import install_lenient_decoding

    install_lenient_decoding()
    assert decode.by_type(b"\x05sl\xffow", "shortstr") == (6, "sl\ufffdow")
    assert decode.by_type(b"\x04mail", "shortstr") == (5, "mail")


def test_header_names_that_are_not_utf8_decode_with_replacement_characters() -> None:
    from pamqp import decode, encode

    from amqpjobs.wire.lenient_decoding import install_lenient_decoding

    install_lenient_decoding()
    good = encode.field_table({"a": 1, "b": "x"})
    assert decode.by_type(good, "table") == (len(good), {"a": 1, "b": "x"})
    bad = good.replace(b"\x01a", b"\x01\xff")  # the key "a" becomes the byte 0xff
    assert decode.by_type(bad, "table") == (len(bad), {"\ufffd": 1, "b": "x"})
    nested = encode.field_table({"t": {"a": 1}}).replace(b"\x01a", b"\x01\xff")
    assert decode.by_type(nested, "table")[1] == {"t": {"\ufffd": 1}}


def test_bytes_in_headers_are_sent_as_byte_arrays() -> None:
    from amqpjobs.jobs.envelope import OutgoingMessage
    from amqpjobs.wire.limits import amqp_properties

    props = amqp_properties(OutgoingMessage(body=b"{}", headers={"v": b"\xff", "t": {"w": [b"\xfe"]}}))
    assert props.headers == {"v": bytearray(b"\xff"), "t": {"w": [bytearray(b"\xfe")]}}
    props.marshal()  # pamqp can encode it (it can't encode bytes)


def test_timestamps_past_pamqps_range_decode_by_the_one_rule() -> None:
    import struct

    from pamqp import decode

    from amqpjobs.wire.lenient_decoding import install_lenient_decoding

    install_lenient_decoding()
    micro = struct.pack(">Q", 1764406800123456)  # microseconds: pamqp alone would raise; the fast path reads them
    when = datetime(2025, 11, 29, 9, 0, 0, 123456, tzinfo=UTC)
    assert decode.by_type(micro, "timestamp") == (8, when)
    assert decode.TABLE_MAPPING[b"T"](micro) == (8, when)
    largest = struct.pack(">Q", 2**63 - 1)  # nanoseconds: the last POSIX time_t (signed) reads, in 2262
    assert decode.by_type(largest, "timestamp") == (8, datetime(2262, 4, 11, 23, 47, 16, 854776, tzinfo=UTC))
    negative = struct.pack(">Q", 2**64 - 1)  # -1 s sent unsigned: no time (before 1970), not 2554
    assert decode.by_type(negative, "timestamp") == (8, None)
    ok = struct.pack(">Q", 1764406800)
    consumed, value = decode.by_type(ok, "timestamp")
    assert consumed == 8
    assert isinstance(value, datetime)
    assert value.year == 2025


@pytest.mark.parametrize(
    ("value", "tenant"),
    [
        (None, None), ("", None), ("  ", None), ("\u3000\t", None), (b"", None), (b" \n", None),
        ("acme", "acme"), (b"acme", "acme"), (bytearray(b"acme"), "acme"), (b"\xffx", "\ufffdx"), (42, "42"),
        ({"id": 7}, None), ([1, 2], None), (True, None), (1.5, None), (Decimal("1"), "1"), (Decimal("1.0"), None),
        (Decimal("NaN"), None),
        (datetime(2026, 1, 1, tzinfo=UTC), None),
    ],
)  # fmt: skip
def test_one_rule_for_no_tenant(value: object, tenant: str | None) -> None:
    """Text (bytes as UTF-8), an integer or a decimal of scale 0 names a tenant unless blank; any other type none."""
    assert envelope.tenant_of(value) == tenant


def test_copies_drop_a_tenant_header_that_names_no_tenant() -> None:
    death = {"x-death": [{"count": 1}], "x-first-death-reason": "rejected"}
    for none in ("", " ", b"\t", {"id": 7}, [1], True, 2.5):
        assert copy_headers.copy_headers({envelope.TENANT: none, "k": 1, **death}, None) == {"k": 1}
    kept = copy_headers.copy_headers({envelope.TENANT: b"acme", "k": 1}, None)
    assert kept == {envelope.TENANT: b"acme", "k": 1}  # as received: same type, same bytes


@pytest.mark.parametrize(
    ("received", "timestamp", "expected"),
    [
        ({}, 1_700_000_000, "2023-11-14T22:13:20.000Z"),  # a foreign publisher's job: from its timestamp
        ({}, 1_700_000_000.5, "2023-11-14T22:13:20.500Z"),  # the property decoded: seconds (its unit read once)
        ({}, 9_223_372_036.854, "2262-04-11T23:47:16.854Z"),  # seconds past 2106: seconds, not ms (1970)
        ({envelope.ENQUEUED_AT: "nonsense"}, 1_700_000_000, "2023-11-14T22:13:20.000Z"),  # unreadable: replaced
        ({envelope.ENQUEUED_AT: b"2026-01-02T03:04:05Z"}, 1_700_000_000, b"2026-01-02T03:04:05Z"),  # kept as is
        ({}, None, None),  # neither: nothing to keep
    ],
)
def test_every_copy_keeps_the_first_enqueue_time(received: dict[str, Any], timestamp: Any, expected: Any) -> None:
    """A copy's ``timestamp`` becomes its ready time: the first enqueue time must live in the header."""
    assert copy_headers.copy_headers(received, timestamp).get(envelope.ENQUEUED_AT) == expected
    kept = copy_headers.copy_headers(received, timestamp)
    if expected is not None:
        assert envelope.enqueued_at_of(kept, 2_000_000_000) == envelope.enqueued_at_of(received, timestamp)


def test_evidence_and_replay_carry_no_empty_tenant() -> None:
    from amqpjobs.jobs import quarantine as q

    with_tenant = evidence_headers(replace(failure("m", ""), tenant="acme"))
    assert with_tenant[envelope.TENANT] == "acme"
    item = q.describe({envelope.TENANT: ""}, "id-1", "mail")
    assert envelope.TENANT not in q.replay_headers({envelope.TENANT: "", "k": 1}, item, "r-1", timestamp=None)
    assert q.replay_headers({envelope.TENANT: b"acme"}, item, "r-1", timestamp=None)[envelope.TENANT] == b"acme"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1_764_493_200, "2025-11-30T09:00:00+00:00"),  # seconds
        (1_764_493_200_123, "2025-11-30T09:00:00.123000+00:00"),  # milliseconds: above 2**32 - 1
        (0xFFFFFFFF, "2106-02-07T06:28:15+00:00"),  # the last value read as seconds
        ("2026-11-30T09:00:00", "2026-11-30T09:00:00+00:00"),  # no zone: UTC
        ("2026-11-30T11:00:00+02:00", "2026-11-30T09:00:00+00:00"),
        (b"2026-11-30T09:00:00.000Z", "2026-11-30T09:00:00+00:00"),
        (datetime(2026, 11, 30, 9), "2026-11-30T09:00:00+00:00"),  # naive: UTC
        ("2026-11-30T09:00:00.123Z", "2026-11-30T09:00:00.123000+00:00"),  # our own header's text
        (" 2026-11-30T09:00:00Z\n", "2026-11-30T09:00:00+00:00"), ("", None), (" \t", None), (b" ", None),
        ("yesterday", None), (True, None), (10**30, None), (None, None),
        (1_764_493_200.5, "2025-11-30T09:00:00.500000+00:00"),  # a float: Date.now() / 1000 from JavaScript
        (1_764_493_200_123.0, "2025-11-30T09:00:00.123000+00:00"),  # a float of milliseconds
        (-1, None), (-1.5, None), (-(10**12), None),  # before 1970: no enqueue time, not 1969
        (float("nan"), None), (float("inf"), None), ({"t": 1}, None), ([1], None),
        # ISO text whose UTC time falls outside datetime's years 1-9999: out of range, not an OverflowError
        ("0001-01-01T00:00:00+01:00", None), ("9999-12-31T23:59:59-01:00", None),
        (b"0001-01-01T00:30:00+00:31", None), (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), None),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:00"),  # the first instant datetime has: in range
    ],
)  # fmt: skip
def test_one_time_rule(value: object, expected: str | None) -> None:
    parsed = parse_time(value)
    assert (None if parsed is None else parsed.isoformat()) == expected
    assert parsed is None or parsed.tzinfo is UTC


@pytest.mark.parametrize(
    ("body", "ctype", "cenc", "said"),
    [
        (b'{"a": 1}', "text/plain", None,
         "content_type 'text/plain'; expected 'application/json': publish the job with content_type application/json, "
         "or none"),
        (b'{"a": 1}', "", None, "content_type ''; expected 'application/json': publish the job with content_type "
                                "application/json, or none"),
        (b"\x1f\x8b\x08\x00", "application/json", "gzip",
         "content_encoding 'gzip' is not supported: publish the body as plain UTF-8 JSON, with content_encoding "
         "none, identity or utf-8"),
        ('{"a": "é"}'.encode("latin-1"), "application/json; charset=latin-1", None,
         "body is not UTF-8 (its content_type says charset=latin-1; only UTF-8 is read: publish it as UTF-8): "),
    ],
)  # fmt: skip
def test_a_foreign_publishers_undecodable_job_is_quarantined_with_the_fix(
    body: bytes, ctype: str, cenc: str | None, said: str
) -> None:
    """Before: "content_encoding 'gzip' is not supported", "content_type 'text/plain'; expected ...": no fix."""
    with pytest.raises(envelope.DecodeError) as info:
        envelope.decode_body(body, ctype, cenc)
    assert info.value.detail.startswith(said), info.value.detail
