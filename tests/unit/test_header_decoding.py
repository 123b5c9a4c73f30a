"""Content headers decoded by our fast path give exactly what pamqp (with our lenient rules) gives.

The reference is pamqp's own ``ContentHeader.unmarshal`` with
:func:`~amqpjobs.wire.lenient_decoding.install_lenient_decoding` installed: the decoding a
worker's connection did before the fast path. Headers are built byte by byte (pamqp can't
encode most field types), and compared value by value *and* type by type (``1`` is not
``True``, ``Decimal('3.140')`` is not ``Decimal('3.14')``).
"""

from __future__ import annotations

import json
import random
import struct
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqpjobs.jobs import envelope
from amqpjobs.wire import header_decoding
from amqpjobs.wire.copies import keep_received_properties, received_bytes
from amqpjobs.wire.lenient_decoding import install_lenient_decoding
from tests import amqp_frames as frames
from tests.amqp_frames import shape
from tests.integration import hostile_frames as hostile

DATA = Path(__file__).resolve().parents[1] / "data" / "bad-messages.jsonl"
#: pamqp's attribute names for the basic properties, in AMQP order (``type`` is ``message_type``).
NAMES = [name if name != "type" else "message_type" for name, _, _ in frames.PROPERTY_LAYOUT]
PREFIX = struct.pack(">HHQ", 60, 0, 1234)


def outcome(unmarshal: Any, payload: bytes) -> Any:
    """What decoding ``payload`` gives: the header's fields and every property, or the error raised."""
    header = ContentHeader()
    try:
        unmarshal(header, payload)
    except Exception as error:  # the kind and the message are compared
        return ("raised", type(error).__name__, str(error))
    props = {name: shape(getattr(header.properties, name)) for name in NAMES}
    return (header.class_id, header.weight, header.body_size, props)


def reference(payload: bytes) -> Any:
    install_lenient_decoding()
    return outcome(header_decoding.pamqp_unmarshal, payload)


def fast(payload: bytes) -> Any:
    install_lenient_decoding()
    return outcome(header_decoding.unmarshal, payload)


def test_the_reference_is_pamqps_own_decoding() -> None:
    assert header_decoding.pamqp_unmarshal.__module__ == "pamqp.header"
    assert header_decoding.pamqp_unmarshal.__qualname__ == "ContentHeader.unmarshal"


# ---------------------------------------------------------------------------- every field type, by value
def test_every_field_type_and_property_decodes_to_these_values() -> None:
    payload = PREFIX + frames.encode_properties(frames.SENT)
    assert header_decoding.decode(payload) is not None  # no fallback
    header = ContentHeader()
    header_decoding.unmarshal(header, payload)
    sizes: tuple[Any, ...] = (header.class_id, header.weight, header.body_size)  # pamqp types class_id as None
    assert sizes == (60, 0, 1234)
    props = header.properties
    headers = props.headers
    assert headers is not None
    assert shape(headers) == shape(
        {
            "t-bool": True,
            "b-int8": -5,
            "B-uint8": 200,
            "s-int16": -300,
            "u-uint16": 60000,
            "I-int32": 128,
            "i-uint32": 4_000_000_000,
            "l-int64": 5,
            "f-float": 1.100000023841858,
            "d-double": 1.1,
            "D-decimal": Decimal("3.14"),
            "S-text": "text ключ",
            "S-not-utf8": b"\xff\xfe",
            "bytes": bytearray(b"\x00\xff"),
            "A-array": [2.5, 9, None],
            "T-seconds": datetime(2025, 11, 29, 9, 0, tzinfo=UTC),
            "T-millis": datetime(2025, 11, 29, 9, 0, 0, 123000, tzinfo=UTC),
            "T-micros": datetime(2025, 11, 29, 9, 0, 0, 123000, tzinfo=UTC),  # µs: the one rule (amqpjobs.epochs)
            "F-table": {"in-f": 1.100000023841858, "in-I": 7},
            "V-void": None,
            "key-\ufffd": "a header name that is not UTF-8",
        }
    )
    assert (props.content_type, props.content_encoding, props.delivery_mode, props.priority) == (
        "application/json", "utf-8", 2, 3,
    )  # fmt: skip
    assert (props.correlation_id, props.reply_to, props.expiration, props.message_id) == (
        "corr-\ufffd", "replies", "600000", "exact-1",
    )  # fmt: skip
    assert props.timestamp == datetime(2025, 11, 29, 9, 0, 0, 123000, tzinfo=UTC)
    assert (props.message_type, props.user_id, props.app_id, props.cluster_id) == (
        "mail", "guest", "sender-app", "cluster-7",
    )  # fmt: skip
    assert fast(payload) == reference(payload)


def test_absent_properties_keep_pamqps_defaults() -> None:
    payload = PREFIX + struct.pack(">H", 0)
    assert header_decoding.decode(payload) is not None
    header = ContentHeader()
    header_decoding.unmarshal(header, payload)
    assert [getattr(header.properties, name) for name in NAMES] == [None] * 13 + [""]
    assert fast(payload) == reference(payload)


def test_a_worker_connection_keeps_the_bytes_of_a_fast_decoded_header() -> None:
    install_lenient_decoding()
    keep_received_properties()
    payload = PREFIX + frames.encode_properties({"message_id": frames.short_bytes(b"m-1")})
    header = ContentHeader()
    header.unmarshal(payload)
    assert header.properties.message_id == "m-1"
    assert received_bytes(header) == payload


# ---------------------------------------------------------------------------- a generated spread
def short(text: bytes) -> bytes:
    return bytes([len(text)]) + text


TIMESTAMPS = [0, 1, 1_764_406_800, 0xFFFFFFFF, 0x1_0000_0000, frames.MILLIS, frames.MILLIS * 1000,
              253_402_300_799_999, 253_402_300_800_000, 2**63, 2**64 - 1]  # fmt: skip


def random_text(rng: random.Random, limit: int) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return b""
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, limit)))  # mostly not UTF-8
    if kind == 2:
        return "ключ-名前-é".encode()[: rng.randrange(1, 20)]  # may cut a character in two
    return rng.choice([b"application/json", b"amqpjobs-attempt", b"x-death", b"mail", b"a" * 255])[:limit]


def random_value(rng: random.Random, depth: int) -> bytes:
    """A type code and value bytes, of any field type pamqp decodes."""
    code = rng.choice("tbBsuIilLfdDSxATFV\x00" if depth < 3 else "tbBsuIilLfdDSxTV\x00")
    fixed = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "L": 8, "f": 4, "d": 8, "D": 5}
    if code in fixed:
        raw = bytes(rng.randrange(256) for _ in range(fixed[code]))
        if code == "t":
            raw = bytes([rng.choice([0, 1, 2, 255])])
        if code == "D":
            raw = bytes([rng.choice([0, 1, 2, 5, 28, 30, 255])]) + raw[1:]
        return code.encode() + raw
    if code == "T":
        return b"T" + struct.pack(">Q", rng.choice(TIMESTAMPS))
    if code in "Sx":
        return code.encode() + frames.long_bytes(random_text(rng, 300))
    if code == "A":
        return b"A" + frames.long_bytes(b"".join(random_value(rng, depth + 1) for _ in range(rng.randrange(4))))
    if code == "F":
        return b"F" + random_table(rng, depth + 1)
    return code.encode()  # V, \x00: no value bytes


def random_table(rng: random.Random, depth: int) -> bytes:
    keys = [random_text(rng, 40) for _ in range(rng.randrange(6))]
    keys += rng.sample(keys, min(len(keys), 1))  # a name twice: the last wins
    return frames.table([(key, random_value(rng, depth)) for key in keys])


def random_properties(rng: random.Random) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, _, kind in frames.PROPERTY_LAYOUT:
        if rng.random() < 0.5:
            continue
        if kind == "shortstr":
            out[name] = short(random_text(rng, 256))
        elif kind == "octet":
            out[name] = bytes([rng.randrange(256)])
        elif kind == "timestamp":
            out[name] = struct.pack(">Q", rng.choice(TIMESTAMPS))
        else:
            out[name] = random_table(rng, 0)
    return out


GENERATED = [PREFIX + frames.encode_properties(random_properties(random.Random(seed))) for seed in range(1500)]


def test_a_generated_spread_decodes_as_pamqp_does_without_falling_back() -> None:
    kinds: set[str] = set()
    for payload in GENERATED:
        assert header_decoding.decode(payload) is not None, payload
        want = reference(payload)
        assert want[0] != "raised", (payload, want)
        assert fast(payload) == want, payload
        kinds |= {name for name, value in want[3].items() if value != ("NoneType", "None")}
    assert kinds == set(NAMES)  # every property was present in some header


def test_the_spread_covers_every_field_type_and_the_lenient_rules() -> None:
    seen: set[str] = set()

    def walk(value: Any) -> None:
        seen.add(type(value).__name__)
        if isinstance(value, dict):
            seen.update("bad key" for key in value if "\ufffd" in key)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for payload in GENERATED:
        header = ContentHeader()
        header_decoding.unmarshal(header, payload)
        walk(header.properties.headers)
    assert seen >= {"dict", "list", "bool", "int", "float", "Decimal", "str", "bytes", "bytearray", "datetime",
                    "NoneType", "bad key"}  # fmt: skip


# ---------------------------------------------------------------------------- bad messages
def bad_message_payloads() -> list[tuple[str, bytes]]:
    def substitute(value: Any) -> Any:
        if isinstance(value, dict):
            return {substitute(k): substitute(v) for k, v in value.items()}
        if isinstance(value, list):
            return [substitute(v) for v in value]
        if isinstance(value, str):
            if value.startswith("<bytes:") and value.endswith(">"):
                return bytearray.fromhex(value[len("<bytes:") : -1])
            return value.replace("{job}", "mail").replace("<attempt-header>", envelope.ATTEMPT)
        return value

    out = []
    for line in DATA.read_text().splitlines():
        message = json.loads(line)
        if "replay" in message:  # typed header values (``<amqp:d:1e300>``), raw timestamps: built byte by byte
            props = json.loads(json.dumps(message["properties"]).replace("{job}", "mail"))
            headers = props.pop("headers", None)
            entries = None if headers is None else [(k.encode(), hostile.value_bytes(v)) for k, v in headers.items()]
            out.append((message["id"], PREFIX + hostile.raw_properties({**props, "message_id": message["id"]},
                                                                       entries).marshal()))  # fmt: skip
            continue
        props = substitute(message["properties"])
        if "type" in props:
            props["message_type"] = props.pop("type")
        out.append((message["id"], PREFIX + commands.Basic.Properties(message_id=message["id"], **props).marshal()))
    return out


BAD = bad_message_payloads()


def test_every_bad_message_decodes_as_pamqp_does() -> None:
    assert len(BAD) >= 28
    for name, payload in BAD:
        assert header_decoding.decode(payload) is not None, name
        if name != "headers-nested-100":  # past MAX_DEPTH pamqp decodes on, we give None (the nesting test below)
            assert fast(payload) == reference(payload), name
    decoded = {}
    for name, payload in BAD:
        header = ContentHeader()
        header_decoding.unmarshal(header, payload)
        decoded[name] = header.properties
    assert decoded["nested-headers"].headers == {"meta": {"a": {"b": [1, "two", True]}}}
    assert decoded["binary-header"].headers == {"blob": bytearray(b"\x00\xff\x10")}
    assert decoded["unicode-header-name"].headers == {"ключ-名前": "v"}
    assert decoded["attempt-huge"].headers == {envelope.ATTEMPT: 1099511627776}
    assert decoded["attempt-garbage"].headers == {envelope.ATTEMPT: "abc"}
    assert decoded["priority-over-max"].priority == 255
    assert decoded["long-job-name"].message_type == "j" * 255
    assert decoded["text-plain"].content_type == "text/plain"
    assert decoded["no-job-name"].message_type is None
    assert decoded["bad-json"].message_id == "bad-json"


# ---------------------------------------------------------------------------- truncated, garbage
def test_every_truncation_fails_or_decodes_as_pamqp_does() -> None:
    payload = PREFIX + frames.encode_properties(frames.SENT)
    results = [(fast(payload[:cut]), reference(payload[:cut])) for cut in range(len(payload))]
    for cut, (got, want) in enumerate(results):
        assert got == want, cut
    errors = {want[1] for _, want in results if want[0] == "raised"}
    assert errors == {"error", "ValueError"}  # struct.error below 12 bytes, ValueError after
    assert results[5][1] == ("raised", "error", "unpack requires a buffer of 12 bytes")
    assert results[13][1] == ("raised", "ValueError", "Content header flags are truncated")


@pytest.mark.parametrize("seed", range(4))
def test_garbage_fails_or_decodes_as_pamqp_does(seed: int) -> None:
    rng = random.Random(seed)
    outcomes = set()
    for _ in range(1500):
        payload = bytearray(rng.choice([*GENERATED[:200], PREFIX + frames.encode_properties(frames.SENT)]))
        for _ in range(rng.randrange(1, 4)):  # flip, insert or cut a byte
            if not payload:
                break
            at = rng.randrange(len(payload))
            how = rng.randrange(3)
            if how == 0:
                payload[at] = rng.randrange(256)
            elif how == 1:
                payload.insert(at, rng.randrange(256))
            else:
                del payload[at:]
        got, want = fast(bytes(payload)), reference(bytes(payload))
        assert got == want, bytes(payload)
        outcomes.add(want[0] == "raised")
    assert outcomes == {True, False}


def test_a_header_pamqp_decodes_loosely_is_left_to_pamqp() -> None:
    # a short string that runs past the end: pamqp cuts it short and keeps going
    cut_short = PREFIX + struct.pack(">H", 0x0080) + b"\x09only4"
    assert header_decoding.decode(cut_short) is None
    assert fast(cut_short) == reference(cut_short)
    header = ContentHeader()
    header_decoding.unmarshal(header, cut_short)
    assert header.properties.message_id == "only4"
    # an entry whose value runs past its table's end: pamqp keeps it
    overrun = PREFIX + struct.pack(">H", 0x2000 | 0x0080) + frames.long_bytes(b"\x01kl") + b"\x00" * 7 + b"\x01m"
    assert header_decoding.decode(overrun) is None
    assert fast(overrun) == reference(overrun)
    # a header name that ends the payload, with no type code: pamqp reads the value as void
    nameless = PREFIX + struct.pack(">H", 0x2000) + frames.long_bytes(b"\x01k")
    assert header_decoding.decode(nameless) is None
    assert fast(nameless) == reference(nameless)
    header = ContentHeader()
    header_decoding.unmarshal(header, nameless)
    assert header.properties.headers == {"k": None}
    # a second word of property flags
    flagged = PREFIX + struct.pack(">HH", 0x8001, 0) + b"\x01j"
    assert header_decoding.decode(flagged) is None
    assert fast(flagged) == reference(flagged)
    # an unknown field type
    unknown = PREFIX + struct.pack(">H", 0x2000) + frames.table([(b"k", b"Z")])
    assert header_decoding.decode(unknown) is None
    assert fast(unknown) == reference(unknown) == ("raised", "ValueError", "Unknown type: b'Z'")


def nested(levels: int, code: bytes = b"F") -> bytes:
    """A headers table whose one header ``deep`` holds tables (``F``) or arrays (``A``) ``levels`` deep, a 1 inside."""
    value = b"I" + struct.pack(">i", 1)
    for _ in range(levels):
        value = code + frames.long_bytes((frames.short_bytes(b"in") if code == b"F" else b"") + value)
    return frames.table([(b"amqpjobs-job", b"S" + frames.long_bytes(b"mail")), (b"deep", value)])


def depth_of(value: Any) -> tuple[int, Any]:
    """How many tables or arrays ``value`` nests, and what is innermost."""
    levels = 0
    while isinstance(value, dict | list):
        value = value["in"] if isinstance(value, dict) else value[0]
        levels += 1
    return levels, value


@pytest.mark.parametrize("code", [b"F", b"A"])
@pytest.mark.parametrize("levels", [header_decoding.MAX_DEPTH, header_decoding.MAX_DEPTH + 1, 490, 3000])
def test_a_header_nested_deeper_than_python_recurses_decodes_to_none_inside(code: bytes, levels: int) -> None:
    """A table nested hundreds deep (the broker accepts it) never fails the frame: past MAX_DEPTH it is None."""
    payload = PREFIX + frames.encode_properties({"headers": nested(levels, code), "message_id": b"\x04deep"})
    header = ContentHeader()
    header_decoding.unmarshal(header, payload)
    headers = header.properties.headers
    assert headers is not None
    assert headers["amqpjobs-job"] == "mail"
    assert header.properties.message_id == "deep"
    if levels <= header_decoding.MAX_DEPTH:  # as deep as this is decoded whole, as pamqp does
        assert depth_of(headers["deep"]) == (levels, 1)
        assert outcome(header_decoding.unmarshal, payload) == reference(payload)
    else:
        assert depth_of(headers["deep"]) == (header_decoding.MAX_DEPTH, None)
