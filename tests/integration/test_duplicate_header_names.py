"""A copy carries every entry of the header table it was made from, a name that occurs twice included.

Another publisher's header table may hold the same name twice (AMQP does not forbid it), or
two names that are not UTF-8 and read alike (U+FFFD for the bad bytes). A decoded table
holds one entry per name; the copy must not: every entry the worker received goes out again,
byte for byte, in the order the broker delivered it (README "Wire format", copies).

What the brokers deliver (seen here): RabbitMQ 3.10 passes a published table through as it
came, and a dead-lettered message's table (a retry back from its delay tier) re-encoded in
name order, entries of one name in their order; RabbitMQ 4.0.5 re-encodes every table it
delivers in name order and keeps only the first entry of a name that occurs twice (two names
whose bytes differ are two names to it).

Before the fix each copy kept one entry per decoded name (3.10: ``dup`` "second" only, and
one of the two names that are not UTF-8; 4.0.5: one of those two).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pamqp import encode

from amqpjobs import JobContext, RetryPolicy
from amqpjobs.jobs import evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.amqp_frames import (
    RawProperties,
    encode_properties,
    long_bytes,
    short_bytes,
    split_properties,
    table,
    table_entries,
)
from tests.conftest import BrokerRoot
from tests.integration.helpers import capture_content_headers, cli, depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker

DUP_FIRST = (b"dup", b"S" + long_bytes(b"first"))
DUP_SECOND = (b"dup", b"I" + encode.long_int(2))  # another type too: byte for byte
BAD_FF = (b"name-\xff", b"S" + long_bytes(b"ff"))
BAD_FE = (b"name-\xfe", b"d" + encode.double(1.1))
ZZ = (b"zz", b"S" + long_bytes(b"last by name"))
AA = (b"aa", b"s" + encode.short_int(-3))
#: Published in this order: not in name order, ``dup`` twice, two names that decode alike.
SENT = [ZZ, DUP_FIRST, AA, DUP_SECOND, BAD_FF, BAD_FE]


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Payloads of every content-header frame this process receives, in order, as raw bytes."""
    return capture_content_headers(monkeypatch)


def theirs(payload: bytes) -> list[tuple[bytes, bytes]]:
    """The publisher's entries of a content header's table (not ours, not the broker's), in order."""
    entries = table_entries(split_properties(payload).get("headers", b"\0\0\0\0"))
    return [(k, v) for k, v in entries if not k.startswith((b"amqpjobs-", b"x-"))]


def stages(frames: list[bytes], message_id: bytes) -> dict[str, list[bytes]]:
    """The frames of one job by stage, in the order received: original, retry, quarantine, replay."""
    out: dict[str, list[bytes]] = {}
    for payload in frames:
        props = split_properties(payload)
        if props.get("message_id") != short_bytes(message_id):
            continue
        names = {k for k, _ in table_entries(props.get("headers", b"\0\0\0\0"))}
        kind = (
            "replay" if q.REPLAY_ID.encode() in names
            else "quarantine" if evidence.REASON.encode() in names
            else "retry" if any(k.startswith(b"amqpjobs-") for k in names)
            else "original"
        )  # fmt: skip
        out.setdefault(kind, []).append(payload)
    return out


async def test_copies_keep_every_entry_of_a_name_that_occurs_twice(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path, received: list[bytes]
) -> None:
    app = await make_app(broker, tmp_path)

    @app.job("twice", queue="work", retry=RetryPolicy(max_attempts=2))
    async def twice(payload: dict[str, Any], ctx: JobContext) -> None:
        raise RuntimeError("fails every time: retried once, then quarantined")

    @app.job("once", queue="work", retry=RetryPolicy(max_attempts=1))
    async def once(payload: dict[str, Any], ctx: JobContext) -> None:
        raise RuntimeError("fails: quarantined from its first delivery")

    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            underlay = await ch.get_underlay_channel()
            for job in (b"twice", b"once"):
                values = {"headers": table(SENT), "type": short_bytes(job), "message_id": short_bytes(job + b"-1")}
                raw = RawProperties(encode_properties(values), message_id=(job + b"-1").decode())
                await underlay.basic_publish(b"{}", exchange="jobs", routing_key="work", properties=raw)
        await rec.wait_for(lambda o: len(o) == 3, timeout=20)
    assert sorted(o.kind for o in rec.outcomes) == ["quarantined", "quarantined", "retried"]
    assert await depth(broker, "work.quarantine") == 2
    # what `quarantine show` says of them: every entry too (the decoded "headers" hold one per name)
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json")
    assert shown.exit_code == 0, shown.output
    docs = {doc["message_id"]: doc for doc in map(json.loads, shown.output.splitlines())}
    four = broker_root.version >= (4,)
    for name in ("once", "twice"):
        entries = [[k, v] for k, v in docs[f"{name}-1"]["header_entries"] if not k.startswith("amqpjobs-")]
        assert entries == (
            [["aa", -3], ["dup", "first"], ["name-\ufffd", 1.1], ["name-\ufffd", "ff"], ["zz", "last by name"]] if four
            else [["zz", "last by name"], ["dup", "first"], ["aa", -3], ["dup", 2], ["name-\ufffd", "ff"],
                  ["name-\ufffd", 1.1]] if name == "once"
            else [["aa", -3], ["dup", "first"], ["dup", 2], ["name-\ufffd", 1.1], ["name-\ufffd", "ff"],
                  ["zz", "last by name"]]
        ), name  # fmt: skip
        assert docs[f"{name}-1"]["headers"]["dup"] == ("first" if four else 2)  # the last entry's
    text = await asyncio.to_thread(cli, broker, "quarantine", "show", "work")
    lines = text.output.splitlines()
    assert lines.count('    dup: "first"') == 2, text.output  # both jobs
    assert lines.count("    dup: 2") == (0 if four else 2), text.output
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=100))  # frames as the broker delivers them
    assert report.replayed == 2
    async with raw_channel(broker) as ch:
        underlay = await ch.get_underlay_channel()
        for _ in range(2):
            assert (await underlay.basic_get("work", no_ack=True)).body == b"{}"  # the replayed copies

    # what the worker received: 3.10 passes the table through, and after the delay tier delivers it in name
    # order (dup's two entries in their order); 4.0.5 sorts every table and keeps the first entry of a name
    by_name = [AA, DUP_FIRST, DUP_SECOND, BAD_FE, BAD_FF, ZZ]
    delivered = {
        b"once": [AA, DUP_FIRST, BAD_FE, BAD_FF, ZZ] if four else SENT,
        b"twice": [AA, DUP_FIRST, BAD_FE, BAD_FF, ZZ] if four else by_name,
    }
    for job, expected in delivered.items():
        frames = stages(received, job + b"-1")
        assert {k: len(v) for k, v in frames.items()} == (
            {"original": 1, "retry": 1, "quarantine": 3, "replay": 1}  # quarantined: taken by 2 shows, 1 replay
            if job == b"twice"
            else {"original": 1, "quarantine": 3, "replay": 1}
        )
        # the delivery the worker quarantined: the retry back from its tier, or the original
        assert theirs(frames["retry" if job == b"twice" else "original"][0]) == expected, job
        # the quarantined copy (as the shows and the replay took it) and the replayed one: every entry, in
        # that order (4.0.5 delivers them sorted by name again, which is their order already)
        assert [theirs(f) for f in frames["quarantine"]] == [expected] * 3, job
        assert theirs(frames["replay"][0]) == expected, job


async def test_a_copy_whose_entries_outgrow_the_frame_never_goes_out_whole(
    broker: BrokerSettings,
    broker_root: BrokerRoot,
    tmp_path: Path,
    received: list[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A name three times, 43,000 bytes each: the message fits a frame, its quarantine copy with evidence not.

    The frame check sized a copy from its decoded headers (one of the three entries) and let
    it go: a content-header frame over ``frame_max`` makes the broker close the connection.
    The copy is sized exactly now: its evidence is trimmed to the room left (README "Bad messages").
    Before: the worker's publisher connection was closed (``FRAME_ERROR``, ``frame_too_large``,
    134452 > 131064) at every try, and the worker held the delivery and consumed nothing more.
    RabbitMQ 4.0.5 delivers one entry of the three (the first): there the copy fits anyway.
    """
    caplog.set_level(logging.WARNING, "amqpjobs")
    app = await make_app(broker, tmp_path)

    @app.job("big", queue="work", retry=RetryPolicy(max_attempts=1))
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        raise RuntimeError("fails: quarantined " + "with a long message " * 100)

    entry = (b"big", b"S" + long_bytes(b"v" * 43_000))
    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            underlay = await ch.get_underlay_channel()
            values = {"headers": table([entry] * 3), "type": short_bytes(b"big"), "message_id": short_bytes(b"big-1")}
            raw = RawProperties(encode_properties(values), message_id="big-1")
            await underlay.basic_publish(b"{}", exchange="jobs", routing_key="work", properties=raw)
        await rec.wait_for(lambda o: len(o) >= 1, timeout=20)
    assert [o.kind for o in rec.outcomes] == ["quarantined"]
    assert await depth(broker, "work.quarantine") == 1
    (taken,) = await drain(broker, "work.quarantine")
    assert taken.message_id == "big-1"
    # the copy as the raw consumer got it: every entry delivered to the worker
    assert theirs(received[-1]) == [entry] * (1 if broker_root.version >= (4,) else 3)
    assert len(received[-1]) <= 131_072 - 8  # in one frame
    assert not [r.getMessage() for r in caplog.records if " lost " in r.getMessage()]  # no connection lost
