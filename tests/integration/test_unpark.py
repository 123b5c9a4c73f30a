"""``amqpjobs quarantine unpark``: parked jobs back to quarantine without running them, on the real broker."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs.jobs import quarantine as q
from amqpjobs.runtime.quarantine import browse, mover_lock
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import ROOT
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_operator_parking import reject_one
from tests.integration.test_quarantine import cli_env, evidence_for, fill_quarantine
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker


async def fill_parked(broker: BrokerSettings, n: int) -> None:
    """Put n parked jobs (as ``quarantine park`` leaves them) into work.parked, ids p-0 ... p-<n-1>."""
    async with raw_channel(broker) as ch:
        for i in range(n):
            headers = {**evidence_for(i), q.PARKED_AT: "2026-11-29T09:00:00Z"}
            message = aio_pika.Message(
                json.dumps({"n": i}).encode(), content_type="application/json", message_id=f"p-{i}", type="mail",
                headers=headers, delivery_mode=2,
            )  # fmt: skip
            await ch.default_exchange.publish(message, routing_key="work.parked")


def held(items: list[Any]) -> list[tuple[str, str, str]]:
    return [(m.item.job, m.delivery.message_id or "", m.item.reason) for m in items]


@pytest.mark.version_independent
async def test_unpark_moves_parked_jobs_back_to_quarantine_with_their_evidence_and_order(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 4, job="mail")
    await fill_quarantine(broker, 2, job="report", error_type="KeyError", reason="permanent")
    await reject_one(broker, "rej-1")
    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
    assert parked.exit_code == 0, parked.output
    _, before = await browse(broker, "work.parked")
    assert len(before) == 7
    headers_parked = {(m.item.job, m.delivery.message_id): dict(m.delivery.headers) for m in before}

    dry = await asyncio.to_thread(
        cli, broker, "quarantine", "unpark", "work", "--job", "mail", "--error-type", "ValueError", "--dry-run"
    )
    assert dry.exit_code == 0, dry.output
    assert "dry run: 4 would be unparked from work.parked to work.quarantine, nothing moved" in dry.stdout
    assert (await depth(broker, "work.parked"), await depth(broker, "work.quarantine")) == (7, 0)

    started = time.monotonic()
    moved = await asyncio.to_thread(
        cli,
        broker,
        "quarantine",
        "unpark",
        "work",
        "--job",
        "mail",
        "--error-type",
        "ValueError",
        "--rate",
        "10",
        "--yes",
    )
    took = time.monotonic() - started
    assert moved.exit_code == 0, moved.output
    assert "unparked 4 message(s) from work.parked in work.quarantine; 3 left in work.parked" in moved.stdout
    assert "next: amqpjobs quarantine list work.quarantine" in moved.stdout
    assert took >= 0.3, took  # 4 at 10/s: the 4th starts 0.3 s after the first
    _, back = await browse(broker, "work.quarantine")
    assert held(back) == [("mail", f"q-{i}", "exhausted") for i in range(4)]  # in their order
    for m in back:  # every header as parked (the evidence), but the parked mark; persistent
        wanted = {k: v for k, v in headers_parked[("mail", m.delivery.message_id)].items() if k != q.PARKED_AT}
        assert dict(m.delivery.headers) == wanted
        assert m.delivery.properties()["delivery_mode"] == 2
    assert await depth(broker, "work") == 0  # nothing ran, nothing went to the work queue

    rejected = await asyncio.to_thread(cli, broker, "quarantine", "unpark", "work.parked", "--reason", "rejected",
                                       "--yes")  # fmt: skip
    assert rejected.exit_code == 0, rejected.output
    _, back = await browse(broker, "work.quarantine")
    assert (back[-1].delivery.message_id, back[-1].item.reason, back[-1].item.original_queue) == (
        "rej-1", "x-death:rejected", "work",
    )  # fmt: skip
    limited = await asyncio.to_thread(cli, broker, "quarantine", "unpark", "work", "--limit", "1", "--yes")
    assert limited.exit_code == 0, limited.output
    assert "unparked 1 message(s) from work.parked in work.quarantine; 1 left in work.parked" in limited.stdout
    assert "stopped at --limit 1 (the rest were not looked at)" in limited.stdout
    _, rest = await browse(broker, "work.parked")
    assert held(rest) == [("report", "q-1", "permanent")]
    # a parked job replayed from quarantine again is one job: each id once in all three queues
    assert await depth(broker, "work.quarantine") == 6


@pytest.mark.version_independent
async def test_unpark_refuses_bad_input_and_moves_nothing(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_parked(broker, 2)

    def run(*args: str) -> tuple[int, str]:
        result = cli(broker, "quarantine", "unpark", *args)
        return result.exit_code, result.stdout + result.stderr

    for args, code, said in [
        (("work", "--limit", "0", "--yes"), 2, "--limit"),
        (("work", "--limit", "-1", "--yes"), 2, "--limit"),
        (("work", "--rate", "0", "--yes"), 2, "--rate must be a positive"),
        (("work", "--rate", "-5", "--yes"), 2, "--rate must be a positive"),
        (("work", "--rate", "nan", "--yes"), 2, "--rate"),
        (("work", "--rate", "20000", "--yes"), 2, "at most 10000"),
        (("work.quarantine", "--yes"), 2, "unpark takes from a parked queue: give work.parked (or work)"),
        (("nope", "--yes"), 2, "no parked queue 'nope.parked'"),
        (("work",), 2, "refusing to unpark without --yes when stdin is not a terminal"),
        (("work", "--job", "nobody", "--yes"), 0, "no message matched --job 'nobody' among the 2 looked at"),
    ]:
        got, out = await asyncio.to_thread(run, *args)
        assert (got, said in out) == (code, True), (args, out)
    assert (await depth(broker, "work.parked"), await depth(broker, "work.quarantine")) == (2, 0)
    connection = await connect(broker, name="a-mover")
    try:
        for queue, kind in (("work.parked", "parked"), ("work.quarantine", "quarantine")):  # either one's mover
            async with mover_lock(connection, broker, queue, "replay"):
                got, out = await asyncio.to_thread(run, "work", "--yes")
            assert (got, f"{kind} queue {queue!r} is busy: replay" in out) == (4, True), out
        async with mover_lock(connection, broker, "work.parked", "replay"):  # a park waits for its target's mover
            parking = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
        assert (parking.exit_code, "parked queue 'work.parked' is busy: replay" in parking.stderr) == (4, True)
    finally:
        await connection.close()
    assert (await depth(broker, "work.parked"), await depth(broker, "work.quarantine")) == (2, 0)


@pytest.mark.version_independent
@pytest.mark.timeout(120)
async def test_unpark_killed_halfway_loses_nothing_and_duplicates_at_most_one(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    total = 2000
    await fill_parked(broker, total)
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = await asyncio.to_thread(
        subprocess.Popen, [str(exe), "quarantine", "unpark", "work", "--yes"],
        env=cli_env(broker), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while await depth(broker, "work.quarantine") < 300 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(proc.wait, 10)
    for _ in range(100):  # the killed mover's held message returns as the broker sees its connection go
        if await depth(broker, "work.quarantine") + await depth(broker, "work.parked") >= total:
            break
        await asyncio.sleep(0.05)
    _, in_quarantine = await browse(broker, "work.quarantine")
    _, in_parked = await browse(broker, "work.parked")
    moved = [m.delivery.message_id or "" for m in in_quarantine]
    stayed = [m.delivery.message_id or "" for m in in_parked]
    assert 300 <= len(moved) < total, len(moved)
    assert moved == [f"p-{i}" for i in range(len(moved))]  # in order
    assert set(moved) | set(stayed) == {f"p-{i}" for i in range(total)}  # none lost
    assert len(set(moved) & set(stayed)) <= 1  # only the one in flight can be in both
    assert stayed == sorted(stayed, key=lambda s: int(s[2:]))  # the rest in their order


@pytest.mark.version_independent
async def test_unpark_keeps_the_evidence_of_odd_parked_messages(broker: BrokerSettings, tmp_path: Path):
    """A parked message whose only evidence is the broker's x-death (parked by an amqpjobs that copied it as is, or
    shovelled in), one with no evidence at all, and one whose headers nearly fill a frame: each goes back as it was.
    Before: the x-death one came back 'no-evidence' (the copy strips x-death, the only record of why it failed)."""
    await make_app(broker, tmp_path)
    death: dict[str, Any] = {
        "count": 1,
        "reason": "rejected",
        "queue": "work",
        "exchange": "jobs",
        "routing-keys": ["work"],
    }
    big = "x" * 120_000  # under frame_max (131072) with the rest of the properties
    async with raw_channel(broker) as ch:
        odd: list[tuple[str, dict[str, Any]]] = [
            ("dead-1", {"x-death": [death]}),
            ("bare-1", {}),
            ("big-1", {"note": big}),
        ]
        for job_id, headers in odd:
            message = aio_pika.Message(b'{"n": 1}', message_id=job_id, type="mail", headers=headers, delivery_mode=2)
            await ch.default_exchange.publish(message, routing_key="work.parked")
    _, before = await browse(broker, "work.parked")
    assert [(m.delivery.message_id, m.item.reason) for m in before] == [
        ("dead-1", "x-death:rejected"), ("bare-1", "no-evidence"), ("big-1", "no-evidence"),
    ]  # fmt: skip
    moved = await asyncio.to_thread(cli, broker, "quarantine", "unpark", "work", "--yes")
    assert moved.exit_code == 0, moved.output
    assert "unparked 3 message(s) from work.parked in work.quarantine; 0 left in work.parked" in moved.stdout
    _, back = await browse(broker, "work.quarantine")
    assert [(m.delivery.message_id, m.item.reason, m.item.original_queue) for m in back] == [
        ("dead-1", "x-death:rejected", "work"), ("bare-1", "no-evidence", ""), ("big-1", "no-evidence", ""),
    ]  # fmt: skip
    assert back[2].delivery.headers["note"] == big
    assert "x-death" not in back[0].delivery.headers
    assert q.PARKED_AT not in back[0].delivery.headers


@pytest.mark.version_independent
async def test_show_of_a_parked_queue_suggests_commands_that_run(broker: BrokerSettings, tmp_path: Path):
    """Before: `quarantine show work.parked` ended 'a lost cause? amqpjobs quarantine park work.parked', which is
    refused when pasted ('is a parked queue already', exit 2)."""
    await make_app(broker, tmp_path)
    await fill_parked(broker, 2)
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work.parked", "--job", "mail")
    assert shown.exit_code == 0, shown.output
    last = shown.stdout.rstrip().splitlines()[-1]
    assert last == (
        "next: fixed? amqpjobs replay work.parked --job mail --canary 1; "
        "parked by mistake? amqpjobs quarantine unpark work.parked --job mail"
    )
    pasted = await asyncio.to_thread(cli, broker, *last.split("? ")[-1].split()[1:], "--yes")
    assert "unparked 2 message(s) from work.parked in work.quarantine" in pasted.stdout, pasted.output
