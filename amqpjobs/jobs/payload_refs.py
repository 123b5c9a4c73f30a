"""Payload references (claim-check): the text of the ``amqpjobs-payload-ref`` header, as plain data.

A job whose payload is kept in a payload store (README "Large payloads") is published with an
empty body and the header ``amqpjobs-payload-ref: "<store>:<key>"``:

* ``<store>``: the name of the store that holds it (``file``, ``postgres``, ``s3`` by default,
  or the name given to the store), 1-63 characters ``[a-z0-9-]``, starting with a letter;
* ``<key>``: the payload's key in that store, 1-200 characters ``[A-Za-z0-9._-]``, starting
  with a letter or digit (a file name, a primary key, an S3 object name: never a path).

The worker loads the payload before the handler. What can go wrong is a quarantine reason
(never a crash, never a dropped message): :data:`REASONS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from amqpjobs.jobs.header_values import amqp_type
from amqpjobs.text import as_text

#: Quarantine reasons of a job whose stored payload can't be had, and what each means.
REASONS: Final = {
    "payload-ref-invalid": "the amqpjobs-payload-ref header is not '<store>:<key>' text",
    "payload-store-unknown": "the reference names a store this worker does not have (or it has none)",
    "payload-missing": "the store holds no payload under the key (deleted after success + grace, or never stored)",
    "payload-store-error": "the store failed to read it (down, no access) on every attempt; replay once it is back",
}

_STORE = re.compile(r"[a-z][a-z0-9-]{0,62}")
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class PayloadRefError(Exception):
    """A stored payload that can't be had.

    Attributes:
        reason: Quarantine reason, one of :data:`REASONS`.
        detail: What exactly was wrong, and how to fix it.

    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class PayloadRef:
    """A parsed reference: store name and key (see the module docstring for the rules)."""

    store: str
    key: str

    def __str__(self) -> str:
        return f"{self.store}:{self.key}"


def store_name_problem(name: str) -> str | None:
    """Why ``name`` can't name a payload store, or None."""
    if not _STORE.fullmatch(name):
        return f"payload store name {name!r} must be 1-63 characters a-z, 0-9 or '-', starting with a letter"
    return None


def key_problem(key: str) -> str | None:
    """Why ``key`` can't be a stored payload's key, or None."""
    if not _KEY.fullmatch(key):
        return f"payload key {key[:60]!r} must be 1-200 characters A-Z, a-z, 0-9, '.', '_', '-', not starting with '.'"
    return None


def parse_ref(value: Any) -> PayloadRef:
    """Parse an ``amqpjobs-payload-ref`` header value (text or UTF-8 bytes).

    Raises:
        PayloadRefError: reason ``payload-ref-invalid``, naming what is wrong.

    """
    if not isinstance(value, str | bytes | bytearray):
        raise PayloadRefError(
            "payload-ref-invalid", f"header amqpjobs-payload-ref is {amqp_type(value)}, not '<store>:<key>' text"
        )
    text = as_text(value)
    store, sep, key = text.partition(":")
    problem = "no ':' between store and key" if not sep else store_name_problem(store) or key_problem(key)
    if problem:
        raise PayloadRefError(
            "payload-ref-invalid", f"header amqpjobs-payload-ref {text[:120]!r} is not '<store>:<key>': {problem}"
        )
    return PayloadRef(store, key)
