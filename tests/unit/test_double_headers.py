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


async def refused_raw(tmp_path: Path, **properties: Any) -> str:
    """What the double's ``publish_raw`` of job ``ok`` with ``properties`` raised (ConfigurationError); nothing ran."""
    from amqpjobs.errors import ConfigurationError

    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    app = App("h", topology=load_topology(path).topology)
    app.job("ok", queue="work")(lambda p, c: None)
    async with TestBroker(app) as broker:
        with pytest.raises(ConfigurationError) as caught:
            await broker.publish_raw("", "work", b"{}", type="ok", **properties)
        assert await broker.drain() == []
    return str(caught.value)


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x": float("nan")}, "header 'x' holds nan"),
        ({"x": {"deep": [1, float("-inf")]}}, "header 'x' holds -inf"),
    ],
)
async def test_publish_raw_refuses_a_float_rabbitmq_closes_the_connection_on(
    tmp_path: Path, headers: dict[str, Any], named: str
) -> None:
    """helper-231: the double took ``{"x": nan}`` and ran the job; RabbitMQ (3.10-4.3) closes the connection.

    Measured on 3.10: an aio-pika publish with that header gets ``Connection.Close(541, INTERNAL_ERROR)``
    (``tests/integration/test_testing_contract.py`` checks it on every version).
    """
    said = await refused_raw(tmp_path, headers=headers)
    assert named in said, said
    assert "RabbitMQ closes the publisher's connection (INTERNAL_ERROR)" in said
    assert "nothing was sent" in said


@pytest.mark.parametrize("priority", [300, -1, 1.5, "5", True])
async def test_publish_raw_names_a_priority_out_of_range_not_the_headers(tmp_path: Path, priority: int) -> None:
    said = await refused_raw(tmp_path, priority=priority)
    assert said.startswith(f"priority {priority!r} is not 0-255 (AMQP's priority property is one octet)"), said
    assert "header" not in said
