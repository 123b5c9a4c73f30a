"""A record the results database can't hold never costs the others, and never blames the store on a read."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpjobs import ConfigurationError, PostgresResults, ResultsStore, SqliteResults, StateRecord
from amqpjobs.runtime.results import ResultsWriter
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import fresh_database
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ResultsStore]:
    if request.param == "sqlite":
        yield SqliteResults(tmp_path / "results.db")
        return
    with fresh_database(request.getfixturevalue("pg_url"), "rr") as url:
        yield PostgresResults(url)


async def test_a_record_the_database_refuses_never_costs_the_others_and_states_stay_right(
    broker: BrokerSettings, tmp_path: Path, store: ResultsStore, caplog: pytest.LogCaptureFixture
):
    app = await make_app(broker, tmp_path)
    app.results = store
    t = time.time()
    writer = ResultsWriter(store)
    writer.start()
    for record in [
        StateRecord("ok-1", "double", "queued", 0, t, where="work"),
        StateRecord("nul-error", "flaky", "running", 3, t, where="work", lease_until=t + 60),
        StateRecord("nul-error", "flaky", "quarantined", 3, t + 0.1, detail="exhausted",
                    error="ValueError: a\x00b", where="work.quarantine"),  # PostgreSQL text can't hold NUL
        StateRecord("x\x00y", "double", "succeeded", 1, t, value="2", where="work"),  # nor a job id with one
        StateRecord("surrogate", "flaky", "running", 1, t, where="work", lease_until=t + 60),
        StateRecord("surrogate", "flaky", "quarantined", 1, t + 0.1, detail="permanent",
                    error="ValueError: \ud800", where="work.quarantine"),  # neither store takes a lone surrogate
        StateRecord("ok-2", "double", "succeeded", 1, t, value="4", where="work"),
    ]:  # fmt: skip
        writer.note(record)
    with caplog.at_level(logging.WARNING, "amqpjobs.results"):
        await writer.close()
    assert writer.failed == 0, caplog.text
    try:
        assert (await app.job_status("ok-1")).state == "queued"
        assert (await app.job_status("ok-2")).state == "succeeded"
        nul = await app.job_status("nul-error")
        assert (nul.state, nul.current.error if nul.current else None) == ("quarantined", "ValueError: a\x00b")
        found = await app.job_status("x\x00y")
        assert (found.state, found.value()) == ("succeeded", 2)
        odd = await app.job_status("surrogate")  # kept, its error text escaped: the state is what counts
        assert (odd.state, odd.current.error if odd.current else None) == ("quarantined", "ValueError: \\ud800")
    finally:
        await app.close()
        await store.close()


async def test_job_status_refuses_an_id_no_job_can_have(broker: BrokerSettings, tmp_path: Path, store: ResultsStore):
    app = await make_app(broker, tmp_path)
    app.results = store
    try:
        for job_id in ("", "   "):
            with pytest.raises(ConfigurationError, match="job_id is empty"):
                await app.job_status(job_id)
            with pytest.raises(ConfigurationError, match="job_id is empty"):
                await app.result(job_id, timeout=1)
        with pytest.raises(ConfigurationError, match="job_id must be 1-255 UTF-8 bytes"):
            await app.job_status("x" * 256)
        assert (await app.job_status("never-enqueued\x00")).state == "unknown"  # looked up, not blamed on the store
    finally:
        await app.close()
        await store.close()
