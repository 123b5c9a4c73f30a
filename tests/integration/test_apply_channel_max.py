"""``topology apply`` on a broker whose ``channel_max`` is low (but enough for a worker: 4).

Measured before on 3.10 with ``channel_max = 5`` in the node's rabbitmq.conf: ``amqpjobs topology apply``
exited 3, "broker error: NOT_ALLOWED - number of channels opened (5) has reached the negotiated channel_max
(5); fix: raise channel_max ... or give each worker process fewer job queues or shards (--queues)": it
declares on 8 channels at once (wire.declare.DECLARE_CHANNELS), a speed-up, not a need. Here the client asks
for the low ``channel_max`` (as such a node offers it), as tests/integration/chanmaxapp.py does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pamqp import commands as spec

from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


def offer_at_most(monkeypatch: pytest.MonkeyPatch, most: int) -> None:
    """Every connection of this process negotiates ``channel_max`` ``most`` (tune and tune-ok), undone after."""
    unmarshal = spec.Connection.Tune.unmarshal

    def offered(self: spec.Connection.Tune, data: bytes) -> None:
        unmarshal(self, data)
        self.channel_max = min(self.channel_max or most, most)

    class Few(spec.Connection.TuneOk):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["channel_max"] = most
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(spec.Connection.Tune, "unmarshal", offered)
    monkeypatch.setattr(spec.Connection, "TuneOk", Few)


@pytest.mark.parametrize("most", [2, 5])
async def test_apply_declares_within_a_low_channel_max(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, most: int
):
    path = tmp_path / "topo.toml"
    path.write_text(APPLIED_TOPOLOGY)
    offer_at_most(monkeypatch, most)
    await apply_topology(path, broker)  # before: ConnectionNotAllowed, "... channel_max (5)"
    with ManagementClient(broker) as mgmt:
        assert mgmt.queue(broker.vhost, "work") is not None
        assert mgmt.queue(broker.vhost, "work.quarantine") is not None
