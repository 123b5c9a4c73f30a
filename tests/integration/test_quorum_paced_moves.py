"""Paced moves (``--rate``, :class:`amqpjobs.jobs.pacing.Pace`) out of a quorum job queue's quarantine and parked queue.

A quorum job queue's quarantine and parked queues are quorum queues too. ``quarantine park``, ``unpark`` and
``replay`` with a filter and ``--rate``, stopped (SIGSTOP) for 3 s mid-run and continued: each keeps its rate
after the stall (the time lost is not made up), moves exactly the matching messages and loses none.
Measured on 3.10.8 at 50/s (400 of 500 matching): 49-56 a second after SIGCONT, 400 moved, 100 left, for each.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs.pacing import CATCH_UP
from amqpjobs.jobs.replay_plan import replay_window
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, cli_subprocess, depth, raw_channel, stalled_stretch
from tests.integration.test_quarantine import cli_env, evidence_for

pytestmark = pytest.mark.broker
QUORUM = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\ntype = "quorum"\n'
MATCHING, OTHERS, RATE = 400, 100, 100


async def _quorum_quarantine(broker: BrokerSettings, tmp_path: Path) -> None:
    """The quorum job queue ``work`` applied; its quarantine holds MATCHING jobs ``mail`` and OTHERS ``other``."""
    path = tmp_path / "quorum.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("work.quarantine")
        for i in range(MATCHING + OTHERS):
            job = "other" if i % 5 == 0 else "mail"
            message = aio_pika.Message(json.dumps({"n": i}).encode(), content_type="application/json",
                                       message_id=f"q-{i}", type=job, headers=evidence_for(i, job=job))  # fmt: skip
            await exchange.publish(message, routing_key="work")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "source", "target"),
    [
        (["quarantine", "park", "work.quarantine", "--yes"], "work.quarantine", "work.parked"),
        (["quarantine", "unpark", "work.parked", "--yes"], "work.parked", "work.quarantine"),
        (["replay", "work.quarantine"], "work.quarantine", "work"),
    ],
    ids=["park", "unpark", "replay"],
)
async def test_a_paced_filtered_move_on_a_quorum_queue_keeps_its_rate_after_a_stop_and_loses_nothing(
    broker: BrokerSettings, tmp_path: Path, command: list[str], source: str, target: str
):
    await _quorum_quarantine(broker, tmp_path)
    if source == "work.parked":  # everything parked first, unpaced
        assert (
            await asyncio.to_thread(cli_subprocess, broker, "quarantine", "park", "work.quarantine", "--yes")
        ).returncode == 0
    assert await depth(broker, source) == MATCHING + OTHERS
    exe = Path(sys.executable).with_name("amqpjobs")
    proc = await asyncio.to_thread(
        subprocess.Popen, [str(exe), *command, "--job", "mail", "--rate", str(RATE)],
        env=cli_env(broker), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        before, after, elapsed = await stalled_stretch(broker, proc, target, RATE // 2)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
    # as test_quarantine's classic case: at most RATE a second after the stall, plus CATCH_UP s of moves, the one at
    # the stretch's start and what was in flight at the stop; made up, the 3 s owed (300) would go at once
    assert 0 < after - before <= RATE * (elapsed + CATCH_UP) + 1 + replay_window(RATE), (before, after, elapsed)
    assert proc.returncode == 0, out
    assert (await depth(broker, source), await depth(broker, target)) == (OTHERS, MATCHING), (
        out
    )  # none lost, none twice
