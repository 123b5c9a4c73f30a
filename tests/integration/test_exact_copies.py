"""Copies keep every header's AMQP field type and value, and the message's properties, byte for byte.

A message with one header of each field type RabbitMQ knows (``t b B s u I i l f d D S x
A T F V``) and every basic property set is published as a raw content-header frame (built
with pamqp's per-type encoders: aio-pika can't send most of these types). The job fails
once (retried through a delay tier), fails again (quarantined), and is replayed. The
content-header frames the process receives are captured as bytes, and at each stage
(retried delivery, quarantined copy, replayed copy) every header sent must come back with
the same type code and the same bytes, and every property with the same bytes, except:

* ``expiration``: dropped from copies (a copy would expire in a delay tier or quarantine);
* ``user_id``: dropped from copies (the broker refuses a ``user_id`` other than the
  publishing connection's user, and a worker or replay may connect as another user);
* ``timestamp``: a retry or replayed copy's is when it becomes ready in the work queue
  (seconds), and every copy carries the first enqueue time in ``amqpjobs-enqueued-at``.
"""

from __future__ import annotations

import logging
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from pamqp import decode

from amqpjobs import JobContext, RetryPolicy
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.replay import replay
from amqpjobs.wire import header_decoding
from amqpjobs.wire.settings import BrokerSettings
from tests.amqp_frames import (
    DROPPED,
    MILLIS,
    SENT,
    RawProperties,
    encode_properties,
    long_bytes,
    short_bytes,
    split_properties,
    split_table,
    table,
)
from tests.integration.helpers import capture_content_headers, depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Payloads of every content-header frame this process receives, in order."""
    return capture_content_headers(monkeypatch)


def stage(frames: list[bytes], name: str) -> dict[str, bytes]:
    """The first received frame of a stage, as properties (the headers table split into entries)."""
    for payload in frames:
        props = split_properties(payload)
        entries = split_table(props.get("headers", b"\0\0\0\0"))
        ours = {k.decode(): v for k, v in entries.items() if k.startswith(b"amqpjobs-")}
        kind = (
            "replay" if q.REPLAY_ID in ours
            else "quarantine" if evidence.REASON in ours
            else "retry" if decode.embedded_value(ours.get("amqpjobs-attempt", b"V"))[1] == 2
            else "original" if not ours
            else "other"
        )  # fmt: skip
        if kind == name:
            return props
    raise AssertionError(f"no {name} frame among {len(frames)} received")


async def test_copies_keep_header_types_and_properties_byte_exact(
    broker: BrokerSettings, tmp_path: Path, received: list[bytes]
) -> None:
    app = await make_app(broker, tmp_path)
    runs: list[dict[str, Any]] = []

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=2))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(dict(ctx.headers))
        raise RuntimeError("fails every time")

    started = int(time.time())
    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            underlay = await ch.get_underlay_channel()
            raw = RawProperties(encode_properties(SENT), message_id="exact-1")
            await underlay.basic_publish(b'{"n": 1}', exchange="jobs", routing_key="work", properties=raw)
        await rec.wait_for(lambda o: len(o) == 2, timeout=20)
    assert len(runs) == 2
    assert runs[0]["d-double"] == 1.1  # what a handler sees: pamqp's decoding
    assert await depth(broker, "work.quarantine") == 1
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=100))
    assert report.replayed == 1
    async with raw_channel(broker) as ch:
        underlay = await ch.get_underlay_channel()
        back = await underlay.basic_get("work", no_ack=True)
        assert back.body == b'{"n": 1}'

    sent_headers = split_table(SENT["headers"])
    original = stage(received, "original")
    assert split_table(original["headers"]) == sent_headers  # the broker passes the frame through
    expected = {k: v for k, v in SENT.items() if k not in DROPPED | {"headers"}}
    wrong: dict[str, dict[str, tuple[bytes | None, bytes | None]]] = {}  # stage -> what -> (got, sent)
    for name in ("retry", "quarantine", "replay"):
        props = stage(received, name)
        entries = split_table(props["headers"])
        for key, sent in sent_headers.items():  # type code and value bytes of every publisher header
            if entries.get(key) != sent:
                wrong.setdefault(name, {})[f"header {key!r}"] = (entries.get(key), sent)
        for prop in SENT.keys() - {"headers", "timestamp"}:
            if props.get(prop) != expected.get(prop):
                wrong.setdefault(name, {})[prop] = (props.get(prop), expected.get(prop))
        # the first enqueue time, from the publisher's millisecond timestamp: never lost (README "Wire format")
        first = b"S" + long_bytes(envelope.iso_utc(MILLIS / 1000).encode())
        if entries.get(envelope.ENQUEUED_AT.encode()) != first:
            wrong.setdefault(name, {})[envelope.ENQUEUED_AT] = (entries.get(envelope.ENQUEUED_AT.encode()), first)
    assert wrong == {}
    # timestamp: when the copy becomes ready in the work queue, whole seconds; quarantine keeps the received one
    ready = {
        name: struct.unpack(">Q", stage(received, name)["timestamp"])[0] for name in ("retry", "quarantine", "replay")
    }
    assert started <= ready["retry"] <= int(time.time()), ready  # its publish + the 200 ms tier
    assert ready["quarantine"] == ready["retry"]  # the retry copy's, as it came
    assert ready["retry"] <= ready["replay"] <= int(time.time()), ready


async def test_a_header_nested_thousands_deep_neither_stops_the_queue_nor_loses_its_bytes(
    broker: BrokerSettings, tmp_path: Path, received: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """The broker accepts a table 2,000 deep; decoding it whole would exceed Python's recursion limit.

    Before: every decode of its content header raised RecursionError, the connection was
    lost, the message redelivered, and again (review16: every ~5 s, the queue stopped).
    """
    caplog.set_level(logging.WARNING, "amqpjobs")
    app = await make_app(broker, tmp_path)
    seen: dict[str, Any] = {}

    @app.job("mail", queue="work", retry=RetryPolicy(max_attempts=1))
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.headers.get("deep")
        if ctx.job_id == "deep-1":
            raise RuntimeError("fails: quarantined with its headers")

    deep = b"I" + struct.pack(">i", 1)
    for _ in range(2000):
        deep = b"F" + table([(b"in", deep)])
    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            underlay = await ch.get_underlay_channel()
            for message_id in ("deep-1", "after-1"):  # a job behind it runs too
                values = {"type": short_bytes(b"mail"), "message_id": short_bytes(message_id.encode())}
                if message_id == "deep-1":
                    values["headers"] = table([(b"deep", deep)])
                properties = RawProperties(encode_properties(values), message_id=message_id)
                await underlay.basic_publish(b"{}", exchange="jobs", routing_key="work", properties=properties)
        await rec.wait_for(lambda o: len(o) == 2, timeout=20)
    assert sorted(seen) == ["after-1", "deep-1"]  # each ran once
    levels, inner = 0, seen["deep-1"]
    while isinstance(inner, dict):
        inner, levels = inner["in"], levels + 1
    assert (levels, inner) == (header_decoding.MAX_DEPTH, None)  # decoded 64 deep, None from there in
    assert [o.kind for o in rec.outcomes if o.job_id == "deep-1"] == ["quarantined"]
    assert await depth(broker, "work.quarantine") == 1
    # its bytes, all 2,000 deep, in the quarantine copy (found by our evidence: pamqp can't split it, too deep)
    (taken,) = await drain(broker, "work.quarantine")
    assert taken.message_id == "deep-1"
    (copy,) = [p for p in received if evidence.REASON.encode() in p]
    assert short_bytes(b"deep") + deep in copy
    assert not [r.getMessage() for r in caplog.records if " lost " in r.getMessage()]  # no connection lost
