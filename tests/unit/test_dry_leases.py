"""A lease whose credit went unused is ended only when its shard has no message ready (dispatch DRY check).

The ready count is the broker's (a passive declare); here it is given, to pin the decision taken on it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from amqpjobs.runtime.dispatch import DRY, ShardDispatcher
from amqpjobs.runtime.leases import _Lease
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.delivery import Delivery


async def _handler(delivery: Delivery) -> None:  # never called: nothing is taken here
    raise AssertionError("no delivery expected")


def dispatcher(ready: int | None) -> tuple[ShardDispatcher, list[str]]:
    d = ShardDispatcher(cast(Connection, None), "q", ["q.shard-0", "q.shard-1"], 4, _handler, set())
    asked: list[str] = []

    async def count(queue: str) -> int | None:
        asked.append(queue)
        return ready

    for lane in d._lanes:
        cast(Any, lane).ready = count
    return d, asked


def idle_lease(d: ShardDispatcher, shard: int) -> _Lease:
    lease = _Lease(shard, size=2, tokens=2, consuming=True, last=time.monotonic() - 2 * DRY)
    d._leases[shard] = lease
    d._busy.add(shard)
    return lease


async def test_a_lease_whose_shard_still_has_jobs_ready_stays_busy() -> None:
    d, asked = dispatcher(ready=37)
    lease = idle_lease(d, 1)
    await d._check_dry(lease, DRY)
    assert asked == ["q.shard-1"]
    assert d._busy == {1}
    assert time.monotonic() - lease.last < DRY  # looked at again after another DRY
    assert not lease.checking


async def test_a_lease_whose_shard_has_nothing_ready_is_dry() -> None:
    for ready in (0, None):  # empty, or the shard is missing
        d, asked = dispatcher(ready=ready)
        lease = idle_lease(d, 0)
        await d._check_dry(lease, DRY)
        assert asked == ["q.shard-0"]
        assert d._busy == set()
        assert not lease.checking


async def test_a_delivery_that_came_during_the_check_keeps_the_lease() -> None:
    d, _ = dispatcher(ready=0)
    lease = idle_lease(d, 0)
    lease.last = time.monotonic()  # its credit was used meanwhile
    await d._check_dry(lease, DRY)
    assert d._busy == {0}


async def test_the_dispatcher_keeps_an_idle_lease_while_its_shard_has_jobs_ready() -> None:
    d, asked = dispatcher(ready=5)
    idle_lease(d, 1)
    d._plan(time.monotonic())
    await asyncio.gather(*d._chores)
    assert asked == ["q.shard-1"]
    assert d._busy == {1}
    assert 1 in d._leases
    assert not d._leases[1].ending
