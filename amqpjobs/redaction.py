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


def redact_text(text: str) -> str:
    """``text`` (any message) with the password of every ``scheme://user:password@`` in it replaced by ``***``.

    ``"postgres://app:s3cret@db/orders"`` -> ``"postgres://app:***@db/orders"``; a URL without a
    password (``amqp://guest@host``), and text without ``://``, are returned unchanged.
    """
    return _USERINFO.sub(r"\1:***@", text) if "://" in text else text
