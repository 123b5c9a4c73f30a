"""Names with dots through the management API: queues of a job queue, and vhosts named ``.`` and ``..`` (real broker).

An HTTP client removes dot segments from a path (RFC 3986 5.2.4), so ``/api/vhosts/..`` went out
as ``/api``; every segment now has its dots percent-encoded, which the broker decodes in names.
A whole segment ``.`` or ``..`` it still takes for a dot segment, so such vhosts are refused.
"""

from __future__ import annotations

import pytest

from amqpjobs.errors import ConfigurationError, ManagementApiError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.naming import vhost_problem
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
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
def test_a_vhost_named_by_dots_is_refused_before_any_request(broker_root: BrokerRoot, vhost: str):
    """The broker's side first: encoded or not, RabbitMQ routes no such vhost in its management API."""
    expected = "-> 405" if vhost == "." else "-> 301: redirected to "  # "..": redirected up, which was taken for done
    with ManagementClient(broker_root.settings) as mgmt, pytest.raises(ManagementApiError, match=expected):
        mgmt.delete_vhost(vhost)  # was sent as DELETE /api (the client removed the dot segment)
    assert vhost_problem(vhost) == (
        f"vhost {vhost!r} can't be named in a management API URL (a dot segment); give the vhost another name"
    )
    with pytest.raises(ConfigurationError, match="a dot segment"):
        broker_settings("amqp://guest:guest@127.0.0.1:5682/" + vhost.replace(".", "%2E"))
