"""Basic.Deliver and Basic.GetOk frames decoded by our fast path give exactly what pamqp gives.

The reference is pamqp's own ``pamqp.frame.unmarshal`` with
:func:`~amqpjobs.wire.lenient_decoding.install_lenient_decoding` installed: the decoding a
worker's connection did before the fast path (a short string that is not UTF-8 gets
U+FFFD). Frames are built byte by byte (pamqp refuses to encode an exchange name over 127
characters, RabbitMQ sends up to 255), and the outcome is compared attribute by attribute,
value *and* type (pamqp reads a delivery tag as a *signed* 64-bit integer: ``2**64 - 1``
comes back as ``-1``), or error by error (kind, message, cause).
"""

from __future__ import annotations

import random
import re
import struct
from typing import Any

import pamqp.frame
import pytest
from pamqp import body, commands, header, heartbeat

from amqpjobs.wire import method_decoding
from amqpjobs.wire.lenient_decoding import install_lenient_decoding
from tests.amqp_frames import shape

DELIVER = struct.pack(">HH", 60, 60)
GET_OK = struct.pack(">HH", 60, 71)


def short(text: bytes) -> bytes:
    return bytes([len(text)]) + text


def method_frame(payload: bytes, channel: int = 1) -> bytes:
    """A method frame around ``payload`` (method index first), as a broker sends it."""
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def deliver(ctag: bytes, tag: int, bits: int, exchange: bytes, key: bytes, channel: int = 1) -> bytes:
    return method_frame(DELIVER + short(ctag) + struct.pack(">QB", tag, bits) + short(exchange) + short(key), channel)


def get_ok(tag: int, bits: int, exchange: bytes, key: bytes, count: int, channel: int = 1) -> bytes:
    return method_frame(
        GET_OK + struct.pack(">QB", tag, bits) + short(exchange) + short(key) + struct.pack(">I", count), channel
    )


def outcome(unmarshal: Any, data: bytes) -> Any:
    """What unmarshaling ``data`` gives: (consumed, channel, class, every attribute), or the error raised."""
    try:
        consumed, channel, frame = unmarshal(data)
    except Exception as error:  # kind, message (object ids blanked) and cause are compared
        cause = error.__cause__
        return ("raised", type(error).__name__, re.sub("0x[0-9a-f]+", "0x", str(error)), repr(cause))
    attributes = [(name, shape(getattr(frame, name))) for name in getattr(frame, "__slots__", [])]
    return (consumed, channel, type(frame).__qualname__, attributes, getattr(frame, "__dict__", None))


def reference(data: bytes) -> Any:
    install_lenient_decoding()
    return outcome(method_decoding.pamqp_unmarshal, data)


def fast(data: bytes) -> Any:
    install_lenient_decoding()
    return outcome(method_decoding.unmarshal, data)


def test_the_reference_is_pamqps_own_frame_decoding() -> None:
    assert method_decoding.pamqp_unmarshal.__module__ == "pamqp.frame"
    assert method_decoding.pamqp_unmarshal.__qualname__ == "unmarshal"


# ---------------------------------------------------------------------------- by value
def test_a_delivery_decodes_to_these_values_without_falling_back() -> None:
    data = deliver(b"amq.ctag-1", 2**64 - 1, 1, b"", b"caf\xc3\xa9-\xff", channel=7)
    assert method_decoding.decode(data) is not None
    consumed, channel, frame = method_decoding.unmarshal(data)
    assert (consumed, channel, type(frame)) == (len(data), 7, commands.Basic.Deliver)
    assert isinstance(frame, commands.Basic.Deliver)
    assert (frame.consumer_tag, frame.delivery_tag, frame.redelivered, frame.exchange, frame.routing_key) == (
        "amq.ctag-1", -1, True, "", "café-\ufffd",
    )  # fmt: skip
    assert fast(data) == reference(data)


def test_a_get_ok_decodes_to_these_values_without_falling_back() -> None:
    data = get_ok(2**63, 254, b"x" * 255, b"", 2**32 - 1)
    assert method_decoding.decode(data) is not None
    _, _, frame = method_decoding.unmarshal(data)
    assert isinstance(frame, commands.Basic.GetOk)
    assert (frame.delivery_tag, frame.redelivered, frame.exchange, frame.routing_key, frame.message_count) == (
        -(2**63), False, "x" * 255, "", 2**32 - 1,
    )  # fmt: skip
    assert fast(data) == reference(data)


# ---------------------------------------------------------------------------- a generated spread
TAGS = [0, 1, 2, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def random_text(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return b""
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 256)))  # mostly not UTF-8
    if kind == 2:
        return "ключ-名前-é".encode()[: rng.randrange(1, 20)]  # may cut a character in two
    if kind == 3:
        return rng.choice([b"a" * 255, "é".encode() * 127 + b"e", b"\xed\xa0\x80"])  # 255 long; a surrogate
    return rng.choice([b"amq.ctag-x8ZsGq3CqPmQ", b"amqpjobs.mail", b"mail.shard-3", b"amq.direct"])


def random_frame(rng: random.Random) -> bytes:
    tag = rng.choice(TAGS) if rng.random() < 0.5 else rng.randrange(2**64)
    bits = rng.choice([0, 1, 2, 3, 254, 255])
    channel = rng.choice([0, 1, 2, 65535])
    exchange, key = random_text(rng), random_text(rng)
    if rng.random() < 0.5:
        return deliver(random_text(rng), tag, bits, exchange, key, channel)
    return get_ok(tag, bits, exchange, key, rng.choice([0, 1, 2**31, 2**32 - 1]), channel)


GENERATED = [random_frame(random.Random(seed)) for seed in range(2000)]


def test_a_generated_spread_decodes_as_pamqp_does_without_falling_back() -> None:
    seen: set[Any] = set()
    for data in GENERATED:
        assert method_decoding.decode(data) is not None, data
        want = reference(data)
        assert want[0] != "raised", (data, want)
        assert fast(data) == want, data
        values = dict(want[3])
        seen |= {want[2], ("redelivered", values["redelivered"]), ("tag", values["delivery_tag"])}
        texts = [values.get(name, ("", ""))[1] for name in ["consumer_tag", "exchange", "routing_key"]]
        seen |= {"replaced" for text in texts if "\ufffd" in text}
    tags = {("tag", shape(tag)) for tag in [-1, 0, 2**63 - 1, -(2**63)]}  # pamqp's signed reading
    redelivered = {("redelivered", shape(True)), ("redelivered", shape(False))}
    assert seen >= {"Basic.Deliver", "Basic.GetOk", "replaced", *redelivered, *tags}


# ---------------------------------------------------------------------------- other frames: pamqp's
def test_every_other_frame_is_left_to_pamqp() -> None:
    others = [
        pamqp.frame.marshal(commands.Basic.Ack(delivery_tag=5, multiple=True), 1),
        pamqp.frame.marshal(commands.Basic.ConsumeOk(consumer_tag="amq.ctag-1"), 1),
        pamqp.frame.marshal(commands.Basic.GetEmpty(), 1),
        pamqp.frame.marshal(
            commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="k"), 1
        ),
        pamqp.frame.marshal(
            commands.Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED", class_id=60, method_id=40), 1
        ),
        pamqp.frame.marshal(header.ContentHeader(body_size=3, properties=commands.Basic.Properties(message_id="m")), 1),
        pamqp.frame.marshal(body.ContentBody(b"abc"), 1),
        pamqp.frame.marshal(heartbeat.Heartbeat(), 0),
        header.ProtocolHeader().marshal(),
        # a deliver's bytes in a header frame, a body frame, a frame of an unknown type
        b"\x02" + deliver(b"c", 1, 0, b"", b"k")[1:],
        b"\x03" + deliver(b"c", 1, 0, b"", b"k")[1:],
        b"\x09" + deliver(b"c", 1, 0, b"", b"k")[1:],
    ]
    for data in others:
        assert method_decoding.decode(data) is None, data
        assert fast(data) == reference(data), data
    assert {fast(data)[2] for data in others[:9]} == {
        "Basic.Ack", "Basic.ConsumeOk", "Basic.GetEmpty", "Basic.Return", "Channel.Close", "ContentHeader",
        "ContentBody", "Heartbeat", "ProtocolHeader",
    }  # fmt: skip


# ---------------------------------------------------------------------------- truncated, trailing, garbage
SAMPLES = [deliver(b"amq.ctag-1", 42, 1, b"amqpjobs", b"mail"), get_ok(42, 0, b"amqpjobs", b"mail", 3)]


@pytest.mark.parametrize("data", SAMPLES, ids=["deliver", "get-ok"])
def test_every_truncation_fails_or_decodes_as_pamqp_does(data: bytes) -> None:
    raised: set[str] = set()
    for cut in range(len(data)):  # the frame cut short: pamqp says not all data was received
        got, want = fast(data[:cut]), reference(data[:cut])
        assert got == want, cut
        raised.add(want[2])
    payload = data[7:-1]
    loose = 0
    for cut in range(len(payload)):  # the method cut short inside a whole frame: pamqp reads what it can
        framed = method_frame(payload[:cut])
        assert method_decoding.decode(framed) is None, cut
        got, want = fast(framed), reference(framed)
        assert got == want, cut
        if want[0] == "raised":
            raised.add(want[2])
        else:
            loose += 1  # a short string past the end, read short
    assert (loose > 0) == (data is SAMPLES[0])  # a routing key read short ends a delivery, not a get-ok
    assert any("Not all data received" in message for message in raised)
    assert any("Could not unpack long-long integer value" in message for message in raised)


@pytest.mark.parametrize("data", SAMPLES, ids=["deliver", "get-ok"])
def test_trailing_bytes_are_handled_as_pamqp_does(data: bytes) -> None:
    after_frame = data + b"\x01\x00\x01"  # the next frame's first bytes: not consumed
    assert method_decoding.decode(after_frame) is None  # not read strictly: pamqp's
    assert fast(after_frame) == reference(after_frame)
    assert fast(after_frame)[0] == len(data)
    inside = method_frame(data[7:-1] + b"\x00\xff")  # bytes after the last field: pamqp ignores them
    assert method_decoding.decode(inside) is None
    assert fast(inside) == reference(inside)
    assert fast(inside)[0] == len(inside)
    bad_end = data[:-1] + b"\x00"
    assert fast(bad_end) == reference(bad_end)
    assert fast(bad_end)[0] == "raised"


@pytest.mark.parametrize("seed", range(4))
def test_garbage_fails_or_decodes_as_pamqp_does(seed: int) -> None:
    rng = random.Random(seed)
    outcomes = set()
    for _ in range(3000):
        data = bytearray(rng.choice([*GENERATED[:200], *SAMPLES]))
        reframe = rng.random() < 0.7  # mostly past the frame checks, into the method's fields
        for _ in range(rng.randrange(1, 4)):  # flip, insert or cut a byte
            if not data:
                break
            at = rng.randrange(len(data))
            how = rng.randrange(3)
            if how == 0:
                data[at] = rng.randrange(256)
            elif how == 1:
                data.insert(at, rng.randrange(256))
            else:
                del data[at:]
        raw = method_frame(bytes(data[7:-1])) if reframe and len(data) > 8 else bytes(data)
        got, want = fast(raw), reference(raw)
        assert got == want, raw
        outcomes.add((want[0] == "raised", method_decoding.decode(raw) is not None))
    assert outcomes == {(True, False), (False, False), (False, True)}


# ---------------------------------------------------------------------------- installed
def test_installing_makes_pamqp_frame_unmarshal_the_fast_path_with_the_lenient_rules() -> None:
    method_decoding.install_method_decoding()
    method_decoding.install_method_decoding()  # idempotent
    assert pamqp.frame.unmarshal is method_decoding.unmarshal
    data = deliver(b"c", 1, 0, b"", b"\xff")
    for unmarshal in [method_decoding.pamqp_unmarshal, pamqp.frame.unmarshal]:  # pamqp's own path is lenient too
        frame = unmarshal(data)[2]
        assert isinstance(frame, commands.Basic.Deliver)
        assert frame.routing_key == "\ufffd"


def test_installing_leaves_a_hook_someone_else_put_there(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []

    def capture(data_in: bytes) -> method_decoding.Unmarshaled:  # as tests/integration/test_exact_copies.py does
        seen.append(data_in)
        return method_decoding.pamqp_unmarshal(data_in)

    monkeypatch.setattr(pamqp.frame, "unmarshal", capture)
    method_decoding.install_method_decoding()  # every connect installs it again
    assert pamqp.frame.unmarshal is capture
    data = deliver(b"c", 1, 0, b"", b"k")
    assert fast(data) == reference(data)
    pamqp.frame.unmarshal(data)
    assert seen == [data]
