"""The wire contract as a publisher in another language meets it (issue 20).

Each test publishes what a foreign publisher may send (raw frames where aio-pika can't
send it) and asserts what the handler, the evidence, the plain-text log, ``quarantine
show`` and ``status`` make of it.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import struct
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from pydantic import BaseModel

from amqpjobs import JobContext, Reject, RetryPolicy
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.amqp_frames import RawProperties, encode_properties, short_bytes, table
from tests.integration.helpers import cli, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


class Mail(BaseModel):
    to: str
    order_id: int


async def publish(broker: BrokerSettings, body: bytes, routing_key: str = "work", **props: Any) -> None:
    """Publish to the ``jobs`` exchange as a foreign publisher would (aio-pika, persistent)."""
    props.setdefault("content_type", "application/json")
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        await exchange.publish(aio_pika.Message(body, delivery_mode=2, **props), routing_key=routing_key)


async def publish_raw(broker: BrokerSettings, queue: str, message_id: str, extra: dict[str, bytes]) -> None:
    """Publish a frame built byte by byte (a millisecond ``timestamp`` aio-pika can't send)."""
    values = {
        "content_type": short_bytes(b"application/json"),
        "delivery_mode": b"\x02",
        "message_id": short_bytes(message_id.encode()),
        "type": short_bytes(b"mail"),
        **extra,
    }
    async with raw_channel(broker) as ch:
        underlay = await ch.get_underlay_channel()
        raw = RawProperties(encode_properties(values), message_id=message_id)
        await underlay.basic_publish(b'{"to": "a@b", "order_id": 1}', exchange="", routing_key=queue, properties=raw)


async def quarantined(broker: BrokerSettings) -> dict[str, dict[str, Any]]:
    """Headers of each message in ``work.quarantine`` by job id (browsed, left in place)."""
    _, messages = await browse(broker, "work.quarantine")
    return {m.item.job_id: m.delivery.headers for m in messages}


async def test_no_tenant_stays_absent_through_quarantine_and_replay(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    seen: list[tuple[str, str | None, bool]] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        seen.append((ctx.job_id, ctx.tenant, envelope.TENANT in ctx.headers))
        if "amqpjobs-replay-count" not in ctx.headers:
            raise Reject("quarantine it once")

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("mail", Mail(to="a@b", order_id=1), job_id="no-tenant")
        # a foreign publisher's "" means no tenant (documented)
        await publish(broker, b'{"to": "a@b", "order_id": 2}', message_id="empty-tenant", type="mail",
                      headers={envelope.TENANT: ""})  # fmt: skip
        await publish(broker, b'{"to": "a@b", "order_id": 3}', message_id="blank-tenant", type="mail",
                      headers={envelope.TENANT: " \t "})  # fmt: skip
        await publish(broker, b'{"to": "a@b", "order_id": 4}', message_id="table-tenant", type="mail",
                      headers={envelope.TENANT: {"id": 7}})  # fmt: skip
        await rec.wait_for(lambda o: len(o) == 4)
        headers = await quarantined(broker)
        report = await replay(broker, "work.quarantine", ReplayOptions(rate=100))
        await rec.wait_for(lambda o: len(o) == 8)
    await app.close()
    assert report.replayed == 4
    # evidence writes no tenant it doesn't have, and keeps no foreign "no tenant" either (README evidence table)
    assert {job_id: envelope.TENANT in h for job_id, h in headers.items()} == dict.fromkeys(
        ["no-tenant", "empty-tenant", "blank-tenant", "table-tenant"], False
    )
    assert sorted(seen) == [  # ctx.headers are as received: the foreign header, then none on the replayed copy
        ("blank-tenant", None, False), ("blank-tenant", None, True),
        ("empty-tenant", None, False), ("empty-tenant", None, True),
        ("no-tenant", None, False), ("no-tenant", None, False),
        ("table-tenant", None, False), ("table-tenant", None, True),  # a table is no tenant (not its repr)
    ]  # fmt: skip


async def test_attempts_evidence_counts_handler_runs_not_the_attempt_header(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    app = await make_app(broker, tmp_path)
    runs: list[tuple[str, int]] = []

    @app.job("mail", queue="work", payload=Mail)  # 4 attempts: one more than the 3 tiers
    async def mail(payload: Mail, ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        raise RuntimeError("fails every time")

    @app.job("once", queue="work", retry=RetryPolicy(max_attempts=2))
    async def once(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        raise RuntimeError("fails every time")

    body = b'{"to": "a@b", "order_id": 1}'
    async with running_worker(app, broker) as (_, rec):
        for job_id, attempt in (("at-999", 999), ("at-128", 128), ("at-2**40", 2**40), ("at-3", 3)):
            await publish(broker, body, message_id=job_id, type="mail", headers={envelope.ATTEMPT: attempt})
        await app.enqueue("once", {}, job_id="ours")
        await rec.wait_for(lambda o: sum(1 for x in o if type(x.decision).__name__ == "Quarantine") == 5)
        headers = await quarantined(broker)
    await app.close()
    attempts = {job_id: (h[evidence.REASON], h[evidence.ATTEMPTS]) for job_id, h in headers.items()}
    assert attempts == {
        "at-999": ("exhausted", 0), "at-128": ("exhausted", 0), "at-2**40": ("exhausted", 0),
        "at-3": ("exhausted", 2), "ours": ("exhausted", 2),
    }  # fmt: skip
    assert sorted(runs) == [("at-3", 3), ("at-3", 4), ("ours", 1), ("ours", 2)]


FORGED = "\n2026-11-30 09:00:00,000 INFO amqpjobs.worker: job=mail id=forged attempt=1 outcome=succeeded"
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")
TERMINAL = ("\x1b", "\x9b", "\x07", "\r", "\u2028", "\u202e")


async def test_control_characters_never_forge_a_log_line_or_a_show_line(
    broker: BrokerSettings, tmp_path: Path, text_log: io.StringIO
) -> None:
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        raise Reject(f"refused{FORGED}\x1b]0;title\x07")

    async with running_worker(app, broker) as (_, rec):
        # a newline in message_id, in type, and pydantic's multi-line error message
        await publish(broker, b'{"to": 1}', message_id=f"bad-payload{FORGED}", type="mail")
        await publish(broker, b"{}", message_id="bad-type", type=f"mail\x1b[2J{FORGED}\u2028x\x9b31m")
        await publish(broker, b'{"to": "a@b", "order_id": 1}', message_id="rejected\r", type="mail",
                      headers={envelope.TENANT: f"t\x1b[31m{FORGED}"})  # fmt: skip
        await rec.wait_for(lambda o: len(o) == 3)
    await app.close()
    log_text = text_log.getvalue()
    lines = log_text.splitlines()
    assert lines, "the worker logged nothing"
    assert [line for line in lines if not LOG_LINE.match(line)] == []
    assert [line for line in lines if "outcome=succeeded" in line and "forged" in line.split(":", 3)[2][:40]] == []
    assert [c for c in TERMINAL if c in log_text] == []
    outcome_lines = [line for line in lines if " outcome=" in line]
    assert len(outcome_lines) == 3, outcome_lines
    assert any('id="bad-payload\\n2026-11-30' in line for line in outcome_lines), outcome_lines

    show = await asyncio.to_thread(cli, broker, "quarantine", "show", "work.quarantine")
    assert show.exit_code == 0, show.output
    out = show.stdout
    assert [c for c in TERMINAL if c in out] == []
    shown = out.splitlines()
    ours = ("3 of 3 message(s) in work.quarantine shown", "next: fixed? amqpjobs replay work.quarantine --canary 1; "
            "a lost cause? amqpjobs quarantine park work.quarantine")  # fmt: skip
    assert [line for line in shown if not (line.startswith(("--- job ", "    ")) or line in ours)] == []
    assert sum(line.startswith("--- job ") for line in shown) == 3
    assert "--- job mail\\x1b[2J\\n2026-11-30" in out
    as_json = await asyncio.to_thread(cli, broker, "quarantine", "show", "work.quarantine", "--json")
    assert [c for c in TERMINAL if c in as_json.stdout] == []  # escaped by JSON's rules, values unchanged
    docs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert sorted(d["message_id"] for d in docs) == sorted([f"bad-payload{FORGED}", "bad-type", "rejected\r"])
    assert {d["headers"].get(envelope.TENANT) for d in docs} == {None, f"t\x1b[31m{FORGED}"}
    listed = await asyncio.to_thread(cli, broker, "quarantine", "list", "work.quarantine")
    assert [c for c in TERMINAL if c in listed.stdout] == []
    assert len(listed.stdout.splitlines()) == 2 + 3 + 1  # queue line, header, a row per (job, reason, type), next


LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?=\s|$)')


async def test_a_hostile_value_forges_no_key_in_the_plain_log(
    broker: BrokerSettings, tmp_path: Path, text_log: io.StringIO
) -> None:
    """A value with a space, ``=`` or ``"`` is one quoted logfmt value: ``grep outcome=succeeded`` counts right."""
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        raise Reject('no outcome=succeeded "quoted" \\" id=x')

    async with running_worker(app, broker) as (_, rec):
        await publish(broker, b"{}", message_id="x outcome=succeeded", type="mail")  # invalid payload
        await publish(broker, b"{}", message_id='q" outcome=succeeded', type="mail outcome=succeeded")
        await publish(broker, b'{"to": "a@b", "order_id": 1}', message_id="a=b outcome=succeeded", type="mail")
        await rec.wait_for(lambda o: len(o) == 3)
    await app.close()
    outcome_lines = [line for line in text_log.getvalue().splitlines() if " outcome=" in line]
    assert len(outcome_lines) == 3, outcome_lines
    outcomes = []
    for line in outcome_lines:
        pairs = [(m.group(1), m.group(2)) for m in LOGFMT_PAIR.finditer(line.split(": ", 1)[1])]
        assert [k for k, _ in pairs].count("outcome") == 1, line
        assert [k for k, _ in pairs][:2] == ["job", "id"], line
        outcomes += [v for k, v in pairs if k == "outcome"]
    assert sorted(outcomes) == ["quarantined"] * 3


async def wait_for_head_timestamp(broker: BrokerSettings, queue: str, stale: int | None = None) -> int:
    """The management API refreshes its figures every few seconds; wait for the head timestamp.

    ``stale``: a head timestamp from before (a message since gone): wait for another one.
    """
    deadline = time.monotonic() + 15
    with ManagementClient(broker) as mgmt:
        while time.monotonic() < deadline:
            head = (mgmt.queue(broker.vhost, queue) or {}).get("head_message_timestamp")
            if head is not None and int(head) != stale:
                return int(head)
            await asyncio.sleep(0.25)
    raise AssertionError("management statistics did not refresh")


async def test_millisecond_timestamps_read_by_one_rule(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    sent_at = time.time() - 326
    millis = int(sent_at * 1000)
    await publish_raw(broker, "work", "ms-old", {"timestamp": struct.pack(">Q", millis)})
    assert await wait_for_head_timestamp(broker, "work") == millis  # the broker passes milliseconds on
    before = time.time()
    result = await asyncio.to_thread(cli, broker, "status", "--queues", "work", "--json", "--max-age", "60s")
    after = time.time()  # the command measured the age in between (a loaded machine takes seconds to start it)
    doc = json.loads(result.stdout)
    (work,) = doc["job_queues"][0]["work"]
    assert before - sent_at - 1.0 <= work["oldest_age"] <= after - sent_at + 1.0, (work, before, after, sent_at)
    assert [
        p
        for p in doc["job_queues"][0]["problems"]
        if re.fullmatch(r"oldest message in work is 3[2-4]\ds old \(> 60s\)", p)
    ]
    assert result.exit_code == 1

    seen: list[datetime | None] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        seen.append(ctx.enqueued_at)

    # our enqueued-at header as an AMQP timestamp in milliseconds, and as an integer of seconds
    header_ms = table([(envelope.ENQUEUED_AT.encode(), b"T" + struct.pack(">Q", millis))])
    header_s = table([(envelope.ENQUEUED_AT.encode(), b"l" + struct.pack(">q", int(sent_at)))])
    await publish_raw(broker, "work", "ms-header", {"headers": header_ms})
    await publish_raw(broker, "work", "s-int-header", {"headers": header_s})
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == 3)
    await app.close()
    assert [t is not None and t.tzinfo == UTC for t in seen] == [True, True, True]
    stamps = [t.timestamp() for t in seen if t is not None]
    assert [abs(s - sent_at) < 1 for s in stamps] == [True, True, True], (stamps, sent_at)  # whole seconds last


async def test_enqueued_at_is_always_an_aware_utc_datetime(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    seen: dict[str, datetime | None] = {}

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.enqueued_at

    body = b'{"to": "a@b", "order_id": 1}'
    async with running_worker(app, broker) as (_, rec):
        for job_id, text in (("naive", "2026-11-30T09:00:00"), ("plus-2", "2026-11-30T11:00:00+02:00"),
                             ("zulu", "2026-11-30T09:00:00.000Z")):  # fmt: skip
            await publish(broker, body, message_id=job_id, type="mail", headers={envelope.ENQUEUED_AT: text})
        await rec.wait_for(lambda o: len(o) == 3)
    await app.close()
    nine = datetime(2026, 11, 30, 9, tzinfo=UTC)
    assert {k: (v, v.tzinfo if v else None) for k, v in seen.items()} == {
        "naive": (nine, UTC), "plus-2": (nine, UTC), "zulu": (nine, UTC),
    }  # fmt: skip
