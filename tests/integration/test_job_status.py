"""Issue 24: job status and results by id (SQLite and PostgreSQL stores) against the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import (
    App,
    JobContext,
    JobFailedError,
    PostgresResults,
    Reject,
    ResultsStore,
    ResultsUnavailableError,
    SqliteLedger,
    SqliteResults,
    StateRecord,
    Worker,
    WorkerOptions,
)
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.metrics import WorkerMetrics
from amqpjobs.runtime.parking import park
from amqpjobs.runtime.pg_connection import LONGEST_PAUSE
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.whereabouts import where_now
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, fresh_database
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh results database: ``sqlite:<path>`` or a PostgreSQL URL of a database made for the test."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path / 'results.db'}"
        return
    with fresh_database(request.getfixturevalue("pg_url"), "r") as url:
        yield url


def store_for(url: str) -> ResultsStore:
    return SqliteResults(url.removeprefix("sqlite:")) if url.startswith("sqlite:") else PostgresResults(url)


def states(history: Any) -> list[tuple[str, int]]:
    return [(r.state, r.attempt) for r in history]


async def test_states_through_success_retries_quarantine_park_and_replay(
    broker: BrokerSettings, tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
):
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)
    runs: dict[str, int] = {}

    @app.job("double", queue="work")
    async def double(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
        return {"doubled": payload["n"] * 2}

    @app.job("flaky", queue="work")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
        if ctx.attempt < 3:
            raise ValueError(f"not yet ({ctx.attempt})")
        return "third time"

    @app.job("picky", queue="work")
    def picky(payload: dict[str, Any], ctx: JobContext) -> list[int]:  # a plain function: its value too
        runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
        if runs[ctx.job_id] == 1:
            raise Reject("bad input")
        return [1, 2, 3]

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> str:
        return "x" * 70_000

    async with running_worker(app, broker):
        ok = await app.enqueue("double", {"n": 21})
        retried = await app.enqueue("flaky", {})
        rejected = await app.enqueue("picky", {})
        large = await app.enqueue("big", {})
        assert await app.result(ok, timeout=20) == {"doubled": 42}
        assert await app.result(retried, timeout=20) == "third time"
        with pytest.raises(JobFailedError) as failed:
            await app.result(rejected, timeout=20)
        assert (failed.value.state, failed.value.reason) == ("quarantined", "rejected")
        assert "Reject: bad input" in failed.value.error
        with pytest.raises(ResultsUnavailableError, match="70002 bytes of JSON, over the 65536-byte limit"):
            await app.result(large, timeout=20)

        status = await app.job_status(retried)
        assert states(status.history) == [("queued", 0), ("running", 1), ("retrying", 1), ("running", 2),
                                          ("retrying", 2), ("running", 3), ("succeeded", 3)]  # fmt: skip
        assert [r.detail for r in status.history if r.state == "retrying"] == [
            "tier 1 (0.2s), attempt 2", "tier 2 (0.4s), attempt 3"
        ]  # fmt: skip
        assert [r.where for r in status.history][:3] == ["work", "work", "work.retry.200ms"]  # the tier it waited in
        assert "ValueError: not yet (1)" in status.history[2].error
        quarantined = await app.job_status(rejected)
        assert (quarantined.state, quarantined.current and quarantined.current.where) == (
            "quarantined", "work.quarantine"
        )  # fmt: skip

        # an app module for the CLI's --app
        ref = app_module(
            tmp_path,
            store_url,
            monkeypatch,
            "@app.job('picky', queue='work')\ndef picky(payload: dict, ctx: object) -> None: ...\n",
        )
        # amqpjobs quarantine park --app records it; result() names the reason
        parked_out = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes", "--app", ref)
        assert parked_out.exit_code == 0, parked_out.output
        assert "parked 1 message(s)" in parked_out.stdout
        with pytest.raises(JobFailedError) as parked:
            await app.result(rejected, timeout=5)
        assert (parked.value.state, parked.value.reason) == ("parked", "rejected")

        # amqpjobs job show --app: state, history, and where it is now (found by browsing)
        shown = await asyncio.to_thread(cli, broker, "job", "show", rejected, "--app", ref)
        assert shown.exit_code == 0, shown.output
        assert f"job {rejected}: parked" in shown.stdout
        assert "detail: rejected" in shown.stdout
        assert "now: work.parked (found by browsing)" in shown.stdout
        assert shown.stdout.count("running     attempt 1") == 1
        assert "parked      attempt 1  rejected" in shown.stdout  # the attempt that failed, not 0

        # parked by mistake: amqpjobs quarantine unpark --app records it quarantined again; then parked again
        back = await asyncio.to_thread(cli, broker, "quarantine", "unpark", "work", "--yes", "--app", ref)
        assert back.exit_code == 0, back.output
        assert (await app.job_status(rejected)).state == "quarantined"
        shown = await asyncio.to_thread(cli, broker, "job", "show", rejected, "--app", ref)
        assert "now: work.quarantine (found by browsing)" in shown.stdout, shown.stdout
        again = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes", "--app", ref)
        assert again.exit_code == 0, again.output

        # replay from the parked queue: replayed, then it runs and succeeds
        moved = await replay(broker, "work.parked", ReplayOptions(rate=100), results=app.results)
        assert moved.replayed == 1
        assert await app.result(rejected, timeout=20) == [1, 2, 3]
        final = await app.job_status(rejected)
        assert states(final.history) == [
            ("queued", 0), ("running", 1), ("quarantined", 1), ("parked", 1), ("quarantined", 1), ("parked", 1),
            ("replayed", 1), ("running", 1), ("succeeded", 1),
        ]  # fmt: skip
        replay_run = final.history[6].detail
        assert replay_run.startswith("replay run ")
        assert uuid.UUID(replay_run.removeprefix("replay run "))
        with app.sync_publisher() as sync:
            assert (await asyncio.to_thread(sync.job_status, ok)).state == "succeeded"
        shown = await asyncio.to_thread(cli, broker, "job", "show", rejected, "--app", ref)
        assert "now: nowhere: it succeeded and was acked" in shown.stdout
        with pytest.raises(TimeoutError, match="last state: unknown"):
            await app.result("never-enqueued", timeout=0.5)
    await app.close()


class Relay:
    """A TCP relay on loopback we control, between the store and PostgreSQL: close it to cut the database off."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        self._writers.clear()
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def broken_store(store_url: str) -> AsyncIterator[tuple[ResultsStore, Any]]:
    """(the store, break it, mend it): SQLite file moved aside, junk in its place, then moved back (a new file
    there would be another store's: refused); PostgreSQL behind a relay we close."""
    if store_url.startswith("sqlite:"):
        path = Path(store_url.removeprefix("sqlite:"))
        store: ResultsStore = SqliteResults(path)
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]

        def mend_or_break(broken: bool) -> None:
            for extra in files:
                aside = extra.with_name(extra.name + ".aside")
                if broken:
                    if extra.exists():
                        extra.rename(aside)
                else:
                    extra.unlink(missing_ok=True)
                    if aside.exists():
                        aside.rename(extra)
            if broken:
                path.write_bytes(b"not a database " * 512)

        async def breaking(broken: bool) -> None:
            await asyncio.to_thread(mend_or_break, broken)

        yield store, breaking
        return
    base, _, tail = store_url.rpartition("@")
    hostport, _, db = tail.partition("/")
    relay = Relay(int(hostport.rsplit(":", 1)[1]))
    await relay.open()
    store = PostgresResults(f"{base}@127.0.0.1:{relay.port}/{db}")

    async def cut(broken: bool) -> None:
        if broken:
            await relay.close()
        else:
            await relay.open()  # same port

    try:
        yield store, cut
    finally:
        await store.close()
        with contextlib.suppress(Exception):
            await relay.close()


@pytest.mark.chaos
async def test_a_stopped_results_database_never_fails_a_job(broker: BrokerSettings, tmp_path: Path, store_url: str):
    app = await make_app(broker, tmp_path)
    async with broken_store(store_url) as (store, breaking):
        app.results = store
        await store.write([])  # reachable before: the table exists
        await breaking(True)

        @app.job("double", queue="work")
        async def double(payload: dict[str, Any], ctx: JobContext) -> int:
            return int(payload["n"]) * 2

        metrics = WorkerMetrics()
        succeeded: list[str] = []
        worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=10, grace=10),
                        lambda o: succeeded.append(o.job_id) if o.kind == "succeeded" else None, metrics)  # fmt: skip
        await worker.start()
        try:
            ids = [await app.enqueue("double", {"n": n}) for n in range(100)]
            async with asyncio.timeout(60):
                while len(succeeded) < 100:
                    await asyncio.sleep(0.05)
        finally:
            await worker.shutdown()
            await app.close()  # the publishing connection, before this test's event loop closes
        assert sorted(succeeded) == sorted(ids)
        failures = metrics.registry.get_sample_value("amqpjobs_results_write_failures_total")
        assert failures is not None
        assert failures >= 100
        with pytest.raises(ResultsUnavailableError):  # down: a clear error, never a guess
            await app.job_status(ids[0])
        await breaking(False)
        if not store_url.startswith("sqlite:"):  # tries to reconnect are paced: the next within this many s
            await asyncio.sleep(LONGEST_PAUSE)
        answers = {(await app.job_status(i)).state for i in ids}
        assert answers == {"unknown"}
        assert "no record" in (await app.job_status(ids[0])).note


async def test_a_running_state_past_its_lease_reads_unknown_never_a_stale_running(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    @app.job("slow", queue="work", timeout=0.5, lease=1)
    def slow(payload: dict[str, Any], ctx: JobContext) -> str:  # a thread: it outlives its timeout and lease
        loop.call_soon_threadsafe(started.set)
        time.sleep(2.5)
        return "late"

    async with running_worker(app, broker):
        job_id = await app.enqueue("slow", {})
        await asyncio.wait_for(started.wait(), 10)
        status = await wait_state(app, job_id, "running")  # written in the background: not a fixed 0.3 s after
        assert status.current is not None
        assert 0.9 < status.current.lease_until - status.current.at < 1.1  # the job's lease (1 s)
        # the lease is counted from the record's own time: just past it (not a fixed 1.0 s after the look above)
        await asyncio.sleep(max(0.0, status.current.lease_until - time.time()) + 0.1)
        late = await app.job_status(job_id)
        assert (late.state, late.note) == ("unknown", "running, but its worker's lease passed")
        assert await app.result(job_id, timeout=10) == "late"
    await app.close()


def app_module(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, jobs: str = "") -> str:
    """An app module (``MODULE:APP`` for ``--app``) on the applied topology with a results store at ``store_url``."""
    module = f"resapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    (tmp_path / f"{module}.py").write_text(
        "from amqpjobs import App, PostgresResults, SqliteResults\n"
        f"url = {store_url!r}\n"
        f"app = App('resapp', topology={str(tmp_path / 't.toml')!r}, results=SqliteResults(url[7:]) "
        "if url.startswith('sqlite:') else PostgresResults(url))\n" + jobs
    )
    monkeypatch.chdir(tmp_path)
    return f"{module}:app"


async def wait_state(app: Any, job_id: str, state: str, limit: float = 10.0) -> Any:
    """The job's status once it reads ``state`` (the writer is in the background), or fail after ``limit`` s."""
    deadline = time.monotonic() + limit
    while (status := await app.job_status(job_id)).state != state:
        assert time.monotonic() < deadline, f"{job_id}: still {status.state}, not {state}"
        await asyncio.sleep(0.05)
    return status


async def test_a_job_waiting_in_its_work_queue_reads_queued_and_a_none_result_shows_null(
    broker: BrokerSettings, tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
):
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)
    ref = app_module(tmp_path, store_url, monkeypatch)

    @app.job("nothing", queue="work")
    async def nothing(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    waiting = await app.enqueue("nothing", {})  # no worker yet: it waits in the work queue
    status = await wait_state(app, waiting, "queued")
    assert status.current is not None
    assert (status.current.attempt, status.current.where, status.current.job) == (0, "work", "nothing")
    with app.sync_publisher() as sync:
        from_sync = await asyncio.to_thread(sync.enqueue, "nothing", {})
        assert (await wait_state(app, from_sync, "queued")).current is not None
    shown = await asyncio.to_thread(cli, broker, "job", "show", waiting, "--app", ref)
    assert shown.exit_code == 0, shown.output
    assert f"job {waiting}: queued" in shown.stdout
    assert "now: work queue work (waiting;" in shown.stdout

    async with running_worker(app, broker):
        assert await app.result(waiting, timeout=20) is None
        assert await app.result(from_sync, timeout=20) is None
    assert states((await app.job_status(waiting)).history) == [("queued", 0), ("running", 1), ("succeeded", 1)]
    shown = await asyncio.to_thread(cli, broker, "job", "show", waiting, "--app", ref)
    assert "result: null (the handler returned None)" in shown.stdout
    await app.close()


async def test_job_status_right_after_enqueue_reads_queued_the_apps_own_record_written_first(
    broker: BrokerSettings, tmp_path: Path, store_url: str
):
    """helper-229: the README's own example (enqueue, then job_status) read ``unknown``, "never enqueued"."""
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)

    @app.job("nothing", queue="work")
    async def nothing(payload: dict[str, Any], ctx: JobContext) -> None: ...

    for n in range(5):  # no wait between the two calls
        job_id = await app.enqueue("nothing", {}, job_id=f"ryw-{n}")
        status = await app.job_status(job_id)
        assert (status.state, status.current.where if status.current else None) == ("queued", "work"), status.note
    with app.sync_publisher() as sync:
        for n in range(3):
            job_id = await asyncio.to_thread(sync.enqueue, "nothing", {}, job_id=f"ryw-sync-{n}")
            assert (await asyncio.to_thread(sync.job_status, job_id)).state == "queued"
    await app.close()


async def test_queued_records_a_store_does_not_take_are_counted_and_never_fail_an_enqueue(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    path = tmp_path / "results.db"
    app.results = SqliteResults(path)
    path.write_bytes(b"not a database " * 512)  # unusable from now on
    failed: list[int] = []
    app.results_failed = failed.append

    @app.job("nothing", queue="work")
    async def nothing(payload: dict[str, Any], ctx: JobContext) -> None: ...

    ids = [await app.enqueue("nothing", {}) for _ in range(5)]
    assert len(set(ids)) == 5
    await app.close()  # writes (tries to) what is queued
    assert sum(failed) == 5


async def test_job_show_without_a_record_browses_every_quarantine_and_parked_queue(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    app = await make_app(broker, tmp_path)  # no results store: nothing recorded

    @app.job("picky", queue="work")
    async def picky(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("bad input")

    async with running_worker(app, broker) as (_, recorder):
        rejected = await app.enqueue("picky", {})
        await recorder.wait_for(lambda outcomes: len(outcomes) == 1)
    await app.close()
    await SqliteResults(tmp_path / "empty.db").close()  # the store its workers would write (a missing file is refused)
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'empty.db'}", monkeypatch)
    shown = await asyncio.to_thread(cli, broker, "job", "show", rejected, "--app", ref)
    assert shown.exit_code == 0, shown.output
    assert f"job {rejected}: unknown" in shown.stdout
    assert "now: work.quarantine (found by browsing; no record to go by)" in shown.stdout
    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
    assert parked.exit_code == 0, parked.output
    shown = await asyncio.to_thread(cli, broker, "job", "show", rejected, "--app", ref)
    assert "now: work.parked (found by browsing; no record to go by)" in shown.stdout
    assert shown.exit_code == 0, shown.output
    shown = await asyncio.to_thread(cli, broker, "job", "show", "nowhere-id", "--app", ref)
    assert "not in any quarantine or parked queue of the app (1 job queue(s) browsed)" in shown.stdout
    assert shown.exit_code == 1, shown.output  # found nowhere: a script can tell (before: 0, as if found)
    shown = await asyncio.to_thread(cli, broker, "job", "show", "nowhere-id", "--app", ref, "--json")
    assert (shown.exit_code, json.loads(shown.stdout)["state"]) == (1, "unknown"), shown.output
    for empty in ("", "  "):  # enqueue's job-id rule: exit 2 before anything is read
        refused = await asyncio.to_thread(cli, broker, "job", "show", empty, "--app", ref)
        assert refused.exit_code == 2, refused.output
        assert "job_id is empty" in refused.output


async def test_a_running_record_whose_lease_passed_says_where_it_was_started_not_held(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = SqliteResults(tmp_path / "r.db")
    at = time.time() - 30
    await store.write([StateRecord("lost-1", "slow", "running", 2, at, where="work", lease_until=at + 2)])
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'r.db'}", monkeypatch)
    shown = await asyncio.to_thread(cli, broker, "job", "show", "lost-1", "--app", ref)
    assert shown.exit_code == 0, shown.output
    assert "job lost-1: unknown (running, but its worker's lease passed)" in shown.stdout
    assert (
        f"now: last started by a worker at {iso_utc(at)} from work queue work; may be back in its queue "
        "after a worker loss" in shown.stdout
    )
    assert "held by a worker" not in shown.stdout


async def test_a_job_acked_as_a_duplicate_reads_duplicate_and_its_result_ends(broker: BrokerSettings, tmp_path: Path):
    """A retry (or replay) of a job already done is acked without running. Its state was the last record's, for
    ever: ``retrying`` with "now: delay tier ...", or ``replayed`` "waiting", and ``result()`` never ended (a
    retest). Now it records ``duplicate``, terminal: ``result()`` returns None; a job that succeeded before keeps
    reading ``succeeded`` (its value)."""
    base = await make_app(broker, tmp_path)
    app = App("dup", topology=base.topology(), url=broker.url, ledger=SqliteLedger(str(tmp_path / "ledger.db")),
              results=SqliteResults(tmp_path / "results.db"))  # fmt: skip
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        db.execute("CREATE TABLE effects (job_id TEXT)")
        db.commit()

    @app.job("charge", queue="work", idempotent=True)
    def charge(payload: dict[str, Any], ctx: JobContext) -> str:
        if payload.get("reject"):
            raise Reject("refused before its effect")
        with ctx.transaction() as db:
            db.execute("INSERT INTO effects VALUES (?)", (ctx.job_id,))
        if payload["raise_after"]:  # the effect and its done-mark are committed: the job counts as done
            raise ValueError("after the block")
        return "charged"

    await app.enqueue("charge", {"raise_after": True}, job_id="c-raised")
    await app.enqueue("charge", {"raise_after": False}, job_id="c-ok")
    await app.enqueue("charge", {"raise_after": False}, job_id="c-ok")  # the same job again: a duplicate
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: sum(x.kind == "duplicate" for x in o) == 2, 20)
    raised = await app.job_status("c-raised")
    assert states(raised.history) == [("queued", 0), ("running", 1), ("retrying", 1), ("duplicate", 2)]
    assert (raised.state, raised.terminal, raised.current and raised.current.detail) == (
        "duplicate", True, "already done: acked without running")  # fmt: skip
    assert await app.result("c-raised", timeout=2) is None
    assert await where_now(broker, app, raised) == (
        "nowhere: it was already done (its effect committed by an earlier run) and was acked without running"
    )
    # an older copy, quarantined before the job succeeded, replayed after it: acked as a duplicate, and the job
    # reads succeeded again (a retest: "replayed", waiting, for ever)
    await app.enqueue("charge", {"raise_after": False, "reject": True}, job_id="c-late")
    await app.enqueue("charge", {"raise_after": False}, job_id="c-late")
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) == 2, 20)
        # as `replay --app` calls it: the app's idempotent jobs named (a stale copy of another job would stay)
        options = ReplayOptions(rate=100, idempotent=frozenset({"charge"}))
        moved = await replay(broker, "work.quarantine", options, results=app.results)
        assert moved.replayed == 1
        await recorder.wait_for(lambda o: len(o) == 3, 20)
    assert [o.kind for o in recorder.outcomes] == ["quarantined", "succeeded", "duplicate"]
    late = await app.job_status("c-late")
    assert [s for s, _ in states(late.history)][-2:] == ["replayed", "duplicate"]
    assert await where_now(broker, app, late) == "nowhere: it succeeded and was acked"  # its older copy: replayed
    assert (late.state, await app.result("c-late", timeout=2)) == ("succeeded", "charged")
    ok = await app.job_status("c-ok")
    assert [s for s, _ in states(ok.history)] == ["queued", "queued", "running", "succeeded", "duplicate"]
    assert (ok.state, await app.result("c-ok", timeout=2)) == ("succeeded", "charged")
    await app.close()


async def quarantined_then_succeeded(app: App, broker: BrokerSettings) -> None:
    """Job ``mail`` of ``app`` (queue ``work``): id ``m-1`` rejected into quarantine, then enqueued again and
    succeeded (``"sent"``); the older copy stays in ``work.quarantine``."""

    @app.job("mail", queue="work")
    def mail(payload: dict[str, Any], ctx: JobContext) -> str:
        if payload["reject"]:
            raise Reject("no address")
        return "sent"

    await app.enqueue("mail", {"reject": True}, job_id="m-1")
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) == 1, 20)
        await app.enqueue("mail", {"reject": False}, job_id="m-1")
        await recorder.wait_for(lambda o: len(o) == 2, 20)
    assert [o.kind for o in recorder.outcomes] == ["quarantined", "succeeded"]


async def test_an_older_copy_parked_after_the_job_succeeded_leaves_it_succeeded(
    broker: BrokerSettings, tmp_path: Path, store_url: str
):
    """The same id enqueued again after its first copy was quarantined, and that copy parked once the second
    succeeded: the job reads ``succeeded`` with its value (a retest: ``parked``, and ``result()`` raised
    ``JobFailedError``); ``job show`` says where the older copy is, and it is there."""
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)

    await quarantined_then_succeeded(app, broker)
    waiting = await app.job_status("m-1")  # the older copy still in quarantine: job show names it (helper-172)
    assert waiting.state == "succeeded"
    assert await where_now(broker, app, waiting) == (
        "nowhere: it succeeded and was acked; an older copy, quarantined before the success, is in "
        "work.quarantine (found by browsing)"
    )
    moved = await park(broker, "work.quarantine", results=app.results)
    assert moved.taken == 1
    status = await app.job_status("m-1")
    assert [s for s, _ in states(status.history)] == ["queued", "running", "quarantined", "queued", "running",
                                                      "succeeded", "parked"]  # fmt: skip
    assert (status.state, status.note) == ("succeeded", "an older copy, quarantined before the success, was parked "
                                                        "in work.parked")  # fmt: skip
    assert await app.result("m-1", timeout=2) == "sent"
    assert await where_now(broker, app, status) == (
        "nowhere: it succeeded and was acked; an older copy, quarantined before the success, is in work.parked "
        "(found by browsing)"
    )
    await app.close()
