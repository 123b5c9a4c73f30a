"""A connection that fewer jobs need gives its connection slot to the ones they need more (README "Workers").

A user's or vhost's ``max-connections`` (RabbitMQ "User limits", "Virtual Hosts") lowered under a running
worker, then its connections lost: aio-pika reconnects each of them on its own, and whichever is first
takes the slots. Measured on 3.10 before: the outcome events' connection (no job needs it) reconnected
first, 8 ms after the close, and the consuming and publishing ones were refused every 5 s for as long as
the limit held (0 consumers, the jobs ready; at a limit of 2, a redelivered job held unacked 75 s).

:func:`give_way` orders them: a connection reconnects only once the ones it gives way to are up (its
:attr:`~amqpjobs.wire.cluster.ClusterConnection.turn`). One that no job needs (``meanwhile`` given: the
worker's events connection, behind its consuming and publishing ones) also closes itself while one of
those is refused at ``connection.open`` (no loss: nothing else is said of it), and says so once a minute
at most, with what refuses and its fix, and what waits meanwhile; so does one that was down already then
(closed with the others, it waits its turn: the line came only when it had got back first, seen on
4.0.5). The publishing connection gives way
to the consuming one alike (:data:`PUBLISHING_MEANWHILE`): before, it only waited its turn, and whose
close was handled first (all three closed at once: a node restart, a network cut) could reconnect in
the moment the consuming one still looked up and keep the only slot of a ``max-connections`` 1 (measured
on 3.10: 0 of 20 jobs done 20 s after the close, connections ['procapp-worker-publisher'], in 1 of 6 runs).
Without its consuming connection a worker holds no delivery to copy, and a rate-limited job's emitter
lock it held passes to another worker's candidate (:mod:`amqpjobs.runtime.rate_limits`), as after a loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence

from amqpjobs.wire.cluster import ClusterConnection, on_refused_reconnect
from amqpjobs.wire.errors import refused_connect_reason
from amqpjobs.wire.failover_lines import DOWN_EVERY
from amqpjobs.wire.open_refusal import frees_a_slot
from amqpjobs.wire.urls import redact_text

log = logging.getLogger("amqpjobs.wire")

#: What a worker's publishing connection's owner does while it gives way to the consuming one (its line's end).
PUBLISHING_MEANWHILE = (
    "no copy goes out, none is needed (the deliveries held went back with the consuming connection), and a "
    "rate-limited job's emitter lock it held passes to another worker"
)

#: Seconds between two looks at whether the connections given way to are up, when none comes up meanwhile.
LOOK_EVERY = 1.0


def _down(connections: Sequence[ClusterConnection]) -> list[ClusterConnection]:
    """Those of ``connections`` not connected now (a connection closed for good, its owner stopping, is not)."""
    return [c for c in connections if not (c.is_closed or c.close_called or c.connected.is_set())]


def give_way(connection: object, to: Sequence[object], meanwhile: str | None = None, slot_only: bool = False) -> None:
    """Have ``connection`` reconnect only after each of ``to`` is up; with ``meanwhile``, close while one is refused.

    Args:
        connection: The connection that gives way (made by :func:`~amqpjobs.wire.connection.connect`;
            another kind is left alone).
        to: The connections it gives way to, in the order they matter.
        meanwhile: What its owner does without it, for its line after "meanwhile" (``its outcome events are
            dropped (counted)``); None: it only waits its turn, never closes itself.
        slot_only: Close only when that makes room (:func:`frees_a_slot`): the publishing connection, which
            holds a rate-limited job's emitter lock and minting (before: at a vhost limit of 0 it closed too,
            and the minting moved for nothing: ``test_rate_limit_reconnect``).

    Its line (WARNING, logger ``amqpjobs.wire``, at most every :data:`~amqpjobs.wire.failover_lines.DOWN_EVERY` s):
    ``connection app-worker-events gives way to app-worker, which the broker refuses (user 'app' allows at most
    2 connection(s) (max-connections): raise it ...): it closes, and reconnects once app-worker ... are up;
    meanwhile ...``.
    """
    if not isinstance(connection, ClusterConnection):
        return
    needed = [c for c in to if isinstance(c, ClusterConnection)]
    said = [-DOWN_EVERY]
    tasks: set[asyncio.Task[None]] = set()

    async def turn() -> None:
        while down := _down(needed):
            with contextlib.suppress(TimeoutError):  # looked at again: one closed for good meanwhile is not waited for
                await asyncio.wait_for(down[0].connected.wait(), LOOK_EVERY)

    async def explain(refused: ClusterConnection, exc: BaseException) -> str:
        try:
            return await refused.explain_refusal(exc) if refused.explain_refusal else str(exc)
        except Exception:  # the management API did not answer: the general words
            url = refused.url
            return refused_connect_reason(exc, url.path[1:] or "/", url.user or "guest")

    async def close_for(refused: ClusterConnection, exc: BaseException) -> None:
        why = await explain(refused, exc) if slot_only else None
        if why is not None and not frees_a_slot(why):
            return  # its close would make no room: it stays (a limit of 0, the vhost gone, no permissions)
        closed = await connection.give_way()
        if connection.is_closed or connection.close_called or (connection.connected.is_set() and not closed):
            return  # closed for good (its owner stops), or open and left so (the close raced)
        if time.monotonic() - said[0] < DOWN_EVERY:
            return
        said[0] = time.monotonic()
        why = why if why is not None else await explain(refused, exc)
        names = ", ".join(c.name for c in needed)
        how = "it closes, and reconnects" if closed else "it was down already and reconnects only"
        log.warning("connection %s gives way to %s, which the broker refuses (%s): %s once %s are up; meanwhile %s "
                    "(said again in %gs at most)", connection.name, refused.name, redact_text(why), how, names,
                    meanwhile, DOWN_EVERY)  # fmt: skip

    def refused(refused: ClusterConnection, exc: BaseException) -> None:
        task = asyncio.get_running_loop().create_task(close_for(refused, exc))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    connection.turn = turn
    for one in needed if meanwhile is not None else ():
        on_refused_reconnect(one, functools.partial(refused, one))
