"""A message to publish, as plain data: shared by ``jobs/`` (which builds them) and ``wire/`` (which sends them).

Imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

#: The content type of a job message (README "Wire format").
CONTENT_TYPE: Final = "application/json"
#: Tables and arrays nested deeper than this inside a header value: a worker decodes what is
#: deeper as None (:mod:`amqpjobs.wire.header_decoding`), so ``enqueue`` refuses them
#: (:mod:`amqpjobs.jobs.header_names`).
MAX_NESTING: Final = 64
#: What the names of our headers start with (:mod:`amqpjobs.jobs.envelope`); reserved to us.
OUR_PREFIX: Final = "amqpjobs-"


def broker_refuses_float(value: object) -> bool:
    """Whether ``value`` is a float RabbitMQ refuses in a header: NaN or an infinity.

    pamqp encodes it; RabbitMQ (3.10 to 4.3, measured) then closes the publisher's whole
    connection with ``INTERNAL_ERROR`` (541), failing the publishes beside it. The one rule:
    ``enqueue`` (:mod:`amqpjobs.jobs.header_names`) and every publish, the double's too
    (:func:`amqpjobs.wire.limits.check_fits`), refuse it before anything is sent.
    """
    return isinstance(value, float) and (value != value or value in (float("inf"), float("-inf")))


@dataclass(frozen=True)
class OutgoingMessage:
    """A message to publish, in our own types (the wire turns it into an AMQP message).

    Attributes:
        body: Raw body bytes.
        headers: Header table (str/int/bool/bytes/nested values).
        content_type: ``content_type`` property or None.
        content_encoding: ``content_encoding`` property or None.
        message_id: ``message_id`` (job id) or None.
        type: ``type`` (job name) or None.
        timestamp: ``timestamp`` (seconds since the epoch) or None.
        priority: ``priority`` or None.
        correlation_id / reply_to / app_id: copied through when republishing.

    """

    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    content_type: str | None = CONTENT_TYPE
    content_encoding: str | None = None
    message_id: str | None = None
    type: str | None = None
    timestamp: float | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    app_id: str | None = "amqpjobs"
