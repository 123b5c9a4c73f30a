"""AMQP frames byte by byte: content headers built here, and the settlement frames a broker receives.

Content headers: one header of each AMQP field type, every basic property.

aio-pika can't send most field types (and pamqp decodes ``f`` and ``d`` alike), so the
frames are built with pamqp's per-type encoders, and split back into raw bytes here
without amqpjobs, to compare a copy with what was sent.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pamqp import commands, decode, encode

from amqpjobs.wire.settings import BrokerSettings


def shape(value: Any) -> Any:
    """``value`` with its type at every depth, comparable with ``==`` (NaN included): decoders compared with pamqp."""
    if isinstance(value, dict):
        return ("dict", [(shape(k), shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [shape(v) for v in value])
    return (type(value).__name__, repr(value))


def long_bytes(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def short_bytes(text: bytes) -> bytes:
    return bytes([len(text)]) + text


def table(entries: list[tuple[bytes, bytes]]) -> bytes:
    return long_bytes(b"".join(short_bytes(key) + value for key, value in entries))


MILLIS = 1_764_406_800_123  # Node's Date.now(): milliseconds
NESTED = table([(b"in-f", b"f" + encode.floating_point(1.1)), (b"in-I", b"I" + encode.long_int(7))])

#: One header of each field type (raw key -> type code + value bytes), as RabbitMQ's table types.
HEADERS: list[tuple[bytes, bytes]] = [
    (b"t-bool", b"t" + encode.boolean(True)),
    (b"b-int8", b"b" + struct.pack(">b", -5)),
    (b"B-uint8", b"B" + encode.octet(200)),
    (b"s-int16", b"s" + encode.short_int(-300)),
    (b"u-uint16", b"u" + encode.short_uint(60000)),
    (b"I-int32", b"I" + encode.long_int(128)),
    (b"i-uint32", b"i" + encode.long_uint(4_000_000_000)),
    (b"l-int64", b"l" + encode.long_long_int(5)),
    (b"f-float", b"f" + encode.floating_point(1.1)),
    (b"d-double", b"d" + encode.double(1.1)),
    (b"D-decimal", b"D" + encode.decimal(Decimal("3.14"))),
    (b"S-text", b"S" + encode.long_string("text ключ")),
    (b"S-not-utf8", b"S" + long_bytes(b"\xff\xfe")),
    (b"bytes", b"x" + encode.byte_array(bytearray(b"\x00\xff"))),
    (b"A-array", b"A" + long_bytes(b"f" + encode.floating_point(2.5) + b"u" + encode.short_uint(9) + b"V")),
    (b"T-seconds", b"T" + struct.pack(">Q", 1_764_406_800)),
    (b"T-millis", b"T" + struct.pack(">Q", MILLIS)),
    (b"T-micros", b"T" + struct.pack(">Q", MILLIS * 1000)),
    (b"F-table", b"F" + NESTED),
    (b"V-void", b"V"),
    (b"key-\xff", b"S" + encode.long_string("a header name that is not UTF-8")),
]

#: Basic properties in AMQP order: (name, flag bit, field kind).
PROPERTY_LAYOUT = [
    ("content_type", 0x8000, "shortstr"), ("content_encoding", 0x4000, "shortstr"), ("headers", 0x2000, "table"),
    ("delivery_mode", 0x1000, "octet"), ("priority", 0x0800, "octet"), ("correlation_id", 0x0400, "shortstr"),
    ("reply_to", 0x0200, "shortstr"), ("expiration", 0x0100, "shortstr"), ("message_id", 0x0080, "shortstr"),
    ("timestamp", 0x0040, "timestamp"), ("type", 0x0020, "shortstr"), ("user_id", 0x0010, "shortstr"),
    ("app_id", 0x0008, "shortstr"), ("cluster_id", 0x0004, "shortstr"),
]  # fmt: skip

SENT: dict[str, bytes] = {
    "content_type": short_bytes(b"application/json"),
    "content_encoding": short_bytes(b"utf-8"),
    "headers": table(HEADERS),
    "delivery_mode": b"\x02",
    "priority": b"\x03",
    "correlation_id": short_bytes(b"corr-\xff"),  # not UTF-8
    "reply_to": short_bytes(b"replies"),
    "expiration": short_bytes(b"600000"),
    "message_id": short_bytes(b"exact-1"),
    "timestamp": struct.pack(">Q", MILLIS),
    "type": short_bytes(b"mail"),
    "user_id": short_bytes(b"guest"),  # the test's connection user: the broker checks it
    "app_id": short_bytes(b"sender-app"),
    "cluster_id": short_bytes(b"cluster-7"),
}
DROPPED = {"expiration", "user_id"}


def encode_properties(values: dict[str, bytes]) -> bytes:
    """The property list of a content header: flags, then each present property's bytes."""
    flags = sum(flag for name, flag, _ in PROPERTY_LAYOUT if name in values)
    return struct.pack(">H", flags) + b"".join(values[name] for name, _, _ in PROPERTY_LAYOUT if name in values)


def split_properties(payload: bytes) -> dict[str, bytes]:
    """Each property's raw bytes from a content-header frame payload (class, weight, size, flags, list)."""
    (flags,) = struct.unpack(">H", payload[12:14])
    data, out = payload[14:], {}
    for name, flag, kind in PROPERTY_LAYOUT:
        if flags & flag:
            size = {
                "shortstr": 1 + data[0] if data else 1,
                "octet": 1,
                "timestamp": 8,
                "table": 4 + int.from_bytes(data[:4], "big"),
            }[kind]
            out[name], data = data[:size], data[size:]
    return out


def split_table(table: bytes) -> dict[bytes, bytes]:
    """Raw key -> type code + value bytes, for each entry of an encoded field table (of a key twice: the last).

    :func:`table_entries` keeps every entry.
    """
    end, offset, out = 4 + int.from_bytes(table[:4], "big"), 4, {}
    while offset < end:
        key = table[offset + 1 : offset + 1 + table[offset]]
        offset += 1 + len(key)
        consumed, _ = decode.embedded_value(table[offset:end])
        out[key] = table[offset : offset + consumed]
        offset += consumed
    return out


def table_entries(table: bytes) -> list[tuple[bytes, bytes]]:
    """Every entry of an encoded field table, in its order: (raw key, type code + value bytes).

    Unlike :func:`split_table`, keeps a name that occurs twice (twice).
    """
    end, offset, out = 4 + int.from_bytes(table[:4], "big"), 4, []
    while offset < end:
        key = table[offset + 1 : offset + 1 + table[offset]]
        offset += 1 + len(key)
        consumed, _ = decode.embedded_value(table[offset:end])
        out.append((key, table[offset : offset + consumed]))
        offset += consumed
    return out


class RawProperties(commands.Basic.Properties):
    """Properties sent exactly as given (aiormq reads ``message_id`` to match confirms)."""

    def __init__(self, encoded: bytes, message_id: str) -> None:
        super().__init__(message_id=message_id)
        self.encoded = encoded

    def marshal(self) -> bytes:
        return self.encoded


# ---------------------------------------------------------------------------- what the broker receives
#: Basic methods (class 60) whose frames :class:`FrameTap` records: method id -> name.
SETTLE_METHODS = {80: "ack", 90: "reject", 120: "nack"}


@dataclass(frozen=True)
class Settle:
    """One ``basic.ack`` / ``basic.reject`` / ``basic.nack`` frame as it reached the broker.

    Attributes:
        method: ``ack``, ``reject`` or ``nack``.
        channel: The channel number it was sent on.
        tag: Its delivery tag.
        multiple: The ``multiple`` bit (always False for ``reject``, which has none).
    """

    method: str
    channel: int
    tag: int
    multiple: bool


class FrameTap:
    """A TCP relay between AMQP clients and the broker that reads every frame clients send.

    Connect a client to :attr:`settings` instead of the broker's: bytes pass through
    unchanged both ways, and each settlement frame a client sends (split here from the raw
    byte stream with the AMQP 0-9-1 framing, without aio-pika or pamqp) is appended to
    :attr:`settles` before the broker gets it. So a test sees the acks the broker really
    received, one entry per frame: an ack with ``multiple`` counts once. Deliveries on their
    way to the client are noted too: :attr:`peak_outstanding` is the most deliveries the
    client held unsettled at once, exactly, where the management API samples each channel
    at its own moment.
    """

    def __init__(self, broker: BrokerSettings) -> None:
        self.broker = broker
        self.settles: list[Settle] = []
        #: Per channel, the delivery tags sent to the client and not yet settled (ack, reject, nack).
        self.outstanding: dict[int, set[int]] = {}
        #: The most deliveries outstanding at once, over all channels (as this relay saw them pass).
        self.peak_outstanding = 0
        #: Method frames clients sent, by (class id, method id): (60, 20) ``basic.consume``, (60, 30) ``basic.cancel``.
        self.methods: Counter[tuple[int, int]] = Counter()
        self.settings = broker
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FrameTap:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self.broker.url)
        netloc = parts.netloc.rpartition("@")[0] + f"@127.0.0.1:{port}"
        self.settings = replace(self.broker, url=urlunsplit(parts._replace(netloc=netloc)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    def acks(self, channel: int | None = None) -> list[Settle]:
        """The ``basic.ack`` frames (of one channel, when given), in the order they were sent."""
        return [s for s in self.settles if s.method == "ack" and channel in (None, s.channel)]

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        parts = urlsplit(self.broker.url)
        broker_reader, broker_writer = await asyncio.open_connection(parts.hostname, parts.port or 5672)
        up = asyncio.create_task(self._pump(client_reader, broker_writer, read_frames=True))
        down = asyncio.create_task(self._pump(broker_reader, client_writer, read_frames=False, deliveries=True))
        self._pumps.update((up, down))
        up.add_done_callback(self._pumps.discard)
        down.add_done_callback(self._pumps.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, read_frames: bool, deliveries: bool = False
    ) -> None:
        pending = b""
        header_seen = not read_frames
        try:
            while data := await reader.read(65536):
                if read_frames:
                    pending += data
                    if not header_seen and len(pending) >= 8:  # the protocol header: b"AMQP\x00\x00\x09\x01"
                        pending, header_seen = pending[8:], True
                    pending = self._read_frames(pending) if header_seen else pending
                elif deliveries:
                    pending = self._read_deliveries(pending + data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _read_frames(self, data: bytes) -> bytes:
        """Record the settlement frames among the whole frames at the start of ``data``; returns the rest."""
        while len(data) >= 7:
            kind, channel, size = struct.unpack(">BHI", data[:7])
            if len(data) < 7 + size + 1:
                break
            payload, data = data[7 : 7 + size], data[8 + size :]
            if kind != 1:  # method frames only
                continue
            class_id, method_id = struct.unpack(">HH", payload[:4])
            self.methods[class_id, method_id] += 1
            if class_id == 60 and method_id in SETTLE_METHODS:
                tag, bits = struct.unpack(">QB", payload[4:13])
                multiple = bool(bits & 1) and method_id != 90
                self.settles.append(Settle(SETTLE_METHODS[method_id], channel, tag, multiple))
                held = self.outstanding.setdefault(channel, set())
                if multiple:
                    held.difference_update({t for t in held if t <= tag})
                else:
                    held.discard(tag)
        return data

    def _read_deliveries(self, data: bytes) -> bytes:
        """Note the deliveries (``basic.deliver``, ``basic.get-ok``) among the whole frames of ``data``.

        Returns the bytes after the last whole frame.
        """
        while len(data) >= 7:
            kind, channel, size = struct.unpack(">BHI", data[:7])
            if len(data) < 7 + size + 1:
                break
            payload, data = data[7 : 7 + size], data[8 + size :]
            if kind != 1:
                continue
            class_id, method_id = struct.unpack(">HH", payload[:4])
            if class_id == 20 and method_id == 41:  # channel.close-ok: the broker took back what it held
                self.outstanding.pop(channel, None)
            if class_id != 60 or method_id not in (60, 71):
                continue
            at = 4 if method_id == 71 else 5 + payload[4]  # basic.deliver starts with the consumer tag
            (tag,) = struct.unpack(">Q", payload[at : at + 8])
            self.outstanding.setdefault(channel, set()).add(tag)
            self.peak_outstanding = max(self.peak_outstanding, sum(map(len, self.outstanding.values())))
        return data
