"""A record the results database can't hold never costs the others, and never blames the store on a read."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import (
    ConfigurationError,
    JobContext,
    PostgresResults,
    ResultsStore,
    ResultsUnavailableError,
    SqliteResults,
    StateRecord,
)
from amqpjobs.runtime.results_writer import ResultsWriter
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import fresh_database
from tests.integration.worker_env import make_app, running_worker

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


class LazyMapping(dict[str, int]):
    """A dict subclass whose items can't be had (a lazy mapping whose source is gone): json.dumps raises."""

    def items(self) -> Any:
        raise LookupError("the source of this mapping is gone")

    def keys(self) -> Any:
        raise LookupError("the source of this mapping is gone")


async def test_a_return_value_that_cant_be_encoded_is_not_stored_and_the_job_reads_succeeded(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lone surrogate in a returned string or key, a mapping that raises: "not stored", as any non-JSON value.

    Before (helper-176): UnicodeEncodeError / LookupError out of the record's encoding ("a
    delivery's handler failed"); the job was acked but its record never written, so it read
    "running" (then "unknown" once the lease passed) and result() waited for its timeout.
    """
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")
    values: dict[str, Any] = {"text": "caf\udce9", "key": {"\udcfe": 1}, "mapping": LazyMapping(a=1), "fine": [1]}

    @app.job("give", queue="work")
    async def give(payload: dict[str, Any], ctx: JobContext) -> Any:
        return values[payload["k"]]

    caplog.set_level(logging.INFO, logger="amqpjobs")
    try:
        async with running_worker(app, broker) as (_, rec):
            for k in values:
                await app.enqueue("give", {"k": k}, job_id=f"give-{k}")
            await rec.wait_for(lambda o: len(o) == len(values), timeout=15)
        got = {k: await app.job_status(f"give-{k}") for k in values}
        assert {k: s.state for k, s in got.items()} == dict.fromkeys(values, "succeeded")
        assert got["fine"].value() == [1]
        for k in ("text", "key", "mapping"):
            current = got[k].current
            note = current.value_note if current is not None else ""
            assert note.startswith("not stored: not JSON-serialisable ("), (k, note)
            with pytest.raises(ResultsUnavailableError):
                await app.result(f"give-{k}", timeout=1)
        assert "a delivery's handler failed" not in caplog.text
    finally:
        await app.close()
