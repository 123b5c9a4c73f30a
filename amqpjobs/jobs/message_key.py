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
from collections.abc import Mapping
from typing import Any, Final

#: How a key that is not a job id starts.
KEY_PREFIX: Final = "sha256:"
#: Hex digits of the SHA-256 kept (64 bits: no collision among any queue's messages in practice).
KEY_LENGTH: Final = 16


def message_key(job_id: str, headers: Mapping[str, Any], body: bytes) -> str:
    """``job_id`` when it has one, else ``sha256:<16 hex>`` of ``headers`` (canonical JSON) and ``body``."""
    if job_id:
        return job_id
    digest = hashlib.sha256(json.dumps(headers, sort_keys=True, ensure_ascii=True, default=repr).encode("ascii"))
    digest.update(b"\x00")
    digest.update(body)
    return KEY_PREFIX + digest.hexdigest()[:KEY_LENGTH]
