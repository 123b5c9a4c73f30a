"""A tenant header of a type that is no tenant: the job runs without a tenant, and the worker says so once per type.

Before: a table, an array, a boolean, a float, a decimal or a timestamp in the tenant header
meant "no tenant" silently (test_tenant_header_types: no WARNING at all), so a publisher in
another language that sent its tenant id as, say, a float never learned why fairness and
``ctx.tenant`` ignored it. A decimal of scale 0 (an AMQP ``D`` holding a whole number) was
no tenant either, where an integer of the same value is its digits.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, header_runs, note

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # header decoding is the client's

#: job id prefix -> (tenant header value, ctx.tenant expected, AMQP type warned of or None)
SENT: dict[str, tuple[Any, str | None, str | None]] = {
    "int": (42, "42", None),
    "bytes": (bytearray(b"acme"), "acme", None),
    "decimal0": (Decimal("42"), "42", None),  # scale 0: a whole number, read as the integer is
    "void": (None, None, None),  # a null: no tenant, said by the publisher
    "table": ({"id": "acme"}, None, "a table"),
    "array": (["acme"], None, "an array"),
    "bool": (True, None, "a boolean"),
    "float": (1.5, None, "a float"),
    "decimal2": (Decimal("42.00"), None, "a decimal"),
    "timestamp": (datetime(2026, 1, 1, tzinfo=UTC), None, "a timestamp"),
}
EACH = 3  # jobs per kind: one warning per kind, not per job


@pytest.mark.timeout(60)
async def test_a_tenant_header_of_another_type_runs_without_a_tenant_and_is_said_once_per_type(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    messages = [note(f"{kind}-{i}", headers={"amqpjobs-tenant": value}) for kind, (value, _, _) in SENT.items()
                for i in range(EACH)]  # fmt: skip
    caplog.set_level(logging.WARNING, logger="amqpjobs.worker")
    seen = await header_runs(broker, tmp_path, messages, lambda ctx: ctx.tenant)
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0
    assert seen == {f"{kind}-{i}": tenant for kind, (_, tenant, _) in SENT.items() for i in range(EACH)}
    warned = [r.getMessage() for r in caplog.records if "amqpjobs-tenant" in r.getMessage()]
    assert sorted(warned) == sorted(
        f"header amqpjobs-tenant is {kind}, expected a string (or a whole number): a job carrying it runs with no "
        "tenant (ctx.tenant None, its shard picked by job id on a replay) and its copies leave the header out; "
        "send the tenant as a string (said once per header and type; first: job id "
        f"{name}-0 on work)"
        for name, (_, _, kind) in SENT.items()
        if kind is not None
    ), warned
