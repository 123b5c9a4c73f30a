"""Names with dots through the management API: queues of a job queue, and vhosts named ``.`` and ``..`` (real broker).

A dot inside a name is fine. A whole path segment ``.`` or ``..`` is a dot segment (RFC 3986
5.2.4): the HTTP client removes it (``/api/vhosts/..`` went out as ``/api``), and RabbitMQ takes
even ``%2E`` and ``%2E%2E`` for one. Such vhosts are refused, and a redirect is an error.
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
        mgmt.request("DELETE", "/vhosts/" + vhost.replace(".", "%2E"), allow_404=True)  # encoded, still no vhost
    assert vhost_problem(vhost) == (
        f"vhost {vhost!r} can't be named in a management API URL (a dot segment); give the vhost another name"
    )
    with pytest.raises(ConfigurationError, match="a dot segment"):
        broker_settings("amqp://guest:guest@127.0.0.1:5682/" + vhost.replace(".", "%2E"))
