"""schedapp, each of whose AMQP connections gets channel_max ``CHANMAXAPP_MAX`` (:mod:`.chanmaxapp`).

With 2, a replica joins the election (one channel), then, leading, opens one more to publish its
ticks: RabbitMQ closes the connection with 530 NOT_ALLOWED, and again after every reconnect.
"""

from __future__ import annotations

import tests.integration.chanmaxapp  # noqa: F401  (patches connection.tune and tune-ok)
from tests.integration.schedapp import app

__all__ = ["app"]
