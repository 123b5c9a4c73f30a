"""What a failed management API request means, in words an operator can act on (no request made here).

:class:`~amqpjobs.wire.management.ManagementClient` sends; these say why an answer is no answer:
an API that can't be reached (each node tried, and why), a port that speaks plain HTTP to
``https``, a base URL where no API answers, a missing vhost, a refused login. Each names the
fix; none contains a credential (the user's name only).
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

import httpx

from amqpjobs.printable import shell_quote
from amqpjobs.wire.node_ports import amqp_refused
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.urls import CREDENTIALS_FIX


def plain_http(base: str, exc: Exception) -> str | None:
    """Why ``https`` to ``base`` failed when its port answers plain HTTP (``WRONG_VERSION_NUMBER``), or None."""
    cause: BaseException | None = exc
    while cause is not None and not (isinstance(cause, ssl.SSLError) and cause.reason == "WRONG_VERSION_NUMBER"):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    return (f"port {urlsplit(base).port or 443} does not speak TLS (it answers plain HTTP): use amqp:// when the "
            "broker has no TLS, else give --management-url http://... (or $AMQPJOBS_MANAGEMENT_URL), or the "
            "management API's TLS port")  # fmt: skip


def refused(base: str, user: str, resp: httpx.Response) -> str:
    """What a 401 from the API at ``base`` for ``user`` means: wrong credentials, or a user without a management tag.

    RabbitMQ answers both with 401; its body's ``reason`` tells them apart: ``Login failed``
    (``Not_Authorized`` on 4.0 and 4.3.6), or ``Not management user`` for a user whose tags
    give no management API access (RabbitMQ "Management Plugin" -> "Permissions":
    ``monitoring`` or ``management``, at least).
    """
    said = f"management API at {base} refused user {user!r} (401)"
    try:
        reason = str(resp.json().get("reason", ""))
    except (ValueError, AttributeError):
        reason = ""
    tag_fix = f"e.g. rabbitmqctl set_user_tags {shell_quote(user)} monitoring"
    if "not management user" in reason.lower():
        return f"{said}: the user has no management tag; give it one ({tag_fix}), or use another user"
    if reason.lower() in ("login failed", "not_authorized"):  # 3.10 says the first, 4.0 and 4.3.6 the second
        return f"{said}: {CREDENTIALS_FIX}"
    return f"{said}: {CREDENTIALS_FIX}, and that the user has a management tag ({tag_fix})"


def unreachable(settings: BrokerSettings, failures: list[tuple[str, str]]) -> str:
    """The message for management APIs that could not be reached: each one tried (base URL, why), and why."""
    hint = settings.management_hint
    down = amqp_refused(settings.nodes) if hint and all("refused" in why for _, why in failures) else ""
    if len(failures) == 1:
        base, why = failures[0]
        return f"management API at {base}{hint} unreachable: {why}{down}"
    each = "; ".join(f"{base}: {why}" for base, why in failures)
    return f"management API unreachable on each of {len(failures)} nodes{hint}: {each}{down}"


def no_api(base: str) -> str:
    """The message for a base URL where no management API answers (``/api`` appended, a wrong path)."""
    return (
        f"no RabbitMQ management API answers at {base} (GET {base}/api/overview -> 404): "
        "give the API's base URL, http(s)://host:port with no /api (--management-url or $AMQPJOBS_MANAGEMENT_URL)"
    )


def no_vhost(vhost: str, base: str) -> str:
    """The message for a 404 because ``vhost`` does not exist on the API at ``base``."""
    return (
        f"vhost {vhost!r} does not exist on {base} (the vhost is the AMQP URL's "
        f"path): fix the URL, or create it (rabbitmqctl add_vhost {shell_quote(vhost)})"
    )
