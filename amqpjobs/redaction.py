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


#: A web URL's user part with no password: a token (``https://TOKEN@github.com``; GitHub and GitLab
#: tokens are written so), all of it replaced. A broker's or database's user name (``amqp://guest@h``) is kept.
_WEB_USER: Final = re.compile(r"(?i)\b((?:[a-z][a-z0-9.\-]*\+)?(?:https?|wss?)://)[^\s:/?#@\[\]]+@")

#: A key naming a credential: ``password``, ``passwd``, ``secret``, ``token``, ``api_key``, ``access_key``, or a
#: longer key ending so (``db_password``, ``client_secret``, ``refresh_token``, ``aws_secret_access_key``).
_KEY: Final = r"[\w.\-]*(?:password|passwd|secret|token|api[_\-]?key|access[_\-]?key)"
_QUOTED: Final = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"

#: ``KEY=VALUE``: a URL query's pair (``?api_key=...&page=2``) or a libpq connection string's (PostgreSQL
#: "Connection Strings", keyword/value form: ``host=db user=app password=s3cret``, which allows blanks around
#: ``=`` for ``password``; a line of code in a traceback, ``token = next_token()``, is kept); bare or quoted.
_PAIR: Final = re.compile(rf"(?i)\b({_KEY}=|password\s*=\s*)(?:{_QUOTED}|[^\s&'\"]+)")

#: ``"KEY": VALUE`` of a JSON text or a Python dict's repr (an app's exception printing its config); the
#: value's quotes are kept (``'password': '***'``).
_ITEM: Final = re.compile(rf"(?i)([\"'])({_KEY})\1(\s*:\s*)(?:([\"'])(?:(?!\4)[^\\]|\\.)*\4|[^\s,}}\]]+)")

#: An HTTP ``Authorization`` header's credentials (RFC 9110 11.6.2), after its scheme (``Bearer``, ``Basic`` ...).
_AUTHORIZATION: Final = re.compile(
    r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?\s*(?:(?:bearer|basic|token|digest)\s+)?)[^\s'\",}]+"
)


def _item(match: re.Match[str]) -> str:
    quote = match.group(4) or ""
    return f"{match.group(1)}{match.group(2)}{match.group(1)}{match.group(3)}{quote}***{quote}"


def redact_text(text: str) -> str:
    """``text`` (any message) with every password, token or key in it replaced by ``***``.

    - the password of each ``scheme://user:password@`` (``"postgres://app:s3cret@db/orders"`` ->
      ``"postgres://app:***@db/orders"``), and a web URL's user part without one (a token:
      ``https://***@github.com/o/r``; ``amqp://guest@host`` keeps its user name);
    - the value of a ``KEY=VALUE`` pair (libpq ``password=***``, a URL query's ``?api_key=***&page=2``)
      and of a JSON or dict item (``{'password': '***'}``) whose key names a credential (:data:`_KEY`);
    - an ``Authorization`` header's credentials (``Authorization: Bearer ***``).

    Text with none of these is returned unchanged (one lower-cased copy looked at, no other).
    """
    if "://" in text:
        text = _USERINFO.sub(r"\1:***@", text)
        if "@" in text:
            text = _WEB_USER.sub(r"\1***@", text)
    low = text.lower()
    if "passw" in low or "secret" in low or "token" in low or "key" in low:
        if "=" in text:
            text = _PAIR.sub(r"\1***", text)
        if ":" in text:
            text = _ITEM.sub(_item, text)
    if "authorization" in low:
        text = _AUTHORIZATION.sub(r"\1***", text)
    return text
