"""A connection's channels against the broker's per-connection and per-user limits (README "Workers").

RabbitMQ closes a whole connection with ``530 NOT_ALLOWED`` when it opens a channel past the
negotiated ``channel_max`` (``rabbit.channel_max``, 2047 by default) or past a user's or
vhost's ``max-channels`` limit (``rabbitmqctl set_user_limits``). aio-pika's robust connection
then reconnects, restores the same channels and meets the same refusal, every 5 s for ever: a
worker that logged ``consuming`` and never exits. This module reads how many channels a
connection holds and what it may hold (:func:`channel_room`), and words such a close with its
fix (:func:`limit_fix`). Nothing here decides what a worker does: see
:mod:`amqpjobs.runtime.hard_closes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ChannelRoom:
    """How many channels one open connection holds, and the most the broker lets it open.

    Attributes:
        name: The connection's name (``client_properties.connection_name``).
        open: Channels open now (channel 0, the connection's own, not counted).
        channel_max: The negotiated ``channel_max`` (0: no limit).

    """

    name: str
    open: int
    channel_max: int

    def short_by(self, spare: int) -> int:
        """How many channels are missing for ``spare`` more than are open (0 when they fit, or no limit)."""
        if self.channel_max <= 0:
            return 0
        return max(0, self.open + spare - self.channel_max)


def channel_room(connection: object) -> ChannelRoom | None:
    """The :class:`ChannelRoom` of an aio-pika connection, None when it is not open (or not aio-pika's).

    The negotiated ``channel_max`` is the one the broker proposed in ``connection.tune`` (aiormq
    answers with it unchanged).
    """
    transport = getattr(connection, "transport", None)
    underlay = getattr(transport, "connection", None)
    tune = getattr(underlay, "connection_tune", None)
    channels = getattr(underlay, "channels", None)
    if tune is None or not isinstance(channels, dict):
        return None
    client_properties = (getattr(connection, "kwargs", None) or {}).get("client_properties") or {}
    name = str(client_properties.get("connection_name", "?"))
    return ChannelRoom(name, sum(1 for number in channels if number), int(tune.channel_max or 0))


#: How to lift each limit a hard close names (words of RabbitMQ's reply text -> the fix).
_FIXES = (
    (
        "channel_max",
        "raise channel_max in the broker's rabbitmq.conf (RabbitMQ's default is 2047) and restart "
        "the node, or give each worker process fewer job queues or shards (--queues)",
    ),
    (
        "user limit",
        "raise or clear the user's max-channels limit (rabbitmqctl set_user_limits USER "
        "'{\"max-channels\": N}', or clear_user_limits USER max-channels), or give each worker "
        "process fewer job queues or shards (--queues)",
    ),
    ("vhost limit", "raise or clear the vhost's limit (rabbitmqctl set_vhost_limits / clear_vhost_limits)"),
    ("frame_max", "raise frame_max in the broker's rabbitmq.conf, or publish smaller headers"),
)


def limit_fix(reply_text: str) -> str:
    """The fix for a connection the broker closed with a hard error (``reply_text``: its words), or a general one.

    A user's limit names the user when the broker's words do (``for user 'app'``: RabbitMQ 3.x, 4.3).
    A name with ``@`` is said as ``USER``: RabbitMQ 4.0.5's words put its node's name there
    (``for user 'rabbit@host'``), and a fix naming the node would change nothing.
    """
    for words, fix in _FIXES:
        if words in reply_text:
            user = _USER.search(reply_text) if words == "user limit" else None
            return fix.replace("USER", user.group(1)) if user and "@" not in user.group(1) else fix
    return (
        "the broker refuses what this worker sends it the same way at every reconnect: look in the broker's "
        "log for the connection's close, fix that, then start the worker again"
    )


#: The broker's words for a channel refused at a channel limit (3.x and 4.x; 4.3 drops the parentheses).
_CHANNEL_LIMIT: Final = re.compile(r"has reached the (negotiated channel_max|maximum allowed user limit)")
#: The user a user limit's refusal names (4.0.5 names its node there: :func:`limit_fix` says USER then).
_USER: Final = re.compile(r"for user '([^']+)'")


def channel_limit(text: str) -> bool:
    """Whether ``text`` (an error's) quotes a channel refused at ``channel_max`` or at a user's ``max-channels``."""
    return _CHANNEL_LIMIT.search(text) is not None


def with_limit_fix(text: str) -> str:
    """``text`` (an error's) with ``; fix: ...`` added when it quotes a channel refused at a channel limit without one.

    The broker's 530 words name the limit, not what to change; an error that wraps them (``looking for
    queues and exchanges failed: NOT_ALLOWED ...``, ``could not take the lock ...``) keeps them, not our fix.
    """
    if _CHANNEL_LIMIT.search(text) is None or "fix" in text.lower():
        return text
    return f"{text}; fix: {limit_fix(text)}"
