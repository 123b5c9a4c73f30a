"""A quarantined message's address: its job id, else a hash of what it holds (no I/O).

A message published without a ``message_id`` (and without our evidence's job id) still has
to be picked out, to replay, park or purge it alone (the console's checkboxes and message
page). Its key is ``sha256:`` and 16 hex digits of its headers and body: the same message
gets the same key each time it is browsed, and two messages differing in any header (an
``x-death`` time, say) or byte differ. Two identical messages share their key, so acting
on one acts on both. A position in the queue would not do: it changes as messages come and go.

Also the idempotency key of such a message (README "Idempotency"), the one rule: :func:`payload_key`
(the broker's headers left out), carried by every copy of ours in :data:`PAYLOAD_KEY`, which tells
an id a worker gave (:func:`ours`) from a publisher's, and :func:`keyed_again`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from amqpjobs.jobs.copy_headers import strip_broker_headers

#: How a key that is not a job id starts.
KEY_PREFIX: Final = "sha256:"
#: Hex digits of the SHA-256 kept (64 bits: no collision among any queue's messages in practice).
KEY_LENGTH: Final = 16
#: How the job id a worker gives a delivery that came without ``message_id`` starts (its copies carry it).
GENERATED_PREFIX: Final = "generated-"


#: The header every copy of a message that came without ``message_id`` carries (one a worker gave an id):
#: the message's idempotency key as it came (:func:`payload_key`). It marks the copy's id as ours.
PAYLOAD_KEY: Final = "amqpjobs-payload-key"
#: A copy made before :data:`PAYLOAD_KEY` existed: ``generated-`` and a uuid4 as :func:`generated_job_id` writes it.
_OLD_COPY_ID: Final = re.compile(r"generated-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def generated_job_id() -> str:
    """A job id for a delivery that came without ``message_id``: ``generated-<uuid4>``, carried by its copies.

    Its copies carry :data:`PAYLOAD_KEY` too (:func:`with_payload_key`): what tells our id from a publisher's.
    """
    return f"{GENERATED_PREFIX}{uuid.uuid4()}"


def payload_key(headers: Mapping[str, Any], body: bytes) -> str:
    """The key of a message come without ``message_id``: ``sha256:<16 hex>`` of it as it first came.

    :data:`PAYLOAD_KEY`'s value on a copy of ours (whose own headers differ: an attempt, evidence,
    an enqueue time), else :func:`message_key` of ``headers`` without the broker's (``x-death``, a
    quorum queue's ``x-delivery-count``: a redelivery's) and ``body``.
    """
    given = headers.get(PAYLOAD_KEY)
    if isinstance(given, str) and given:
        return given
    return message_key("", strip_broker_headers(headers), body)


def with_payload_key(headers: Mapping[str, Any], body: bytes) -> dict[str, Any]:
    """``headers`` with :data:`PAYLOAD_KEY` (:func:`payload_key`): a delivery without ``message_id``, kept so.

    Every copy of it (hand-back, retry tier, quarantine, park, waiting room) then carries its key.
    """
    return {**headers, PAYLOAD_KEY: payload_key(headers, body)}


def ours(message_id: str, headers: Mapping[str, Any]) -> bool:
    """Whether ``message_id`` is one a worker gave a message that came without one (README "Idempotency").

    True for a copy carrying :data:`PAYLOAD_KEY` whose id is that key or a :func:`generated_job_id`,
    and for a copy made before that header (a ``generated-<uuid4>`` id, no header: still in queues).
    A publisher's own id is never ours, ``generated-...`` ones included (then it has no such header).
    """
    given = headers.get(PAYLOAD_KEY)
    if isinstance(given, str) and given:
        return message_id == given or message_id.startswith(GENERATED_PREFIX)
    return given is None and _OLD_COPY_ID.fullmatch(message_id) is not None


def keyed_again(message_id: str | None, headers: Mapping[str, Any], key: Callable[[Any], str] | None) -> bool:
    """Whether an idempotent job's delivery is keyed by its payload (:func:`unnamed_idempotency_key`), not its id.

    True without ``message_id``, and for a copy whose id a worker gave (:func:`ours`): its key
    function's value (a copy made before the run needs the payload, read only after the crash
    screen), or :func:`payload_key`, the key of the message as it came. A copy made before
    :data:`PAYLOAD_KEY` existed (no header) of a job without a key function keeps its id, as then.
    """
    if not message_id:
        return True
    return ours(message_id, headers) and (key is not None or PAYLOAD_KEY in headers)


def message_key(job_id: str, headers: Mapping[str, Any], body: bytes) -> str:
    """``job_id`` when it has one, else ``sha256:<16 hex>`` of ``headers`` (canonical JSON) and ``body``."""
    if job_id:
        return job_id
    digest = hashlib.sha256(json.dumps(headers, sort_keys=True, ensure_ascii=True, default=repr).encode("ascii"))
    digest.update(b"\x00")
    digest.update(body)
    return KEY_PREFIX + digest.hexdigest()[:KEY_LENGTH]


def unnamed_idempotency_key(
    key: Callable[[Any], str] | None, payload: Any, headers: Mapping[str, Any], body: bytes
) -> str:
    """The idempotency key of a delivery that came without a ``message_id`` (a publisher of another stack).

    The job's ``key`` function of the validated ``payload`` when it has one and it gives a
    non-empty ``str``, else :func:`payload_key` of ``headers`` and ``body``: the same each time
    the broker redelivers it, so a redelivery finds the claim or done-mark of its first run
    (a random id per delivery ran the effect twice). Two identical such messages count as one.
    """
    if key is not None:
        try:
            derived = key(payload)
        except Exception:  # the enqueue side refuses such a key; here the hash still keys it
            derived = None
        if isinstance(derived, str) and derived:
            return derived
    return payload_key(headers, body)
