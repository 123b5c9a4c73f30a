"""A message RabbitMQ holds but cannot deliver over AMQP 0-9-1, made into one it can (pure, no I/O).

AMQP 0-9-1 carries the basic properties ``content_type``, ``message_id``, ``correlation_id``
... and every header name as a short string: at most 255 bytes. RabbitMQ 3.10 stores a message
that breaks this when it comes in through the management API's HTTP publish (RabbitMQ 4.3
refuses that with 506, but takes an AMQP 1.0 ``content-type`` over 255 bytes); every delivery
of it then fails in the broker (``content_properties_shortstr_overflow``) and closes the
reading connection with 541 (README "Wire format"). The management API's "Get messages"
still reads it, as JSON (``properties``: the property names of AMQP 0-9-1, ``headers`` a JSON
object). This module says whether such a read message is one of those, and builds the copy
that goes to quarantine instead: each long property value moved into a header
``amqpjobs-undeliverable-<property>`` (a header *value* is a long string: up to 4 GiB), each
header entry whose name (or a name inside its nested tables) is too long moved, as JSON text,
into ``amqpjobs-undeliverable-headers``, and the evidence of :mod:`amqpjobs.jobs.evidence`
(reason ``undeliverable``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from amqpjobs.jobs.message_key import PAYLOAD_KEY

#: AMQP 0-9-1 short strings hold at most this many bytes (AMQP 0-9-1 "Field types": shortstr).
SHORTSTR_MAX: Final = 255
#: The basic properties that are short strings, in the management API's names.
SHORTSTR_PROPERTIES: Final = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                              "message_id", "type", "user_id", "app_id", "cluster_id")  # fmt: skip
#: Prefix of the header holding a property value too long for a property (``+ "correlation_id"`` ...).
MOVED_PREFIX: Final = "amqpjobs-undeliverable-"
#: Header holding, as JSON text, the header entries whose names are too long (``{name: value}``).
MOVED_HEADERS: Final = "amqpjobs-undeliverable-headers"
#: Header holding the original's :func:`fingerprint` (a SHA-256 in hex).
FINGERPRINT: Final = "amqpjobs-undeliverable-sha256"
#: The broker's per-delivery counters: not part of what a message is (they change with each read).
_COUNTERS: Final = frozenset({"x-delivery-count", "x-acquired-count"})


def _too_long(text: object) -> bool:
    return isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) > SHORTSTR_MAX


def _long_name_inside(value: object) -> bool:
    """Whether a header value (a JSON object = an AMQP table, a list = an array) holds a name over 255 bytes."""
    if isinstance(value, Mapping):
        return any(_too_long(k) or _long_name_inside(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_long_name_inside(v) for v in value)
    return False


def overflows(properties: Mapping[str, Any]) -> list[str]:
    """What AMQP 0-9-1 can't carry in a message's properties (as the management API reads them).

    Args:
        properties: The ``properties`` object of a management API "Get messages" answer.

    Returns:
        One phrase per problem (``"correlation_id is 300 bytes"``, ``"header name 'hhh…' is 300
        bytes"``), empty when a 0-9-1 client can receive the message.

    """
    problems = [f"{name} is {len(str(properties[name]).encode('utf-8', 'surrogatepass'))} bytes"
                for name in SHORTSTR_PROPERTIES if _too_long(properties.get(name))]  # fmt: skip
    headers = properties.get("headers")
    if isinstance(headers, Mapping):
        for name, value in headers.items():
            if _too_long(name):
                problems.append(f"header name {name[:16]!r}… is {len(name.encode('utf-8', 'surrogatepass'))} bytes")
            elif _long_name_inside(value):
                problems.append(f"header {name!r} holds a table with a name over {SHORTSTR_MAX} bytes")
    return problems


def fingerprint(properties: Mapping[str, Any], body: bytes) -> str:
    """A SHA-256 (hex) of one message: its properties (the broker's delivery counters aside) and body.

    Two reads of the same message give the same fingerprint; a removal checks with it that it
    took the message it copied.
    """
    props = dict(properties)
    if isinstance(headers := props.get("headers"), Mapping):
        props["headers"] = {k: v for k, v in headers.items() if k not in _COUNTERS}
    digest = hashlib.sha256(json.dumps(props, sort_keys=True, ensure_ascii=True).encode())
    digest.update(b"\0")
    digest.update(body)
    return digest.hexdigest()


@dataclass(frozen=True)
class Sanitized:
    """The copy of an undeliverable message that a 0-9-1 client can receive.

    Attributes:
        properties: The basic properties that fit (management API names), without ``headers``.
        headers: The header table that fits, plus the moved values (:data:`MOVED_PREFIX`,
            :data:`MOVED_HEADERS`) and :data:`FINGERPRINT`.
        problems: What was too long (:func:`overflows`), for the evidence.
        job_id: The job id the copy carries: the ``message_id`` when it fits, else
            ``undeliverable-<first 32 hex digits of the fingerprint>``.
        job: The job name (``type``) when it fits, else ``""``.

    """

    properties: dict[str, Any]
    headers: dict[str, Any]
    problems: list[str]
    job_id: str
    job: str


def sanitize(properties: Mapping[str, Any], body: bytes) -> Sanitized:
    """The copy of a message :func:`overflows` found problems in (see the module's docstring).

    The broker's ``x-delivery-count``/``x-acquired-count`` are left out (a copy is a new message).
    Header values keep their JSON types (the management API reads an AMQP timestamp as an
    integer, a byte array as text): the evidence is the values, not their AMQP field types.
    """
    print_ = fingerprint(properties, body)
    props = {k: v for k, v in properties.items() if k != "headers"}
    headers: dict[str, Any] = {}
    moved_headers: dict[str, Any] = {}
    for name, value in (properties.get("headers") or {}).items():
        if name in _COUNTERS:
            continue
        if _too_long(name) or _long_name_inside(value):
            moved_headers[name] = value
        else:
            headers[name] = value
    for name in SHORTSTR_PROPERTIES:
        if _too_long(props.get(name)):
            headers[MOVED_PREFIX + name] = props.pop(name)
    if moved_headers:
        headers[MOVED_HEADERS] = json.dumps(moved_headers, ensure_ascii=False)
    headers[FINGERPRINT] = print_
    job_id = props.get("message_id") or f"undeliverable-{print_[:32]}"
    if not props.get("message_id"):  # an id of ours: an idempotent job is keyed by it or its key function
        headers[PAYLOAD_KEY] = job_id  # (README "Idempotency"), the same for an identical message
    props["message_id"] = job_id
    return Sanitized(props, headers, overflows(properties), str(job_id), str(props.get("type") or ""))
