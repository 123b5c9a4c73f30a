"""A reconnect attempt the broker closes while aio-pika restores its channels counts as a hard close (wire/cluster.py).

CI 56 on 4.0.5: the app's publishing connection, cut at run time under a user's ``max-channels``, met the
refusal first just after a reconnect (``lost``: counted by the guard, runtime/hard_closes.py), then inside each
later attempt, while its channel was restored (``could not reach``: not counted), so the worker was never
stopped ('the worker still runs 15 s after the app's connection was cut'). Here the attempt's failure is made
by hand (the broker's own refusal is in tests/integration/test_app_connection_guard.py).
"""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from amqpjobs.wire.cluster import ClusterConnection, Node, on_hard_error, on_refused_reconnect

pytestmark = pytest.mark.asyncio

NODE = Node("amqp://u:pw@127.0.0.1:9/", None, "amqp://u:***@127.0.0.1:9/", "127.0.0.1:9")
TOO_MANY = "NOT_ALLOWED - number of channels opened for user 'u' has reached the maximum allowed user limit of (4)"


@pytest.mark.parametrize(
    ("error", "hard", "refused"),
    [
        (aiormq.exceptions.ConnectionNotAllowed(530, TOO_MANY), 1, 0),  # in the attempt: a hard close, as once open
        (ConnectionRefusedError(111, "Connect call failed"), 0, 0),  # a node down: neither
    ],
)
async def test_a_channel_refused_in_a_reconnect_attempt_is_a_hard_close(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, hard: int, refused: int
) -> None:
    async def attempt(self: object) -> None:
        raise error

    monkeypatch.setattr(aio_pika.RobustConnection, "_RobustConnection__connect_transport", attempt)
    connection = ClusterConnection([NODE])
    heard: list[BaseException] = []
    said: list[BaseException] = []
    on_hard_error(connection, heard.append)
    on_refused_reconnect(connection, said.append)
    connection._was_connected = True  # a reconnect: the first connect is the start's business
    with pytest.raises(type(error)):
        await connection._RobustConnection__connect_transport()
    assert (heard, said) == ([error] * hard, [error] * refused)
