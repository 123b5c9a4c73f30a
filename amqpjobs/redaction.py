"""Passwords out of text: the one rule for every URL's ``user:password@`` in a message, log line or record.

A broker URL is redacted where amqpjobs prints it (:func:`amqpjobs.wire.urls.redact`); an app's own
URLs reach us in its exceptions (``could not connect to postgres://app:s3cret@db/orders``), and
from there a log line, quarantine evidence, an outcome event, the results store and a span. Each
of those writes the text through :func:`redact_text` (the brief: never log credentials).
"""

from __future__ import annotations

import re
from typing import Final

#: ``scheme://user:password@`` anywhere in a text: the password is everything up to the last ``@``
#: before a blank or the next ``scheme://`` (so an unencoded ``@``, ``#``, ``/``, ``,`` or ``;`` in it,
#: all of which RFC 3986 3.2.1 lets a password hold or people write, is covered too; a list of URLs
#: keeps its hosts).
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/?#@,;\[\]]*):(?:(?![a-z][a-z0-9+.\-]*://)\S)*@")


#: A ``password=...`` pair of a libpq connection string (PostgreSQL "Connection Strings", keyword/value form:
#: ``host=db user=app password=s3cret``), its value bare or in single quotes (``\'`` inside).
_KEYWORD: Final = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'][^\s]*)")


def redact_text(text: str) -> str:
    """``text`` (any message) with every password in it replaced by ``***``.

    The password of each ``scheme://user:password@`` (``"postgres://app:s3cret@db/orders"`` ->
    ``"postgres://app:***@db/orders"``) and the value of each libpq ``password=`` pair
    (``"host=db password=s3cret"`` -> ``"host=db password=***"``). A URL without a password
    (``amqp://guest@host``), and text with neither, are returned unchanged.
    """
    if "://" in text:
        text = _USERINFO.sub(r"\1:***@", text)
    if "=" in text and ("assword" in text or "ASSWORD" in text):  # no copy of the line for the common case
        text = _KEYWORD.sub(r"\1***", text)
    return text
