"""Which of its three reasons made the broker refuse ``connection.open``, asked of the management API.

RabbitMQ answers ``connection.open`` with 530 NOT_ALLOWED when the vhost does not exist, the
user has no permissions on it, or a connection limit is reached (the vhost's or the user's
``max-connections``: RabbitMQ "Virtual Hosts" and "User limits"); aiormq keeps no reply text
(:func:`~amqpjobs.wire.errors.refused_connect_reason`), so the words alone can't say which.
The management API can: :func:`refused_words` asks it (a few seconds at most) and names the
one that holds with its fix (a command naming this vhost and user, to paste as it is), else keeps the
three-way words. Of two limits set (the vhost's and the user's) only the one the listed connections reach is
named; both when the listing can't tell (a connection a moment old is not listed yet). Measured on 3.10: the
second child of ``consume --processes 2`` on a vhost with ``max-connections`` 4 was refused so.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any, Final
from urllib.parse import quote

from amqpjobs.errors import ManagementApiError
from amqpjobs.printable import shell_quote
from amqpjobs.wire.errors import open_refused, refused_connect_reason
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

#: Seconds the management API is given to say why (the refusal is said either way).
ASK_FOR = 5.0
#: How :func:`refused_words` words a ``max-connections`` limit (``whose``: ``vhost 'v'`` or ``user 'u'``).
LIMIT_WORDS: Final = "{whose} allows at most {most} connection(s) (max-connections)"
#: :data:`LIMIT_WORDS` read back (:func:`frees_a_slot`).
_LIMIT: Final = re.compile(re.escape(LIMIT_WORDS).replace(r"\{whose\}", ".*?").replace(r"\{most\}", r"(\d+)"))


def frees_a_slot(why: str) -> bool:
    """Whether a refusal worded ``why`` (:func:`refused_words`) is a ``max-connections`` of 1 or more.

    Only then does a connection's close make room for the one refused; under a limit of 0, a vhost
    gone or no permissions every connection is refused alike (and unknown words: no).
    """
    found = [int(n) for n in _LIMIT.findall(why)]
    return bool(found) and min(found) >= 1


async def refused_words(exc: BaseException, settings: BrokerSettings) -> str:
    """Why the broker refused ``connection.open`` (``exc``: what the client raised), with the fix when known."""
    general = refused_connect_reason(exc, settings.vhost, settings.username)
    if not open_refused(exc):
        return general
    with contextlib.suppress(Exception):  # the API unreachable, its user not allowed to look: the general words
        found = await asyncio.wait_for(asyncio.to_thread(_ask, settings), ASK_FOR)
        if found is not None:
            return found
    return general


def _limit(rows: Any, key: str) -> int | None:
    """The ``key`` limit of a ``/vhost-limits`` or ``/user-limits`` answer (None: not set, or -1: none)."""
    for row in rows if isinstance(rows, list) else []:
        value = (row.get("value") or {}).get(key) if isinstance(row, dict) else None
        if isinstance(value, int) and value >= 0:
            return value
    return None


def _ask(settings: BrokerSettings) -> str | None:
    vhost, user = settings.vhost, settings.username
    v, u = quote(vhost, safe=""), quote(user, safe="")
    with ManagementClient(settings, timeout=ASK_FOR) as mgmt:
        # an administrator's questions (3.10: 401 "Not administrator user" to a monitoring user): unknown then
        if _admin_only(mgmt, f"/vhosts/{v}") is None:
            return (f"vhost {vhost!r} does not exist: create it (rabbitmqctl add_vhost {shell_quote(vhost)}) or fix "
                    "the URL's path")  # fmt: skip
        if (allowed := _admin_only(mgmt, f"/permissions/{v}/{u}")) is None:
            return (f"user {user!r} has no permissions on vhost {vhost!r}: give them (rabbitmqctl set_permissions -p "
                    f"{shell_quote(vhost)} {shell_quote(user)} '.*' '.*' '.*'), or use another user")  # fmt: skip
        held = _held(mgmt, vhost, user)
        limits = []
        for rows, whose, fix, count in (
            (mgmt.request("GET", f"/vhost-limits/{v}", allow_404=True), f"vhost {vhost!r}",
             f"rabbitmqctl set_vhost_limits -p {shell_quote(vhost)} '{{\"max-connections\": N}}'", held[0]),
            (mgmt.request("GET", f"/user-limits/{u}", allow_404=True), f"user {user!r}",
             f"rabbitmqctl set_user_limits {shell_quote(user)} '{{\"max-connections\": N}}'", held[1]),
        ):  # fmt: skip
            if (most := _limit(rows, "max-connections")) is not None:
                text = f"{LIMIT_WORDS.format(whose=whose, most=most)}: raise it ({fix})"
                limits.append((text, count is not None and count >= most))
        # only those the connections listed reach; none (a new connection not listed yet, a count not told): all
        found = [text for text, reached in limits if reached] or [text for text, _ in limits]
        if found:
            unsure = (
                ""
                if allowed is not _UNKNOWN
                else f" (if not: does vhost {vhost!r} exist, with permissions for {user!r}?)"
            )
            return (f"{' and '.join(found)}; or run fewer worker processes or publishers there (a worker process "
                    f"holds 3 connections, 4 at its start with a ledger, README \"Backpressure\"){unsure}")  # fmt: skip
    return None


def _held(mgmt: ManagementClient, vhost: str, user: str) -> tuple[int | None, int | None]:
    """How many connections the API lists in ``vhost`` and of ``user`` (any vhost); None: it would not tell.

    A ``monitoring`` user or an administrator is told every connection; a ``management`` user only its own.
    """
    try:
        rows = mgmt.request("GET", "/connections?columns=user,vhost")
    except ManagementApiError:
        return None, None
    if not isinstance(rows, list):
        return None, None
    listed = [row for row in rows if isinstance(row, dict)]
    return sum(row.get("vhost") == vhost for row in listed), sum(row.get("user") == user for row in listed)


#: What :func:`_admin_only` returns when the API would not tell this user.
_UNKNOWN: Final = object()


def _admin_only(mgmt: ManagementClient, path: str) -> Any:
    """GET ``path`` (None: 404), or :data:`_UNKNOWN` when the API refuses this user the question (401, 403)."""
    try:
        return mgmt.request("GET", path, allow_404=True)
    except ManagementApiError as exc:
        if exc.status in (401, 403):
            return _UNKNOWN
        raise
