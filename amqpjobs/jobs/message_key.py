"""A quarantined message's address: its job id, else a hash of what it holds (no I/O).

A message published without a ``message_id`` (and without our evidence's job id) still has
to be picked out, to replay, park or purge it alone (the console's checkboxes and message
page). Its key is ``sha256:`` and 16 hex digits of its headers and body: the same message
gets the same key each time it is browsed, and two messages differing in any header (an
``x-death`` time, say) or byte differ. Two identical messages share their key, so acting
on one acts on both. A position in the queue would not do: it changes as messages come and go.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

#: How a key that is not a job id starts.
KEY_PREFIX: Final = "sha256:"
#: Hex digits of the SHA-256 kept (64 bits: no collision among any queue's messages in practice).
KEY_LENGTH: Final = 16
#: How the job id a worker gives a delivery that came without ``message_id`` starts (its copies carry it).
GENERATED_PREFIX: Final = "generated-"


def generated_job_id() -> str:
    """A job id for a delivery that came without ``message_id``: ``generated-<uuid4>``, carried by its copies."""
    return f"{GENERATED_PREFIX}{uuid.uuid4()}"


def keyed_again(message_id: str | None, key: Callable[[Any], str] | None) -> bool:
    """Whether an idempotent job's delivery is keyed by its payload (:func:`unnamed_idempotency_key`).

    True without ``message_id``, and for a copy whose id the worker generated (:func:`generated_job_id`)
    of a job with a ``key`` function: its key needs the payload, read only after the crash screen, so a
    copy made before the run (a redelivery registered to run alone, a delivery handed back) carries
    a generated id; keyed again where it runs, it finds the claim or done-mark of its first run.
    """
    return not message_id or (key is not None and message_id.startswith(GENERATED_PREFIX))


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
    non-empty ``str``, else :func:`message_key` of ``headers`` and ``body``: the same each time
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
    return message_key("", headers, body)
