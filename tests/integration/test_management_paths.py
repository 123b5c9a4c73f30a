"""Names with dots through the management API: queues of a job queue, and vhosts named ``.`` and ``..`` (real broker).

An HTTP client removes dot segments from a path (RFC 3986 5.2.4), so ``/api/vhosts/..`` went out
as ``/api``; every segment now has its dots percent-encoded, which the broker decodes.
"""

from __future__ import annotations

import pytest

from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_a_queue_name_with_dots_reads_back(broker: BrokerSettings, mgmt: ManagementClient, tmp_path):
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    await apply_topology(tmp_path / "t.toml", broker)
    found = mgmt.queue(broker.vhost, "work.retry.200ms")
    assert found is not None
    assert (found["name"], found["arguments"]["x-message-ttl"]) == ("work.retry.200ms", 200)


@pytest.mark.parametrize("vhost", [".", ".."])
def test_a_vhost_named_by_dots_is_made_read_and_deleted(broker_root: BrokerRoot, vhost: str):
    with ManagementClient(broker_root.settings) as mgmt:
        mgmt.delete_vhost(vhost)
        try:
            mgmt.create_vhost(vhost)
            assert vhost in {v["name"] for v in mgmt.request("GET", "/vhosts")}
            assert mgmt.queues(vhost) == []  # was a GET of /api/queues (every vhost's) or of /api
        finally:
            mgmt.delete_vhost(vhost)
        assert vhost not in {v["name"] for v in mgmt.request("GET", "/vhosts")}
