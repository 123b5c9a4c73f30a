"""A decision that can't be kept because a resource alarm holds its marked copy (a dedicated 3.10 node).

At the grace's end the marked copy is the publishing connection's first publish of the alarm: the
broker holds it unread (no confirm within the 0.5 s bound) and stores it once the alarm clears. The
worker can't know it will, so it does not ack (acking would lose the job should the node stop first):
the delivery is redelivered, and the decision is carried out beside the run. The ERROR says so.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, Reject
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain
from tests.integration.test_backpressure import AlarmNode, alarm_node, on_alarm_node  # noqa: F401 (fixtures)
from tests.integration.test_kept_decisions import DECIDED, delete, text
from tests.integration.test_stop_lines import started_worker, stop_lines, until

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "amqpjobs.worker"]


@pytest.mark.serial  # alarms the dedicated node
@pytest.mark.timeout(120)
async def test_a_marked_copy_an_alarm_holds_is_not_taken_for_kept_and_the_error_says_what_follows(
    alarm_node: AlarmNode,  # noqa: F811
    on_alarm_node: BrokerSettings,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, on_alarm_node)
    app = App("alarmed", topology=load_topology(path).topology, url=on_alarm_node.url)

    @app.job("rej", queue="work")
    async def rej(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    caplog.set_level("INFO", logger="amqpjobs.worker")
    worker = await started_worker(app, on_alarm_node, ("work",), concurrency=1, grace=1)
    try:
        delete(on_alarm_node, "exchanges", "work.quarantine")
        await app.enqueue("rej", {}, job_id="rej-1")
        await until(lambda: worker._holding.count == 1, 10, "the rejected job's delivery to be held")
        alarm_node.memory_alarm(True)
        caplog.clear()
        worker.request_stop()
        stopping = asyncio.ensure_future(worker.shutdown())
        await until(lambda: any("could not be kept past the stop" in line for line in lines(caplog)), 15, "the end")
        began = time.monotonic()
    finally:
        alarm_node.memory_alarm(False)  # a blocked connection can't even close
    assert await stopping == 1
    await app.close()
    [said] = [line for line in lines(caplog) if "could not be kept past the stop" in line]
    assert "(no confirm within 0.5s: a resource alarm (memory) holds the marked copy unread, and the broker " in said
    assert stop_lines(caplog)[1:] == [
        "1 held delivery (ran; its outcome 'quarantine' waits for work.quarantine) still held after the grace period; "
        "it returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue (redelivered: its outcome not kept, run again); exit 1",
    ]
    await asyncio.sleep(1.0)  # the held publish is read once the alarm clears
    back = await drain(on_alarm_node, "work")
    measured = sorted((m.message_id, m.redelivered, text(m.headers.get(DECIDED, ""))) for m in back)
    print(f"after the alarm cleared ({time.monotonic() - began:.1f}s): {measured}")
    assert measured == [("rej-1", False, "quarantine"), ("rej-1", True, "")]  # both: the decision and a rerun
