"""The scheduler's tick transactions on the in-memory double (virtual clock, no broker): a returned
job never makes a routed one of the same look go out again. The real-broker test of the same case
is tests/integration/test_scheduler_returns.py."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from amqpjobs import App, JobContext, tick_id
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SHARDED = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "split"\nexchange = "jobs"\nshards = 3\n'


async def test_a_returned_catch_up_and_a_routed_on_time_job_each_reach_their_queue_once(tmp_path: Path) -> None:
    """Down from 12:00 to 12:30 on a quarter-hourly schedule: the catch-up job (12:15) and the
    on-time job (12:30) are due at one look. The catch-up's shard routes nothing (its binding
    removed), the on-time job's shard is another one. Before: the on-time job went out at every look
    (once per second for as long as the shard was unbound). Now: nothing goes out before the
    catch-up routes, then each once."""
    (tmp_path / "t.toml").write_text(SHARDED)
    app = App("ticktx", topology=load_topology(tmp_path / "t.toml").topology)

    @app.job("split", queue="split")
    async def split(payload: dict[str, Any], ctx: JobContext) -> None: ...

    layout = app.layout_of("split")
    missing = layout.work_queues[1]
    catch_up, on_time = START + timedelta(minutes=15), START + timedelta(minutes=30)

    def shard(name: str, tick: datetime) -> str:
        return layout.work_queue_for(layout.routing_key_for(tick_id(name, tick)))

    # (three shards: with two, whether two ids share a shard would not depend on the name, crc32 being linear)
    name = next(f"pair{i}" for i in range(1000) if shard(f"pair{i}", catch_up) == missing != shard(f"pair{i}", on_time))
    app.cron("*/15 * * * *", name=name)(split)
    async with TestBroker(app, start=START) as broker:
        leader = broker.leader()
        assert leader is not None
        await broker.stop_scheduler(leader)
        await broker.advance("30m")  # no scheduler runs: 12:15 is missed, 12:30 is on time when one comes
        exchange = broker.memory.exchanges["jobs"]
        unbound = next(b for b in exchange.bindings if b[1] == missing)
        exchange.bindings.remove(unbound)
        await broker.add_scheduler()
        for _ in range(3):
            await broker.advance("1s")  # a look each
        before = [p.outcome.job_id for p in broker.processed]
        exchange.bindings.append(unbound)
        await broker.advance("1s")
        after = [(p.outcome.job_id, p.headers["amqpjobs-cron-kind"]) for p in broker.processed]
    assert before == []  # was [cron:<name>:...12:30:00Z] x 8 (one per look)
    assert Counter(job_id for job_id, _ in after) == {tick_id(name, catch_up): 1, tick_id(name, on_time): 1}
    assert dict(after) == {tick_id(name, catch_up): "catch-up", tick_id(name, on_time): "fired"}
    assert [e.kind for e in broker.ticks if e.tick > START] == ["catch-up", "fired"]
