"""A worker's outcome events connection, which no job needs, gives its connection slot to the ones jobs need.

A user's ``max-connections`` lowered at run time (1 or 2, below the worker's 3 connections), then the
worker's connections closed (management API), the events one last: each reconnects at once. Before, on
3.10.8: the events connection took the slot its close freed and held it, so nothing ran 20 s after the
close ("0 of 20 done 20s after the close; consumers 0; connections ['procapp-worker-events']" at 1,
"... connections ['procapp-worker-events', 'procapp-worker-publisher']" at 2). Now the events connection
reconnects only once the consuming and publishing ones are up, the publishing one only once the consuming
one is, and the events one closes itself while one it gives way to is refused, saying so once with the
limit and its fix; the events are dropped (counted) meanwhile.

The publishing connection up when the consuming one is refused (as when, all three closed at once, its
close was handled first and it reconnected while the consuming one still looked up: 1 of 6 runs on 3.10):
before, it kept the only slot at 1 ("0 of 20 done 20s after the close; consumers 0; connections
['procapp-worker-publisher']"); now it gives way as the events one does, and says so once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import pytest

from amqpjobs.wire.giving_way import PUBLISHING_MEANWHILE
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import close_connections, consume_subprocess, limited_user, wait_until, write_file
from tests.integration.test_processes_refused import _until_logged
from tests.integration.test_worker_process import done_ids, publisher
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: Seconds after the close by which every job must be done (a refused reconnect is tried again every 5 s).
BOUND = 20.0


def _mine(broker: BrokerSettings, user: str) -> list[str]:
    """The connection names (client_properties) of ``user``'s connections, as the management API lists them."""
    with ManagementClient(broker) as mgmt:
        listed = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
    return sorted(str((c.get("client_properties") or {}).get("connection_name")) for c in listed
                  if c.get("user") == user)  # fmt: skip


def _consumers(broker: BrokerSettings, queue: str) -> int:
    with ManagementClient(broker) as mgmt:
        found = mgmt.request("GET", f"/queues/{quote(broker.vhost, safe='')}/{queue}")
    return int(found.get("consumers", 0)) if isinstance(found, dict) else 0


@pytest.mark.parametrize(("limit", "publisher_kept"), [(1, False), (2, False), (1, True)])
async def test_after_a_close_under_a_lowered_connection_limit_the_needed_connections_get_the_slots(
    broker: BrokerSettings, tmp_path: Path, limit: int, publisher_kept: bool
):
    app = await publisher(broker, tmp_path)
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    with limited_user(broker, tags="monitoring") as (user, url):
        env = {"AMQPJOBS_URL": url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
               "PROCAPP_RECORD": str(record)}  # fmt: skip
        with consume_subprocess("tests.integration.procapp:app", env, ("--grace", "5s"), log, terminate=True) as proc:
            await _until_logged(log, proc, "worker consuming", time.monotonic() + 40, 0.2)
            deadline = time.monotonic() + 30
            while len(_mine(broker, user)) < 3:  # listed within a statistics interval
                assert time.monotonic() < deadline, _mine(broker, user)
                await asyncio.sleep(0.3)
            await asyncio.sleep(5.5)  # past aio-pika's 5 s after a connect: a close now reconnects at once
            with ManagementClient(broker) as mgmt:
                mgmt.request("PUT", f"/user-limits/{user}/max-connections", {"value": limit})
            if publisher_kept:  # the publishing one up, holding the only slot (as when it reconnected first)
                assert await asyncio.to_thread(close_connections, broker, "procapp-worker") == 1
                await asyncio.to_thread(close_connections, broker, "procapp-worker-events")
            else:
                assert await asyncio.to_thread(close_connections, broker, "procapp-worker") == 1
                for name in ("procapp-worker-publisher", "procapp-worker-events"):  # events last; gone if it gave way
                    await asyncio.to_thread(close_connections, broker, name)
            closed = time.monotonic()
            for i in range(20):
                await app.enqueue("sleep", {"seconds": 0}, job_id=f"j{i}")
            while len(done_ids(record)) < 20:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() - closed < BOUND, (
                    f"{len(done_ids(record))} of 20 done {BOUND:g}s after the close; consumers "
                    f"{_consumers(broker, 'work')}; connections {_mine(broker, user)}\n{log.read_text()[-3000:]}"
                )
                await asyncio.sleep(0.2)
            took = time.monotonic() - closed
            # the needed ones hold the slots, the events connection none (a refused one comes back within a 5 s
            # reconnect round, and the API lists it within a statistics interval: seen at 6 s on 4.3.6)
            needed = ["procapp-worker", "procapp-worker-publisher"][:limit]
            deadline = time.monotonic() + 15
            while (held := _mine(broker, user)) != needed and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await wait_until(lambda: _consumers(broker, "work") >= 1, 10, "a consumer listed")  # the API lags
            with ManagementClient(broker) as mgmt:
                mgmt.request("DELETE", f"/user-limits/{user}/max-connections")
            proc.terminate()
            code = await asyncio.to_thread(proc.wait, 30)
    await app.close()
    out = log.read_text()
    assert done_ids(record) == Counter({f"j{i}": 1 for i in range(20)}), out[-3000:]  # 0 lost, 0 twice
    assert took < BOUND
    assert held == needed, (held, out[-3000:])
    assert code == 0, out[-3000:]
    # the events connection's loss is said, with the limit and its fix, and not at each refusal: it gave way to a
    # needed one the broker refused (open then: it closes; down already, waiting its turn: before, nothing was
    # said), and/or, its turn come with the needed ones back, the broker refused it (seen on 4.0.5 at 2)
    gave = [line for line in out.splitlines() if "connection procapp-worker-events gives way" in line]
    refused = [line for line in out.splitlines()
               if "outcome events are off: the broker refuses the reconnect of their connection" in line]  # fmt: skip
    assert len(gave) <= 1, out[-6000:]
    assert len(refused) <= 1, out[-6000:]
    assert gave + refused, out[-6000:]
    for said in gave:
        assert ": it closes, and reconnects once" in said or ": it was down already and reconnects only once" in said
        assert "meanwhile its outcome events are dropped (counted)" in said, said
    for said in gave + refused:
        assert f"user '{user}' allows at most {limit} connection(s) (max-connections): raise it" in said, said
        assert f"rabbitmqctl set_user_limits {user}" in said, said
    pub = [line for line in out.splitlines() if "connection procapp-worker-publisher gives way to procapp" in line]
    assert len(pub) == 1 if publisher_kept else len(pub) <= 1, pub  # up when the consuming one is refused: said once
    assert all(PUBLISHING_MEANWHILE in line for line in pub), pub
