"""Reading a quarantine for a listing holds no quarantine's worth of bodies in memory.

The console's quarantine page (groups and the first 200 messages: no payload), ``quarantine
list`` (counts) and ``job show`` (where a job is) read what each message says about itself; they
kept every message's body until the end, so 40 quarantined jobs of 5 MB took the console to 263 MB
(measured here), and a few thousand big ones would take it, or the CLI, past the host's memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs.console.views import quarantine_page
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.runtime.quarantine import browse, export
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, cli_subprocess, raw_channel
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

COUNT, SIZE = 20, 1_000_000  # 20 MB of bodies in all


async def quarantine_big(broker: BrokerSettings, tmp_path: Path) -> None:
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("work.quarantine")
        for i in range(COUNT):
            body = b'{"pad": "' + bytes([ord("a") + i]) * SIZE + b'"}'
            headers: dict[str, Any] = {"amqpjobs-reason": "exhausted", "amqpjobs-original-queue": "work"}
            await exchange.publish(aio_pika.Message(body, message_id=f"big-{i}", type="mail", headers=headers),
                                   routing_key="work")  # fmt: skip


async def peak_of(read: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """What ``read`` returns, and the most memory Python held meanwhile beyond what it held before (bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        value = await read()
        return value, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


async def test_the_console_quarantine_page_holds_no_bodies(broker: BrokerSettings, tmp_path: Path) -> None:
    await quarantine_big(broker, tmp_path)
    page, peak = await peak_of(lambda: quarantine_page(broker, "work.quarantine", Selection()))
    assert (page.depth, page.matched, len(page.messages)) == (COUNT, COUNT, COUNT)
    assert [m.item.key for m in page.messages] == [f"big-{i}" for i in range(COUNT)]
    assert peak < 6 * SIZE, f"{peak:,} bytes held at the peak for {COUNT} bodies of {SIZE:,}"


async def test_quarantine_list_holds_no_bodies(broker: BrokerSettings, tmp_path: Path) -> None:
    await quarantine_big(broker, tmp_path)
    listed, peak = await peak_of(lambda: asyncio.to_thread(cli, broker, "quarantine", "list", "work"))
    assert listed.exit_code == 0, listed.output
    assert f"work.quarantine: {COUNT} message(s)" in listed.stdout
    assert peak < 6 * SIZE, f"{peak:,} bytes held at the peak for {COUNT} bodies of {SIZE:,}"


async def test_a_browse_that_keeps_no_bodies_still_keys_each_message_by_its_body(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    await quarantine_big(broker, tmp_path)
    async with raw_channel(broker) as ch:  # two messages without a job id: keyed by a hash of headers and body
        exchange = await ch.get_exchange("work.quarantine")
        for body in (b'{"n": 1}', b'{"n": 2}'):
            await exchange.publish(aio_pika.Message(body, type="mail", headers={"amqpjobs-reason": "exhausted"}),
                                   routing_key="work")  # fmt: skip
    _, full = await browse(broker, "work.quarantine")
    _, light = await browse(broker, "work.quarantine", keep_bodies=1)
    assert [m.item for m in light] == [m.item for m in full]
    assert [len(m.delivery.body) for m in light] == [len(full[0].delivery.body)] + [0] * (COUNT + 1)


async def test_quarantine_export_streams_each_body_to_the_file(broker: BrokerSettings, tmp_path: Path) -> None:
    """`quarantine export` held every message, body and all, until it wrote the file: 20 bodies of 1 MB at once."""
    await quarantine_big(broker, tmp_path)
    out = tmp_path / "failures.jsonl"
    exported, peak = await peak_of(lambda: export(broker, "work", out))
    assert exported == COUNT
    docs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [d["message_id"] for d in docs] == [f"big-{i}" for i in range(COUNT)]
    assert [len(d["payload"]["pad"]) for d in docs] == [SIZE] * COUNT
    assert base64.b64decode(docs[7]["body_b64"]) == b'{"pad": "' + b"h" * SIZE + b'"}'
    # one message's line is made of its body several times over (the payload parsed, the body's base64,
    # the JSON text): about 8 MB for one of 1 MB, whatever the count; the quarantine's worth was 27 MB
    assert peak < 10 * SIZE, f"{peak:,} bytes held at the peak for {COUNT} bodies of {SIZE:,}"
    _, left = await browse(broker, "work.quarantine", keep_bodies=0)  # the messages stay
    assert len(left) == COUNT


def max_rss(settings: BrokerSettings, *args: str) -> tuple[int, int]:
    """The installed ``amqpjobs ARGS``'s exit code and peak resident memory (bytes); its output counted, never kept."""
    env = dict(os.environ, AMQPJOBS_URL=settings.url, AMQPJOBS_MANAGEMENT_URL=settings.management_url)
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = subprocess.Popen([str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024  # Linux: KiB


async def test_quarantine_show_json_streams_each_message(broker: BrokerSettings, tmp_path: Path) -> None:
    """`quarantine show --json --limit 20` held all 20 messages (and their JSON lines) until it printed the first.

    `show --limit 1` is the baseline: --limit 20 holds no more than a few MB beyond it (one message at a time)."""
    await quarantine_big(broker, tmp_path)
    one, base = await asyncio.to_thread(max_rss, broker, "quarantine", "show", "work", "--json", "--limit", "1")
    shown, peak = await asyncio.to_thread(max_rss, broker, "quarantine", "show", "work", "--json", "--limit", "20")
    assert (one, shown) == (0, 0)
    assert peak - base < 5 * SIZE, f"--limit 20: {peak / 2**20:.1f} MiB max RSS, --limit 1: {base / 2**20:.1f} MiB"
    lines = await asyncio.to_thread(cli_subprocess, broker, "quarantine", "show", "work", "--json", "--limit", "3")
    docs = [json.loads(line) for line in lines.stdout.splitlines()]
    assert [(d["message_id"], len(d["payload"]["pad"])) for d in docs] == [(f"big-{i}", SIZE) for i in range(3)]
