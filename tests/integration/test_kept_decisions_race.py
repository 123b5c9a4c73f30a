"""A held delivery's own copy still waiting for its confirm when the stop's grace ends (held11 step 2; real broker).

The quarantine exchange was deleted, so the rejected job's delivery is held; it is back, and the hold's
round publishes the quarantine copy: the broker stores it, but its confirm is seen late (a slow disk, a
busy node; here the worker's publish is made to return late after the real, confirmed publish: the
broker decides nothing differently). Should the grace end meanwhile, the marked copy published beside
it would carry the decision out twice (before: the quarantine copy AND a marked copy in work). The
stop waits for that publish (up to the 0.5 s bound of a kept decision): confirmed, the original is
acked (carried out once); still unsettled, no marked copy goes (it may land: the delivery is redelivered
plain).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain
from tests.integration.test_kept_decisions import DECIDED, delete
from tests.integration.test_stop_lines import started_worker, stop_lines, until
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


@pytest.mark.timeout(60)
@pytest.mark.parametrize("late", [0.2, 2.0])
async def test_a_copy_in_flight_at_the_grace_end_is_settled_before_a_marked_copy_could_go_beside_it(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, late: float
) -> None:
    """``late``: seconds after the 1 s grace's end the quarantine copy's publish returns (its real publish done
    before the stop): 0.2, within the 0.4 s the stop waits for it (carried out, acked); 2.0, past it (not known:
    redelivered, no marked copy)."""
    app = await make_app(broker, tmp_path)

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, broker, ("work",), concurrency=1, grace=1)
    sent = asyncio.Event()
    try:
        delete(broker, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        quarantiner = worker._quarantiner
        assert quarantiner is not None
        real = quarantiner.publish

        async def confirmed_late(*args: Any, **kwargs: Any) -> None:
            await real(*args, **kwargs)  # stored and confirmed by the broker
            sent.set()
            while not worker._stop.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(1 + late)  # its confirm seen late: after the grace's end

        quarantiner.publish = confirmed_late  # type: ignore[method-assign]
        await apply_topology(tmp_path / "applied.toml", broker)  # the hold's next round publishes the copy
        await until(sent.is_set, 15, "the held delivery's copy to be published")
        caplog.clear()
        worker.request_stop()
    finally:
        assert await worker.shutdown() == 1
        await app.close()
    work, quarantined = await drain(broker, "work"), await drain(broker, "work.quarantine")
    found = ([(m.message_id, m.redelivered, DECIDED in m.headers) for m in work], len(quarantined))
    lines = stop_lines(caplog)
    print(f"late {late}s: work, quarantine copies = {found}; {lines}")
    if late < 0.4:  # confirmed within the bound: the decision carried out once, nothing left in work
        assert found == ([], 1)
        assert lines[1:] == [
            "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace "
            "period; its copy, in flight, was confirmed then: its outcome carried out (the original acked)",
            "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) carried "
            "out as the grace ended (its copy confirmed); exit 1",
        ]
    else:  # unsettled: no marked copy beside a copy that may land; the delivery redelivered plain
        assert found == ([("rej-1", True, False)], 1)
        assert lines[1:] == [
            "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace "
            "period; it returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
            "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned "
            "to its queue (redelivered: its outcome not kept, run again); exit 1",
        ]
    assert await depth(broker, "work") == 0
