"""``quarantine purge --rate``: a filtered purge paced as park, unpark and replay (:class:`~amqpjobs.jobs.pacing.Pace`).

Before, purge had no ``--rate`` (exit 2, "No such option '--rate'"): a filtered purge deleted as fast as the acks
went, 300-560 a second on 3.10, with no way to spare a loaded broker. Measured on 3.10.8 at 100/s (400 of 500
matching): 400 deleted in about 4 s, 100 left; stopped for 3 s and continued, at most the rate after.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs.pacing import CATCH_UP
from amqpjobs.jobs.replay_plan import replay_window
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, cli_subprocess, depth, raw_channel, wait_until_async
from tests.integration.test_quarantine import cli_env, evidence_for

pytestmark = pytest.mark.broker
CLASSIC = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n'
MATCHING, OTHERS, RATE = 400, 100, 100


async def _quarantine(broker: BrokerSettings, tmp_path: Path) -> None:
    """Job queue ``work`` applied; its quarantine holds MATCHING jobs ``mail``, then OTHERS ``other``.

    The others last: a browse holds each message it keeps, so the queue's ready count measures the deletes' pace
    only while it meets none of them."""
    path = tmp_path / "classic.toml"
    path.write_text(CLASSIC)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("work.quarantine")
        for i in range(MATCHING + OTHERS):
            job = "other" if i >= MATCHING else "mail"
            message = aio_pika.Message(json.dumps({"n": i}).encode(), content_type="application/json",
                                       message_id=f"q-{i}", type=job, headers=evidence_for(i, job=job))  # fmt: skip
            await exchange.publish(message, routing_key="work")


async def _left_at_most(broker: BrokerSettings, count: int) -> bool:
    return await depth(broker, "work.quarantine") <= count


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_filtered_purge_keeps_its_rate_after_a_stop_and_deletes_only_the_matching(
    broker: BrokerSettings, tmp_path: Path
):
    await _quarantine(broker, tmp_path)
    exe = Path(sys.executable).with_name("amqpjobs")
    command = [str(exe), "quarantine", "purge", "work.quarantine", "--job", "mail", "--yes", "--rate", str(RATE)]
    started = time.monotonic()
    proc = await asyncio.to_thread(
        subprocess.Popen, command, env=cli_env(broker), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        total = MATCHING + OTHERS
        await wait_until_async(lambda: _left_at_most(broker, total - RATE // 2), 30, "some purged")
        proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(3)  # 3 s worth of deletes lost
        before = await depth(broker, "work.quarantine")
        resumed = time.monotonic()
        proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(1)
        after, elapsed = await depth(broker, "work.quarantine"), time.monotonic() - resumed
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
    took = time.monotonic() - started
    # at most RATE a second after the stall (plus CATCH_UP s of deletes, the one at the stretch's start and what was
    # in flight at the stop); made up, the 3 s owed (300) would go at once, and unpaced all 400 go within 1.5 s
    assert 0 < before - after <= RATE * (elapsed + CATCH_UP) + 1 + replay_window(RATE), (before, after, elapsed)
    assert proc.returncode == 0, out
    assert f"purged {MATCHING} message(s) from work.quarantine; {OTHERS} left" in out, out
    assert await depth(broker, "work.quarantine") == OTHERS
    assert took >= 3 + (MATCHING - 2 * RATE * CATCH_UP) / RATE, took  # 3 s stopped, 400 at 100/s


@pytest.mark.timeout(60)
async def test_purge_takes_the_rate_option_of_park_and_unpark_word_for_word(broker: BrokerSettings, tmp_path: Path):
    """The same option, help text and bounds: ``--rate 0`` is refused as park refuses it (exit 2), nothing deleted."""
    import amqpjobs.cli.parking  # noqa: F401 (registers park and unpark)
    from amqpjobs.cli.quarantine import quarantine

    options = {verb: next(p for p in quarantine.commands[verb].params if p.name == "rate")
               for verb in ("purge", "park", "unpark")}  # fmt: skip
    assert len({(o.opts[0], o.help, o.default, repr(o.type)) for o in options.values()}) == 1, options
    await _quarantine(broker, tmp_path)
    refused = [await asyncio.to_thread(cli_subprocess, broker, "quarantine", verb, "work.quarantine", "--yes",
                                       "--job", "mail", "--rate", "0") for verb in ("purge", "park")]  # fmt: skip
    assert [r.returncode for r in refused] == [2, 2], [r.stdout + r.stderr for r in refused]
    assert refused[0].stderr == refused[1].stderr, [r.stderr for r in refused]
    assert await depth(broker, "work.quarantine") == MATCHING + OTHERS
