"""A shard dispatcher after a 541: one take at a time and no lease, until its slots' worth came.

The lanes are fakes (``basic.get`` from a list, leases counted): what is tested is the
dispatcher's own token rule (:meth:`~amqpjobs.runtime.dispatch.ShardDispatcher.one_at_a_time`);
the broker's side (a 541 and the message moved) is ``tests/integration/test_undeliverable_rescue.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from amqpjobs.runtime import dispatch
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.wire.lane import Taken


class FakeLane:
    """A shard's lane: ``get`` takes from the shared :attr:`queued`; ``lease`` is counted, never delivers."""

    queued: ClassVar[deque[int]] = deque()
    leases: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, connection: Any, name: str, batch_acks: bool = True, safe_url: str = "") -> None:
        self.name = name
        self.on_reopen: Any = None

    async def open(self, queues: Sequence[str]) -> None:
        return None

    @property
    def is_open(self) -> bool:
        return True

    async def get(self, queue: str) -> Taken | None:
        await asyncio.sleep(0)
        if not FakeLane.queued:
            return None
        return Taken(FakeLane.queued.popleft(), len(FakeLane.queued))  # type: ignore[arg-type]

    async def exists(self, queue: str) -> bool:
        return True

    async def lease(self, queue: str, prefetch: int, *args: Any, **kwargs: Any) -> str:
        FakeLane.leases.append((queue, prefetch))
        return f"tag-{len(FakeLane.leases)}"

    async def end_lease(self, tag: str, quiet: float = 0.0) -> None:
        return None

    async def flush_acks(self) -> None:
        return None

    async def settle(self) -> None:
        return None

    async def close(self) -> None:
        return None


class Runs:
    """The handler: how many run at once (the most while one at a time, and after), in order."""

    def __init__(self) -> None:
        self.running = 0
        self.peaks: list[int] = []  # at each start: how many run then
        self.done: list[int] = []

    async def __call__(self, delivery: Any) -> None:
        self.running += 1
        self.peaks.append(self.running)
        await asyncio.sleep(0.02)
        self.running -= 1
        self.done.append(int(delivery))


@pytest.fixture
def fake_lanes(monkeypatch: pytest.MonkeyPatch) -> type[FakeLane]:
    monkeypatch.setattr(dispatch, "Lane", FakeLane)
    FakeLane.queued = deque(range(12))
    FakeLane.leases = []
    return FakeLane


async def _until(done: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not done():
            await asyncio.sleep(0.005)


async def test_after_a_541_it_takes_one_at_a_time_for_its_slots_then_all_of_them(fake_lanes: type[FakeLane]) -> None:
    runs = Runs()
    dispatcher = ShardDispatcher(None, "split", ["split.shard-0", "split.shard-1"], 3, runs, set())  # type: ignore[arg-type]
    assert dispatcher.one_at_a_time() is True
    assert dispatcher.one_at_a_time() is False  # a second 541: it counts again, it does not begin again
    await dispatcher.start()
    try:
        await _until(lambda: len(runs.done) == 12)
    finally:
        await dispatcher.cancel()
    assert runs.peaks[:3] == [1, 1, 1]  # the first 3 (its slots) alone, each taken once the one before ended
    assert max(runs.peaks[3:]) > 1
    assert sorted(runs.done) == list(range(12))  # each once


async def test_while_one_at_a_time_no_lease_is_made_and_widen_gives_every_slot_back(
    fake_lanes: type[FakeLane],
) -> None:
    runs = Runs()
    dispatcher = ShardDispatcher(None, "split", ["split.shard-0", "split.shard-1"], 4, runs, set())  # type: ignore[arg-type]
    dispatcher.one_at_a_time()
    await dispatcher.start()
    try:
        await _until(lambda: len(runs.done) == 2)
        assert fake_lanes.leases == []  # a backlog seen (remaining > 0), and still no lease
        assert set(runs.peaks) == {1}
        await dispatcher.widen()  # the look moved the message
        await _until(lambda: len(runs.done) == 12)
    finally:
        await dispatcher.cancel()
    assert max(runs.peaks) > 1
    assert sorted(runs.done) == list(range(12))


def test_one_slot_never_goes_one_at_a_time(fake_lanes: type[FakeLane]) -> None:
    runs = Runs()
    dispatcher = ShardDispatcher(None, "split", ["split.shard-0"], 1, runs, set())  # type: ignore[arg-type]
    assert dispatcher.one_at_a_time() is False


async def test_a_lease_planned_before_the_541_keeps_no_token_waiting_while_one_at_a_time(
    fake_lanes: type[FakeLane],
) -> None:
    """A lease the last plan could not arm yet (no token free) leaves its tokens pending; the 541 comes then.

    While one at a time no lease is planned, so nothing would arm it and free those tokens:
    they are not waited for (else no take starts until a look moves the message, c9ebb51).
    """
    runs = Runs()
    dispatcher = ShardDispatcher(None, "split", ["split.shard-0", "split.shard-1"], 3, runs, set())  # type: ignore[arg-type]
    dispatcher._pending = 3  # the state such a plan leaves: every slot's token waits for that lease
    dispatcher.one_at_a_time()
    await dispatcher.start()
    try:
        await _until(lambda: len(runs.done) == 3, timeout=3.0)
    finally:
        await dispatcher.cancel()
    assert runs.peaks[:3] == [1, 1, 1]  # taken one at a time (then its slots' worth came: every token again)
