"""The double delivers headers as a broker does: through AMQP's field-table encoding and back.

A handler tested in the double saw the very objects ``enqueue(headers=...)`` was given (a
tuple, ``bytes``), where every consumer of a real broker gets a list and a ``bytearray``
(``test_testing_contract.py`` compares the two against the 3.10 node).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from tests.topologies import work_topology

pytestmark = pytest.mark.asyncio

TOPOLOGY = work_topology()

GIVEN: dict[str, Any] = {
    "pair": (1, 2),
    "raw": b"\x00\xff",
    "when": datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
    "nested": {"list": (b"a", (3,))},
    "price": Decimal("1.25"),
}
DELIVERED: dict[str, Any] = {
    "pair": [1, 2],
    "raw": bytearray(b"\x00\xff"),
    "when": datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC),
    "nested": {"list": [bytearray(b"a"), [3]]},
    "price": Decimal("1.25"),
}


async def test_a_handler_sees_the_headers_as_a_broker_delivers_them(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    app = App("h", topology=load_topology(path).topology)
    seen: list[dict[str, Any]] = []

    @app.job("j", queue="work")
    async def j(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append({k: ctx.headers[k] for k in GIVEN})
        if ctx.attempt == 1:
            raise ConnectionError("again")  # the retry copy is delivered as a broker would too

    async with TestBroker(app) as broker:
        await app.enqueue("j", {}, headers=GIVEN)
        assert [p.kind for p in await broker.drain()] == ["retried", "succeeded"]
    assert seen == [DELIVERED, DELIVERED]
    assert [[type(h[k]) for k in GIVEN] for h in seen] == [[type(v) for v in DELIVERED.values()]] * 2
