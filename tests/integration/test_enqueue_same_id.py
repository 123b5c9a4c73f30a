"""Enqueues of one job id in flight at once each get their own answer (review 26, MEDIUM).

aiormq matches a ``basic.return`` to its publish by the returned message's ``message_id``
(the job id), one delivery tag per id: with the same id in flight twice, a return failed
whichever publish registered the id last, and the returned one was confirmed as if stored
(48 of 50 unroutable enqueues "succeeded"). A publish now waits for the publish of its
job id already in flight on the channel (wire/publish.py), on both publish paths.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire import publish as wire_publish
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

APPLIED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
"""
#: Known to the app, never applied: exchange ``jobs`` has no binding for its routing key.
UNBOUND = """
[[job_queue]]
name = "nowhere"
exchange = "jobs"
"""


async def make(broker: BrokerSettings, tmp_path: Path) -> App:
    (tmp_path / "applied.toml").write_text(APPLIED)
    await apply_topology(tmp_path / "applied.toml", broker)
    (tmp_path / "app.toml").write_text(APPLIED + UNBOUND)
    app = App("same-id", topology=load_topology(tmp_path / "app.toml").topology, url=broker.url)
    app.job("good", queue="work")(lambda p, c: None)
    app.job("lost", queue="nowhere")(lambda p, c: None)
    return app


@pytest.fixture(params=["one step", "aiormq's basic_publish"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param != "one step":
        monkeypatch.setattr(wire_publish, "queue_publish", lambda *args: None)
    return str(request.param)


def outcomes(jobs: list[str], results: list[Any]) -> Counter[tuple[str, str]]:
    return Counter(
        (job, "id" if isinstance(r, str) else type(r).__name__) for job, r in zip(jobs, results, strict=True)
    )


async def test_every_unroutable_enqueue_of_one_job_id_is_refused(broker: BrokerSettings, tmp_path: Path, path: str):
    app = await make(broker, tmp_path)
    try:
        results = await asyncio.gather(*(app.enqueue("lost", {"i": i}, job_id="dup") for i in range(40)),
                                       return_exceptions=True)  # fmt: skip
    finally:
        await app.close()
    assert outcomes(["lost"] * 40, results) == {("lost", "UnroutableError"): 40}, path
    assert all("no queue is bound to exchange 'jobs' with routing key 'nowhere'" in str(r) for r in results)


async def test_routable_and_unroutable_enqueues_of_one_job_id_each_get_their_own_answer(
    broker: BrokerSettings, tmp_path: Path, path: str
):
    app = await make(broker, tmp_path)
    jobs = ["good", "lost"] * 25
    try:
        results = await asyncio.gather(*(app.enqueue(job, {"i": i}, job_id="mix") for i, job in enumerate(jobs)),
                                       return_exceptions=True)  # fmt: skip
        again = await app.enqueue("good", {"i": 50}, job_id="mix")  # the channel goes on
    finally:
        await app.close()
    assert outcomes(jobs, results) == {("good", "id"): 25, ("lost", "UnroutableError"): 25}, path
    assert again == "mix"
    stored = await drain(broker, "work")
    assert sorted(m.body for m in stored) == sorted(f'{{"i":{i}}}'.encode() for i in [*range(0, 50, 2), 50])


async def test_a_return_is_not_taken_for_another_job_ids_publish(broker: BrokerSettings, tmp_path: Path, path: str):
    app = await make(broker, tmp_path)
    jobs = ["good", "lost"] * 20
    try:
        results = await asyncio.gather(*(app.enqueue(job, {"i": i}, job_id=f"j-{i}") for i, job in enumerate(jobs)),
                                       return_exceptions=True)  # fmt: skip
    finally:
        await app.close()
    assert outcomes(jobs, results) == {("good", "id"): 20, ("lost", "UnroutableError"): 20}, path
    assert sorted(str(m.message_id) for m in await drain(broker, "work")) == sorted(f"j-{i}" for i in range(0, 40, 2))
