"""Decoding a job message's body: a JSON object in UTF-8, strict, or a :class:`DecodeError` (no client library).

The wire format (README "Wire format", :mod:`amqpjobs.jobs.envelope`) says a body is a
UTF-8 JSON object. :func:`decode_body` reads one and never raises anything but
:class:`DecodeError`, whose ``reason`` says where a message that cannot be decoded goes
(quarantine reason).
"""

from __future__ import annotations

from typing import Any

from amqpjobs.jobs.json_fast import MAX_JSON_DEPTH, fast_object, strict_loads
from amqpjobs.message import CONTENT_TYPE


class DecodeError(Exception):
    """A message body or property that can't be turned into a job.

    Attributes:
        reason: Quarantine reason: ``undecodable``, ``unsupported-content-type``,
            ``invalid-payload`` or ``unknown-job``.
        detail: What exactly was wrong.

    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def _depth_ok(text: str) -> bool:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # fast path: can't be deeper than that
        return True
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def decode_body(
    body: bytes, content_type: str | None, content_encoding: str | None, what: str = "body"
) -> dict[str, Any]:
    """Decode a job body into its JSON object.

    Rules (README "Wire format" → "What the worker accepts"):

    * ``content_type`` must be ``application/json`` (parameters such as ``; charset=utf-8``
      allowed) or absent (then the body is read as JSON);
    * ``content_encoding`` must be absent, ``identity`` or ``utf-8``;
    * the body must be UTF-8 (a leading byte-order mark is accepted and skipped) and
      strict JSON (no ``NaN``/``Infinity``, no number too large for a float: ``1e400``),
      nested at most :data:`MAX_JSON_DEPTH` deep;
    * the top level must be an object.

    ``what`` names ``body`` in the error messages (``"stored payload 'file:k'"`` for a payload
    kept in a payload store, README "Large payloads").

    Raises:
        DecodeError: ``unsupported-content-type``, ``undecodable`` or ``invalid-payload``.

    """
    if content_type is not None and content_type != CONTENT_TYPE:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != CONTENT_TYPE:
            raise DecodeError(
                "unsupported-content-type",
                f"content_type {content_type[:100]!r}; expected {CONTENT_TYPE!r}: publish the job with content_type "
                f"{CONTENT_TYPE}, or none",
            )
    if content_encoding not in (None, "", "identity", "utf-8", "UTF-8"):
        raise DecodeError(
            "undecodable",
            f"content_encoding {content_encoding[:100]!r} is not supported: publish the body as plain UTF-8 JSON, "
            "with content_encoding none, identity or utf-8",
        )
    if (fast := fast_object(body, MAX_JSON_DEPTH)) is not None:  # orjson, where it decides as the rest would
        return fast
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("undecodable", f"{what} is not UTF-8{_charset_said(content_type)}: {exc}") from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DecodeError("undecodable", f"{what} is empty")
    if not _depth_ok(text):
        raise DecodeError("undecodable", f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = strict_loads(text)
    except (ValueError, RecursionError) as exc:
        raise DecodeError("undecodable", f"{what} is not JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise DecodeError(
            "invalid-payload",
            f"{'payload' if what == 'body' else what} must be a JSON object, got {type(value).__name__}",
        )
    return value


def _charset_said(content_type: str | None) -> str:
    """`` (its content_type says charset=latin-1; ...)`` when ``content_type`` names a charset other than UTF-8."""
    for part in (content_type or "").split(";")[1:]:
        name, _, value = part.partition("=")
        charset = value.strip().strip('"')
        if name.strip().lower() == "charset" and charset.lower().replace("-", "") != "utf8":
            return f" (its content_type says charset={charset[:40]}; only UTF-8 is read: publish it as UTF-8)"
    return ""
