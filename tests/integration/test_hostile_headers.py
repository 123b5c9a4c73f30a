"""Every AMQP field type in every header the worker reads, and the data file's typed lines, on the real broker.

Published raw (content headers built byte by byte: :mod:`tests.integration.hostile_frames`)
to exchange ``jobs`` / key ``work``, where one worker serves job ``mail`` (and ``poison``,
which always raises). Each message must run (at the expected attempt, with the expected
tenant) or reach ``work.quarantine`` exactly once with evidence naming what was wrong; the
work queue and the tiers end empty; a job enqueued afterwards runs (the worker is alive);
the plain-text log holds no raw control character.

The matrix: 17 field types x 9 headers (our ``amqpjobs-attempt``, ``-runs``, ``-job``,
``-tenant``, ``-enqueued-at``, ``-payload-ref``, the broker's ``x-delivery-count`` and
``x-death``, and ``traceparent``). The lines of ``tests/data/bad-messages.jsonl`` whose
``replay`` names this file are replayed here too (:data:`LINE_EXPECT`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq
import pytest
from pydantic import BaseModel

from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.outcome import Ack, Quarantine, RetryLater
from amqpjobs.jobs.registry import JobContext
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.hostile_frames import CODES, KIND, raw_properties, typed, value_bytes
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.chaos]

DATA = Path(__file__).resolve().parents[1] / "data" / "bad-messages.jsonl"
ME = "tests/integration/test_hostile_headers.py"
VALID = b'{"to": "a@example.com", "order_id": 17}'
TIERS = ("200ms", "400ms", "600ms")


class Mail(BaseModel):
    to: str
    order_id: int


@dataclass(frozen=True)
class Want:
    """What must become of one message: ``processed`` at ``attempt``, or quarantined for ``reason``."""

    outcome: str
    attempt: int = 1
    reason: str = ""
    error: str = ""  # a substring of the amqpjobs-error-message evidence header
    tenant: str | None = None
    runs: int = 1
    evidence: dict[str, Any] = field(default_factory=dict)


def run(attempt: int = 1, tenant: str | None = None) -> Want:
    return Want("processed", attempt, tenant=tenant)


def held(reason: str, error: str = "", runs: int = 0, ev: dict[str, Any] | None = None) -> Want:
    return Want("quarantined", reason=reason, error=error, runs=runs, evidence=ev or {})


TEXT = {envelope.ATTEMPT: "2", envelope.RUNS: "1", envelope.JOB: "mail", envelope.TENANT: "acme",
        envelope.ENQUEUED_AT: "2026-11-29T09:00:00Z", envelope.PAYLOAD_REF: "nostore:k", "x-delivery-count": "2",
        "x-death": "x", "traceparent": "x"}  # fmt: skip
LITERAL = {**dict.fromkeys("bBsuIilD", "2"), "f": "2.0", "d": "2.0", "t": "true", "A": "1", "T": "1764406800",
           "F": "1", "V": ""}  # fmt: skip


def matrix_want(name: str, code: str) -> Want:
    if name == envelope.ATTEMPT:
        return run(2 if code not in "tATFV" else 1)
    if name == envelope.JOB:
        return run() if code in "Sx" else held("unknown-job", f"header amqpjobs-job is {KIND[code]}, expected a string",
                                               ev={evidence.JOB: ""})  # fmt: skip
    if name == envelope.PAYLOAD_REF:
        return (
            held("payload-store-unknown")
            if code in "Sx"
            else held("payload-ref-invalid", f"header amqpjobs-payload-ref is {KIND[code]}, not '<store>:<key>' text")
        )
    if name == envelope.TENANT:
        return run(tenant="acme" if code in "Sx" else "2" if code in "bBsuIilD" else None)  # D: decimal 2, scale 0
    return run()


def matrix() -> list[tuple[str, dict[str, Any], list[tuple[bytes, bytes]], Want]]:
    cases = []
    for name, text in TEXT.items():
        for code in CODES:
            literal = text if code == "S" else text.encode().hex() if code == "x" else LITERAL[code]
            props = {"content_type": "application/json", "message_id": f"m-{name}-{code}"}
            if name != envelope.JOB:
                props["type"] = "mail"
            cases.append((f"m-{name}-{code}", props, [(name.encode(), typed(code, literal))], matrix_want(name, code)))
    return cases


#: The right outcome of each data-file line replayed here, by id.
LINE_EXPECT: dict[str, Want] = {
    "attempt-double-1e300": held("exhausted", "header amqpjobs-attempt is 1e+300 (a float), above 9223372036854775807"),
    "attempt-25-digits": held("exhausted", "is '1000000000000000000000000' (a string), above 9223372036854775807"),
    "attempt-20-digit-bytes": held("exhausted", "(a byte array), above 9223372036854775807"),
    "attempt-long-max": held("exhausted", "attempt header says 9223372036854775807, above max_attempts 4"),
    "attempt-decimal-3": run(3),
    "attempt-float-3": run(3),
    "job-header-array": held(
        "unknown-job", "header amqpjobs-job is an array, expected a string", ev={evidence.JOB: ""}
    ),
    "job-header-table": held("unknown-job", "header amqpjobs-job is a table, expected a string"),
    "job-header-control-characters": held("unknown-job", "is not served from job queue"),
    "body-json-number": held("invalid-payload", "payload must be a JSON object, got int"),
    "body-string-not-utf8": held("undecodable", "body is not UTF-8"),
    "content-type-xml": held("unsupported-content-type", "'application/xml'"),
    "priority-200": run(),
    "expiration-zero": run(),
    "headers-nested-100": run(),
    "timestamp-year-9999": run(),
    "timestamp-past-year-9999": run(),
    "x-death-count-negative": run(),
    "x-death-count-string": run(),
    "x-death-count-double-1e300": run(),
    "x-death-10000-entries": run(),
    "x-death-a-string": run(),
    "poison-x-death-count-string": held("exhausted", "poisoned", runs=4),
    # a first delivery on a classic queue: no count is the broker's (evidence.broker_counters), whatever it says
    "delivery-count-double-1e300": held("unknown-job", "", ev={evidence.DELIVERY_COUNT: 0}),
    "delivery-count-negative": held("unknown-job", "", ev={evidence.DELIVERY_COUNT: 0}),
}
#: Lines the broker refuses at publish (measured on 3.10.8): what the publisher's channel or connection hears.
REFUSED = {
    "expiration-negative": "PRECONDITION_FAILED - invalid expiration '-1'",
    "expiration-text": "PRECONDITION_FAILED - invalid expiration 'abc'",
    "header-double-nan": "INTERNAL_ERROR",
}


def lines() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r.get("replay") == ME]


def line_case(raw: dict[str, Any]) -> tuple[str, dict[str, Any], list[tuple[bytes, bytes]] | None, bytes]:
    raw = json.loads(json.dumps(raw).replace("{job}", "mail"))
    props = {k: v for k, v in raw["properties"].items() if k != "headers"}
    props.setdefault("message_id", f"h-{raw['id']}")
    headers = raw["properties"].get("headers")
    entries = None if headers is None else [(k.encode(), value_bytes(v)) for k, v in headers.items()]
    return raw["id"], props, entries, base64.b64decode(raw["body_b64"])


def test_every_replayed_line_has_an_outcome() -> None:
    ids = [r["id"] for r in lines()]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(LINE_EXPECT) | set(REFUSED)


async def _publish(broker: BrokerSettings, body: bytes, props: dict[str, Any], headers: Any) -> str | None:
    """Publish raw on a connection of its own; the broker's refusal, if any, as its text."""
    try:
        async with raw_channel(broker) as ch:
            await ch.set_qos(0)
            underlay = await ch.get_underlay_channel()
            await underlay.basic_publish(body, exchange="jobs", routing_key="work",
                                         properties=raw_properties(props, headers))  # fmt: skip
            await ch.get_exchange("jobs")  # a round trip: a refusal arrives before it
    except (aiormq.exceptions.AMQPError, aio_pika.exceptions.AMQPError) as exc:
        return str(exc)
    return None


def _mgmt_publish(broker: BrokerSettings, body: bytes, props: dict[str, Any]) -> None:
    doc = {"properties": props, "routing_key": "work", "payload": base64.b64encode(body).decode(),
           "payload_encoding": "base64"}  # fmt: skip
    with ManagementClient(broker) as mgmt:
        answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
    assert answer == {"routed": True}


async def _check(broker: BrokerSettings, tmp_path: Path, text_log: io.StringIO,
                 cases: list[tuple[str, dict[str, Any], Any, bytes, Want]]) -> None:  # fmt: skip
    app = await make_app(broker, tmp_path)
    runs: dict[str, list[tuple[int, str | None]]] = {}

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        runs.setdefault(ctx.job_id, []).append((ctx.attempt, ctx.tenant))

    @app.job("poison", queue="work", payload=Mail)
    async def poison(payload: Mail, ctx: JobContext) -> None:
        runs.setdefault(ctx.job_id, []).append((ctx.attempt, ctx.tenant))
        raise RuntimeError("poisoned")

    ids = {props["message_id"] for _, props, _, _, _ in cases}
    async with running_worker(app, broker, concurrency=4) as (_, rec):
        for _, props, headers, body, _ in cases:
            assert await _publish(broker, body, props, headers) is None, props["message_id"]
        settled = lambda o: {x.job_id for x in o if not isinstance(x.decision, RetryLater)} >= ids  # noqa: E731
        await rec.wait_for(settled, timeout=30)
        await app.enqueue("mail", Mail(to="canary@example.com", order_id=1), job_id="canary")
        await rec.wait_for(lambda o: any(x.job_id == "canary" and isinstance(x.decision, Ack) for x in o), 10)
        await asyncio.sleep(0.2)
    await app.close()
    held_msgs = {m.message_id: m for m in await drain(broker, "work.quarantine")}
    for tier in TIERS:
        assert await depth(broker, f"work.retry.{tier}") == 0
    assert await depth(broker, "work") == 0
    assert set(held_msgs) <= ids
    for name, props, _, _, want in cases:
        job_id = props["message_id"]
        final = [o for o in rec.outcomes if o.job_id == job_id and not isinstance(o.decision, RetryLater)]
        assert len(final) == 1, name
        if want.outcome == "processed":
            assert final[0].decision == Ack(), (name, final[0])
            assert runs[job_id] == [(want.attempt, want.tenant)], name
            assert job_id not in held_msgs, name
            continue
        assert final[0].decision == Quarantine(want.reason), (name, final[0])
        assert len(runs.get(job_id, [])) == want.runs, name
        h = held_msgs[job_id].headers
        assert h[evidence.REASON] == want.reason, name
        assert want.error in str(h[evidence.ERROR_MESSAGE]), (name, h[evidence.ERROR_MESSAGE])
        assert not str(h[evidence.JOB]).startswith(("[", "{")), (name, h[evidence.JOB])  # never a Python repr
        for key, value in want.evidence.items():
            assert h[key] == value, (name, key)
    text = text_log.getvalue()
    assert "\x1b" not in text
    assert all(line.startswith(("20", "    ", "Traceback")) or not line for line in text.split("\n")), text[-2000:]


async def test_every_amqp_field_type_in_every_header_read(broker: BrokerSettings, tmp_path: Path,
                                                         text_log: io.StringIO) -> None:  # fmt: skip
    cases = [(name, props, headers, VALID, want) for name, props, headers, want in matrix()]
    await _check(broker, tmp_path, text_log, cases)


async def test_the_data_files_typed_lines(broker: BrokerSettings, tmp_path: Path, text_log: io.StringIO) -> None:
    await (await make_app(broker, tmp_path)).close()  # the topology, for the refusals below
    cases = []
    for raw in lines():
        name, props, headers, body = line_case(raw)
        if name in REFUSED:
            refusal = await _publish(broker, body, props, headers)
            assert refusal is not None, name
            assert REFUSED[name] in refusal, (name, refusal)
            assert await depth(broker, "work") == 0  # nothing entered: the publisher holds it
            continue
        cases.append((name, props, headers, body, LINE_EXPECT[name]))
    await _check(broker, tmp_path, text_log, cases)
