"""Decoding a received Basic.Deliver or Basic.GetOk method frame in one pass, as pamqp would.

Every message a worker receives starts with one of these two method frames (a consumer's
delivery, or the answer to a ``basic.get``). pamqp decodes a frame through a chain of
calls: the protocol header check, the frame parts, the method index, a fresh command
object (validating its default exchange name by regex), then each field by type name, one
slice of the rest at a time, and our lenient short-string rule
(:mod:`amqpjobs.wire.lenient_decoding`) wraps three of those calls again. On a worker
draining small jobs that cost as much as the content header did. :func:`decode` reads the
same frame with offsets into one ``bytes`` and gives exactly the command pamqp gives with
those rules installed (the same attributes, values and types):

* a short string that is not UTF-8: U+FFFD for its bad bytes (the lenient rule);
* the delivery tag read as a *signed* 64-bit integer, as pamqp reads a ``longlong``
  (a tag of ``2**64 - 1`` is ``-1``), the message count unsigned 32-bit;
* ``redelivered`` the lowest bit of its octet, the other bits ignored;
* no validation of the decoded values (pamqp validates only the defaults it starts from:
  an exchange name of 255 characters decodes).

It only decodes a whole frame that its fields fill exactly: a frame cut short, with bytes
after its end or after the last field, a short string running past the end... and it
returns None, and :func:`unmarshal` leaves the frame to pamqp (:data:`pamqp_unmarshal`),
which decodes or refuses it as it always did (loosely in places: a short string past the
end is read short). Every other frame (other methods, content headers and bodies,
heartbeats) goes to pamqp untouched. :func:`install_method_decoding` puts :func:`unmarshal`
where aiormq calls pamqp (``pamqp.frame.unmarshal``, looked up on every frame read).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pamqp.frame
from pamqp import commands

from amqpjobs.wire.lenient_decoding import install_lenient_decoding

#: A decoded frame as ``pamqp.frame.unmarshal`` returns it: bytes consumed, channel, frame.
Unmarshaled = tuple[int, int, pamqp.frame.FrameTypes]

#: pamqp's own ``pamqp.frame.unmarshal``, kept before anything replaces it: the fallback.
pamqp_unmarshal: Callable[[bytes], Unmarshaled] = pamqp.frame.unmarshal

_Deliver = commands.Basic.Deliver
_GetOk = commands.Basic.GetOk
_HEAD = struct.Struct(">BHIL")  # frame type, channel, payload size, method index (class id, method id)
_TAG = struct.Struct(">qB")  # delivery tag (signed, as pamqp reads it), the octet of bits
_COUNT = struct.Struct(">L")
_METHOD_FRAME = 1  # frame type
_METHOD_FRAME_OCTET = bytes([_METHOD_FRAME])
_FRAME_END = 0xCE
_DELIVER_INDEX = _Deliver.index
_GET_OK_INDEX = _GetOk.index


def decode(data: bytes) -> Unmarshaled | None:
    """A Basic.Deliver or Basic.GetOk frame decoded, as pamqp decodes it with our lenient rules.

    Args:
        data: One whole frame as aiormq reads it: type, channel, size, payload, frame end.

    Returns:
        ``(bytes consumed, channel, command)`` as ``pamqp.frame.unmarshal`` returns them,
        the command built without pamqp's defaults-validation; or None: not one of these two
        methods, or not a frame this reads strictly (cut short, bytes after its end or after
        its last field, a string past the end), and pamqp is to decode or refuse it.
        Never raises.
    """
    size = len(data)
    if size < 12 or data[0] != _METHOD_FRAME or type(data) is not bytes:
        return None
    _, channel, payload_size, index = _HEAD.unpack_from(data)
    end = size - 1  # the frame-end octet
    if payload_size + 7 != end or data[end] != _FRAME_END:
        return None
    if index == _DELIVER_INDEX:
        offset = 12 + data[11]  # after the consumer tag
    elif index == _GET_OK_INDEX:
        offset = 11
    else:
        return None
    exchange_end = offset + 10 + data[offset + 9] if offset + 10 <= end else end  # after tag, bits, exchange
    if exchange_end >= end:  # no room for the routing key's length
        return None
    key_end = exchange_end + 1 + data[exchange_end]
    tag, bits = _TAG.unpack_from(data, offset)
    frame: _Deliver | _GetOk
    if index == _DELIVER_INDEX:
        if key_end != end:
            return None
        frame = deliver = _Deliver.__new__(_Deliver)
        deliver.consumer_tag = data[12:offset].decode("utf-8", "replace")
    else:
        if key_end + 4 != end:
            return None
        frame = get_ok = _GetOk.__new__(_GetOk)
        get_ok.message_count = _COUNT.unpack_from(data, key_end)[0]
    frame.delivery_tag = tag
    frame.redelivered = bits & 1 != 0
    frame.exchange = data[offset + 10 : exchange_end].decode("utf-8", "replace")
    frame.routing_key = data[exchange_end + 1 : key_end].decode("utf-8", "replace")
    return size, channel, frame


def unmarshal(data_in: bytes) -> Unmarshaled:
    """Decode one frame, as ``pamqp.frame.unmarshal`` does (with our lenient rules).

    A Basic.Deliver or Basic.GetOk the fast way (:func:`decode`) when it reads the frame;
    anything else pamqp's own way, which raises what it always raised.

    Raises:
        pamqp.exceptions.UnmarshalingException: the frame can't be decoded (pamqp).
    """
    if data_in[:1] == _METHOD_FRAME_OCTET:  # a content header, a body, a heartbeat: straight to pamqp
        decoded = decode(data_in)
        if decoded is not None:
            return decoded
    return pamqp_unmarshal(data_in)


def install_method_decoding() -> None:
    """Make every frame aiormq reads go through :func:`unmarshal` (idempotent).

    aiormq calls ``pamqp.frame.unmarshal`` by module attribute for each frame it reads.
    Only pamqp's own is replaced: a hook someone else put there (a test capturing the
    frames it receives) is left in place, and frames keep going through it to pamqp. The
    lenient rules the fast path follows are installed for pamqp too
    (:func:`~amqpjobs.wire.lenient_decoding.install_lenient_decoding`).
    """
    install_lenient_decoding()
    if pamqp.frame.unmarshal is pamqp_unmarshal:
        pamqp.frame.unmarshal = unmarshal
