"""An attempt or enqueue-time header the worker can't read: the job runs, and the worker says so once per type.

Before: ``amqpjobs-attempt`` as a table or as text that is no count ran the job as attempt 1, and
``amqpjobs-enqueued-at`` as a boolean or as text that is no time gave ``ctx.enqueued_at`` from the
``timestamp`` property, both without a word (test_header_types_said: no WARNING at all), where
the tenant header of another type is said (test_tenant_header_types).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, header_runs, note

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # header decoding is the client's

STAMP = datetime(2025, 11, 30, 9, 0, tzinfo=UTC)
#: job id prefix -> (headers, the warning's start or None)
SENT: dict[str, tuple[dict[str, Any], str | None]] = {
    "ours": ({"amqpjobs-attempt": 1, "amqpjobs-enqueued-at": "2025-11-30T09:00:00.000Z"}, None),
    "attempt-table": ({"amqpjobs-attempt": {"n": 2}}, "header amqpjobs-attempt is a table, expected a whole number"),
    "attempt-text": (
        {"amqpjobs-attempt": "second"},
        "header amqpjobs-attempt is 'second' (a string), not a whole number >= 0",
    ),
    "attempt-zero": ({"amqpjobs-attempt": 0}, None),  # 0 is attempt 1, documented
    # before: a negative integer was read as attempt 1 without a word (only other types were looked at)
    "attempt-negative": ({"amqpjobs-attempt": -5}, "header amqpjobs-attempt is -5 (an integer), not a whole number"),
    "at-bool": ({"amqpjobs-enqueued-at": True}, "header amqpjobs-enqueued-at is a boolean, not a time"),
    "at-text": (
        {"amqpjobs-enqueued-at": "yesterday"},
        "header amqpjobs-enqueued-at is 'yesterday' (a string), not a time",
    ),
}
EACH = 3  # jobs per kind: one warning per header and type, not per job


@pytest.mark.timeout(60)
async def test_an_unreadable_attempt_or_enqueue_time_is_said_once_per_header_and_type(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    messages = [note(f"{kind}-{i}", headers=headers, timestamp=STAMP) for kind, (headers, _) in SENT.items()
                for i in range(EACH)]  # fmt: skip
    caplog.set_level(logging.WARNING, logger="amqpjobs.worker")
    seen = await header_runs(broker, tmp_path, messages, lambda ctx: (ctx.attempt, ctx.enqueued_at))
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0
    assert seen == {f"{kind}-{i}": (1, STAMP) for kind in SENT for i in range(EACH)}
    warned = sorted(r.getMessage() for r in caplog.records if "header amqpjobs-" in r.getMessage())
    starts = sorted((start, kind) for kind, (_, start) in SENT.items() if start is not None)
    assert len(warned) == len(starts), warned
    for line, (start, kind) in zip(warned, starts, strict=True):
        assert line.startswith(start), (line, start)
        assert line.endswith(f"(said once per header and type; first: job id {kind}-0 on work)"), line
    for line in warned:  # each names its fix (before, the attempt's did not: "...; read as attempt 1 (said once ...")
        if line.startswith("header amqpjobs-attempt"):
            assert "; read as attempt 1; send it as a whole number (1 for a new job), or leave it out (" in line, line
    assert "the timestamp property is read instead" in warned[-1], warned
