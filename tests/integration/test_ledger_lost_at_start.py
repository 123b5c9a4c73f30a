"""A SQLite ledger file missing when a worker starts, after a ledger was in use (README "Idempotency").

Deleted, at another path after a deploy, or a new container without its volume: before,
the worker created an empty ledger and ran again every redelivered or replayed job it had
marked done. The broker holds a marker for the app's ledger (queue ``amqpjobs.ledger.<app>``,
declared by the first worker that starts on a new ledger); a worker that finds its ledger
new while the marker exists refuses to start, unless told to begin a new ledger
(``WorkerOptions(new_ledger=True)``, ``consume --new-ledger``).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError, JobContext
from amqpjobs.runtime.ledger import Ledger, SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth, fresh_database, wait_until
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]

MARKER = "amqpjobs.ledger.idem"


def ledger_app(base: App, broker: BrokerSettings, path: Path | Ledger, runs: list[str]) -> App:
    ledger = path if not isinstance(path, Path) else SqliteLedger(path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=ledger)

    @app.job("charge", queue="work", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    return app


def remove(path: Path) -> None:
    """``rm ledger.db*``: the file and its -wal and -shm files."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)


async def test_a_worker_refuses_to_start_on_a_new_ledger_once_the_app_had_one(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    runs: list[str] = []
    app = ledger_app(base, broker, path, runs)
    async with running_worker(app, broker):  # the first start: a new ledger, no step needed
        await app.enqueue("charge", {}, job_id="charge:1")
        await wait_until(lambda: runs == ["charge:1"], 20, "the first run")
    await app.close()
    # the file is lost (a deploy pointing at another path, a container without its volume)
    remove(path)
    runs.clear()
    again = ledger_app(base, broker, path, runs)  # the app's module, imported by the new worker
    await again.enqueue("charge", {}, job_id="charge:1")  # a redelivery or replay of the done job
    worker = Worker(again, broker, WorkerOptions(queues=("work",), grace=10), Recorder())
    try:
        with pytest.raises(ConfigurationError) as refused:
            await worker.start()
    finally:
        await asyncio.sleep(0.5)  # (before: the worker ran the done job again meanwhile)
        await worker.shutdown()
        assert runs == [], "the done job ran again on an empty ledger"
    said = str(refused.value)
    assert f"the SQLite ledger at {path} is new" in said, said
    assert "app 'idem' had a ledger before" in said, said
    assert MARKER in said, said
    assert "--new-ledger" in said, said
    assert f"created a new SQLite ledger at {path}" in caplog.text
    assert await depth(broker, MARKER) == 0  # the marker exists (depth of a missing queue raises)
    assert await depth(broker, "work") == 1  # still there, for the ledger once it is back
    # knowingly: begin a new ledger (the job runs once more, as the operator was told)
    worker = Worker(again, broker, WorkerOptions(queues=("work",), grace=10, new_ledger=True), Recorder())
    await worker.start()
    try:
        await wait_until(lambda: runs == ["charge:1"], 20, "the run on the new ledger")
    finally:
        await worker.shutdown()
    await again.close()
    # from then on the new ledger is the app's: an ordinary start, no option
    last = ledger_app(base, broker, path, runs)
    async with running_worker(last, broker):
        pass
    await last.close()


async def test_consume_refuses_a_lost_ledger_file_and_new_ledger_starts_one(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """The command a deploy runs: exit 2 with the words, then ``--new-ledger``."""
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    first = ledger_app(base, broker, path, [])
    async with running_worker(first, broker):
        pass
    await first.close()
    remove(path)
    module = tmp_path / "lostledger.py"
    module.write_text(
        "from amqpjobs import App, SqliteLedger\n"
        "from amqpjobs.topology.loader import load_topology\n"
        f"app = App('idem', topology=load_topology({str(tmp_path / 'app.toml')!r}).topology,"
        f" ledger=SqliteLedger({str(path)!r}))\n"
        "@app.job('charge', queue='work', idempotent=True, lease=60)\n"
        "def charge(payload, ctx):\n    pass\n"
    )
    env = {"AMQPJOBS_URL": broker.url, "PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    command = [str(Path(sys.executable).with_name("amqpjobs")), "consume", "lostledger:app", "--queues", "work"]
    done = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "is new" in done.stderr, done.stderr
    assert "--new-ledger" in done.stderr, done.stderr
    proc = await asyncio.create_subprocess_exec(*command, "--new-ledger", env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while line := (await asyncio.wait_for(proc.stdout.readline(), 30)).decode():
            lines.append(line)
            if "created a new" in line or "began a new" in line or "worker consum" in line:
                break
    finally:
        proc.terminate()
        await proc.wait()
    assert any(f"began a new SQLite ledger at {path}" in line for line in lines), lines


async def test_a_postgres_ledger_in_another_database_after_a_deploy_is_refused(
    broker: BrokerSettings, tmp_path: Path, pg_url: str
) -> None:
    """The app's DSN now names a database without the ledger's table: the table made at open is new."""
    base = await make_app(broker, tmp_path)
    runs: list[str] = []
    with fresh_database(pg_url) as first:
        app = ledger_app(base, broker, PostgresLedger(first), runs)
        async with running_worker(app, broker):
            await app.enqueue("charge", {}, job_id="charge:1")
            await wait_until(lambda: runs == ["charge:1"], 20, "the first run")
        await app.close()
        same = ledger_app(base, broker, PostgresLedger(first), runs)
        async with running_worker(same, broker):
            pass  # the same database again: an ordinary start
        await same.close()
    with fresh_database(pg_url) as other:
        again = ledger_app(base, broker, PostgresLedger(other), runs)
        await again.enqueue("charge", {}, job_id="charge:1")
        worker = Worker(again, broker, WorkerOptions(queues=("work",), grace=10), Recorder())
        try:
            with pytest.raises(ConfigurationError, match=r"the PostgreSQL ledger \(database .*\) is new"):
                await worker.start()
        finally:
            await asyncio.sleep(0.5)
            await worker.shutdown()
            await again.close()
        assert runs == ["charge:1"], "the done job ran again on an empty ledger"


async def test_new_ledger_left_in_the_command_says_to_take_it_out(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--new-ledger`` kept in a unit file or a container's args would begin the next lost ledger anew, unrefused.

    The start that begins the new ledger says to take the option out; a start with the option
    on the app's own ledger (nothing to begin) says the same, naming the ledger.
    """
    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    runs: list[str] = []
    first = ledger_app(base, broker, path, runs)
    async with running_worker(first, broker):  # the app's first ledger
        pass
    await first.close()
    remove(path)
    caplog.clear()
    again = ledger_app(base, broker, path, runs)
    worker = Worker(again, broker, WorkerOptions(queues=("work",), grace=10, new_ledger=True), Recorder())
    await worker.start()
    await worker.shutdown()
    await again.close()
    began = [r.getMessage() for r in caplog.records if "began a new SQLite ledger" in r.getMessage()]
    assert len(began) == 1, caplog.text
    assert "take --new-ledger out of the worker's command now" in began[0], began[0]
    caplog.clear()
    kept = ledger_app(base, broker, path, runs)  # the option left in: the ledger is the app's now
    worker = Worker(kept, broker, WorkerOptions(queues=("work",), grace=10, new_ledger=True), Recorder())
    await worker.start()
    await worker.shutdown()
    await kept.close()
    said = [r for r in caplog.records if "--new-ledger" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"], caplog.text
    assert said[0].getMessage() == (
        f"--new-ledger had nothing to begin here: the SQLite ledger at {path} is app idem's own ledger already "
        "(since an earlier start, or begun by another process of this one under --processes). Take "
        "--new-ledger out of the worker's command: while it stays, a ledger lost later is begun anew instead "
        "of refused, and the jobs it had marked done may run again"
    )


async def test_a_ledger_made_before_the_marker_rule_is_established(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger file with done-marks and no origin table (an older amqpjobs): no refusal, the marker is declared."""
    import sqlite3

    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE amqpjobs_ledger (key TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT NOT NULL, "
                   "expires_at REAL NOT NULL, updated_at REAL NOT NULL)")  # fmt: skip
        now = time.time()  # (a done-mark older than the retention would be pruned at the start)
        db.execute("INSERT INTO amqpjobs_ledger VALUES ('charge:1', 'done', 'w', ?, ?)", (now, now))
    db.close()
    runs: list[str] = []
    app = ledger_app(base, broker, path, runs)
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("charge", {}, job_id="charge:1")
        await wait_until(lambda: any(o.kind == "duplicate" for o in rec.outcomes), 20, "the duplicate")
    await app.close()
    assert runs == []
    assert "created a new" not in caplog.text
    assert await depth(broker, MARKER) == 0  # declared: a lost file is refused from now on


async def test_a_user_refused_the_marker_starts_unchecked_with_a_warning(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tight permissions (configure on the app's own names only) must not stop a worker: it says what it can't check."""
    from tests.integration.test_pause_faults import _user

    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    runs: list[str] = []
    async with _user(broker, configure=r"^(?!amqpjobs\.ledger\.).*") as limited:
        app = ledger_app(base, limited, tmp_path / "ledger.db", runs)
        async with running_worker(app, limited):
            await app.enqueue("charge", {}, job_id="charge:1")
            await wait_until(lambda: runs == ["charge:1"], 20, "the run")
        await app.close()
    assert "can't keep the broker's mark of app idem's ledger" in caplog.text
    assert "configure and read permission on queue amqpjobs.ledger.idem" in caplog.text


async def test_consume_processes_ends_at_once_on_a_lost_ledger(broker: BrokerSettings, tmp_path: Path) -> None:
    """No restart can make a lost ledger the app's: the supervisor stops at the first refusal, with its words.

    Before: each child was restarted until the crash-loop rule (5 exits before ready within 60 s),
    10 starts over about 10 s, then exit 2.
    """
    base = await make_app(broker, tmp_path)
    path = tmp_path / "ledger.db"
    first = ledger_app(base, broker, path, [])
    async with running_worker(first, broker):
        pass
    await first.close()
    remove(path)
    (tmp_path / "lostledger.py").write_text(
        "from amqpjobs import App, SqliteLedger\n"
        "from amqpjobs.topology.loader import load_topology\n"
        f"app = App('idem', topology=load_topology({str(tmp_path / 'app.toml')!r}).topology,"
        f" ledger=SqliteLedger({str(path)!r}))\n"
        "@app.job('charge', queue='work', idempotent=True, lease=60)\n"
        "def charge(payload, ctx):\n    pass\n"
    )
    env = {"AMQPJOBS_URL": broker.url, "PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    command = [str(Path(sys.executable).with_name("amqpjobs")), "consume", "lostledger:app", "--queues", "work",
               "--processes", "2"]  # fmt: skip
    began = time.monotonic()
    done = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr
    starts = done.stderr.count(" started (pid ")
    assert starts == 2, done.stderr  # each child once (before: 10)
    assert "restarting it in" not in done.stderr, done.stderr
    assert "with an error no restart can change (an operator must act)" in done.stderr, done.stderr
    assert "app 'idem' had a ledger before" in done.stderr.splitlines()[-1], done.stderr
    assert took < 8, took


async def test_a_second_app_of_the_default_name_is_told_to_name_itself(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two apps left unnamed (``App()``: ``amqpjobs``) in one vhost share one marker, ``amqpjobs.ledger.amqpjobs``.

    The second's first start on its own new ledger is refused, rightly by the marker's rule but
    for a reason the words did not give: before, the refusal said only "Point the app at the
    ledger it had ..., or restore it from a backup ... --new-ledger" (which would make the two
    apps share the check for good), and the first app's start said nothing of the shared name.
    """
    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)

    def unnamed(path: Path) -> App:
        app = App(topology=base.topology(), url=broker.url, ledger=SqliteLedger(path))
        app.job("charge", queue="work", idempotent=True, lease=60)(lambda p, c: None)
        return app

    first = unnamed(tmp_path / "billing.db")
    async with running_worker(first, broker):
        pass
    await first.close()
    named = [r for r in caplog.records if "has the default name" in r.getMessage()]
    assert [r.levelname for r in named] == ["WARNING"], caplog.text
    assert "App('billing', ...)" in named[0].getMessage(), named[0].getMessage()
    second = unnamed(tmp_path / "mailer.db")
    worker = Worker(second, broker, WorkerOptions(queues=("work",), grace=5), Recorder())
    try:
        with pytest.raises(ConfigurationError) as refused:
            await worker.start()
    finally:
        await worker.shutdown()
        await second.close()
    said = str(refused.value)
    assert "app 'amqpjobs' had a ledger before" in said, said
    assert "'amqpjobs' is the default name (App() given no name)" in said, said
    assert "give each app its own name" in said, said
