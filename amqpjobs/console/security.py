"""The console's guard: Host allow-list, authentication, CSRF and read-only, before any route runs.

- Host: a request naming a host not on the allow-list is refused (403) even on loopback: a
  page of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) names its own.
- Authentication (beyond loopback): ``Authorization: Bearer <token>``, or basic auth with the
  user and password (or any user and the token as password); else 401 asking for basic auth.
- CSRF: every POST carries the console's token (form field ``csrf_token`` or header
  ``X-CSRF-Token``), a random value of this process shown only in its pages; else 403.
- ``--read-only``: every POST is refused (403).

Each answer carries a Content-Security-Policy allowing scripts from the console itself only,
so even markup that escaped escaping could run no inline script.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from typing import Final
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from amqpjobs.console.config import ConsoleConfig

CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
SECURITY_HEADERS: Final = (
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)  # fmt: skip
#: Largest POST body read for the CSRF check (forms are small).
MAX_FORM: Final = 1 << 20


def host_name(header: str) -> str:
    """The name of a Host header, without port or IPv6 brackets, lower case."""
    if header.startswith("["):
        return header[1 : header.find("]")].lower() if "]" in header else header.lower()
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


class Guard:
    """ASGI middleware enforcing the rules of the module docstring; sets ``scope["state"]["user"]``."""

    def __init__(self, app: ASGIApp, config: ConsoleConfig, csrf_token: str | None = None) -> None:
        self.app = app
        self.config = config
        self.hosts = config.host_names()
        self.csrf_token = csrf_token or secrets.token_urlsafe(32)

    def who(self, headers: Headers) -> str | None:
        """The authenticated user ("token" for a bearer token), "" when none is required, None when refused."""
        creds = self.config.credentials
        if not creds.required:
            return ""
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and creds.token and hmac.compare_digest(value.encode(), creds.token.encode()):
            return "token"
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        same_user = bool(creds.user) and hmac.compare_digest(user.encode(), (creds.user or "").encode())
        if same_user and creds.password and hmac.compare_digest(password.encode(), creds.password.encode()):
            return user
        if creds.token and hmac.compare_digest(password.encode(), creds.token.encode()):
            return user or "token"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse what the rules refuse; pass the rest on with the security headers added."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        refusal = self._refusal(headers, scope["method"])
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        scope.setdefault("state", {})["user"] = self.who(headers) or ""
        scope["state"]["csrf_token"] = self.csrf_token
        if scope["method"] != "POST":
            await self.app(scope, receive, secured)
            return
        body, receive = await _buffered(receive)
        if body is None:
            await PlainTextResponse("request body too large", 413)(scope, receive, secured)
            return
        if not self._csrf_ok(headers, body):
            await PlainTextResponse("missing or wrong CSRF token: reload the page and try again", 403)(
                scope, receive, secured
            )
            return
        await self.app(scope, receive, secured)

    def _refusal(self, headers: Headers, method: str) -> Response | None:
        if host_name(headers.get("host", "")) not in self.hosts:
            return PlainTextResponse("unknown Host header: open the console by the address it listens on", 403)
        if self.who(headers) is None:
            return PlainTextResponse(
                "authentication required", 401, headers={"WWW-Authenticate": 'Basic realm="amqpjobs console"'}
            )
        if method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("method not allowed", 405)
        if method == "POST" and self.config.read_only:
            return PlainTextResponse("this console is read-only (--read-only): no action is allowed", 403)
        return None

    def _csrf_ok(self, headers: Headers, body: bytes) -> bool:
        given = headers.get(CSRF_HEADER)
        if given is None and headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            values = parse_qs(body.decode("latin-1"), keep_blank_values=True).get(CSRF_FIELD) or [""]
            given = values[0]
        return given is not None and given != "" and hmac.compare_digest(given.encode(), self.csrf_token.encode())


async def _buffered(receive: Receive) -> tuple[bytes | None, Receive]:
    """Read the whole request body (None past :data:`MAX_FORM`) and a ``receive`` that replays it."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_FORM:
            return None, receive
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay
