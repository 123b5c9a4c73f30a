"""procapp, whose every AMQP connection asks the broker for at most ``CHANMAXAPP_MAX`` channels (default 2).

Each ``connection.tune`` this process reads offers at most that ``channel_max`` (as a broker
with ``channel_max = N`` in its rabbitmq.conf offers it), and each ``connection.tune-ok`` it
sends carries it; RabbitMQ then
closes a connection opening one channel more with 530 NOT_ALLOWED ("number of channels opened
(2) has reached the negotiated channel_max (2)"), a connection-level error the same start meets
again each time it begins: as a broker configured with a low ``channel_max`` does.
"""

from __future__ import annotations

import os
from typing import Any

from pamqp import commands as spec

from tests.integration.procapp import app

__all__ = ["app"]

_MAX = int(os.environ.get("CHANMAXAPP_MAX", "2"))
_TuneOk = spec.Connection.TuneOk


class _Few(_TuneOk):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["channel_max"] = _MAX
        super().__init__(*args, **kwargs)


_unmarshal = spec.Connection.Tune.unmarshal


def _offered(self: spec.Connection.Tune, data: bytes) -> None:
    _unmarshal(self, data)
    self.channel_max = min(self.channel_max or _MAX, _MAX)


spec.Connection.Tune.unmarshal = _offered  # type: ignore[method-assign,assignment]
spec.Connection.TuneOk = _Few  # type: ignore[misc]  # aiormq's spec is pamqp.commands: its tune-ok too
