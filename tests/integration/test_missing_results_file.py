"""Every command that loads an app (``--app``) and whose module names a SQLite results file that is not there.

A typo'd path (``SqliteResults('resutls.db')``) is no empty store. Commands that read or record
into the store refuse it, exit 2 naming the path and the fix; commands that do not use it
(``quarantine show --app``: the payload store; ``asyncapi``) create nothing and say so in a
warning. Before, ``quarantine show --app`` and ``purge --app``, and the console's ``--app``,
created an empty file there. ``purge --app`` records each purged job ``purged`` now: it refuses it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # our own file checks
EXE = str(Path(sys.executable).with_name("amqpjobs"))


def wrong_app(where: Path) -> str:
    """An app module whose results store names ``resutls.db`` (not there), with a payload store (``show --app``)."""
    (where / "t.toml").write_text(APPLIED_TOPOLOGY)
    (where / "wrongapp.py").write_text(
        "from amqpjobs import App, FilePayloadStore, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('resutls.db'), "
        "payload_store=FilePayloadStore('payloads'))\n"
    )
    return "wrongapp:app"


def run(broker: BrokerSettings, where: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               AMQPJOBS_CONSOLE_AUDIT_LOG=str(where / "audit.jsonl"))  # fmt: skip
    return subprocess.run([EXE, *args], capture_output=True, text=True, cwd=where, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # fmt: skip


async def test_commands_that_use_no_results_store_create_none_and_say_the_path_is_missing(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: exit 0 and ``resutls.db`` created (an empty store at the typo'd path, for the workers to read)."""
    await make_app(broker, tmp_path)
    ref = wrong_app(tmp_path)
    missing = tmp_path / "resutls.db"
    for command in (["quarantine", "show", "work"],):
        proc = await asyncio.to_thread(run, broker, tmp_path, *command, "--app", ref)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not missing.exists(), command
        assert (
            f"warning: the SQLite results store at {missing} does not exist (this command does not use it, and "
            "created nothing): point the app's SqliteResults at the file its workers write"
        ) in proc.stderr, proc.stderr


async def test_commands_that_read_or_record_into_the_results_store_refuse_a_missing_file(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """``job show``, ``park``/``unpark``/``replay --app`` and the console (its job lookup reads the store, its
    park and replay record into it). Before, the console started and created ``resutls.db``."""
    await make_app(broker, tmp_path)
    ref = wrong_app(tmp_path)
    missing = tmp_path / "resutls.db"
    for command, doing in (
        (["job", "show", "j-1"], "reads it"),
        (["quarantine", "unpark", "work", "--yes"], "records into it"),
        (["quarantine", "purge", "work", "--yes"], "records into it"),
        (["console", "--port", "0"], "records into it"),
        (["console", "--port", "0", "--read-only"], "reads it"),
    ):
        try:
            proc = await asyncio.to_thread(run, broker, tmp_path, *command, "--app", ref, timeout=30)
        except subprocess.TimeoutExpired as exc:  # the console served on
            raise AssertionError(f"{command}: still running after 30 s, {missing} exists: {missing.exists()}") from exc
        assert proc.returncode == 2, proc.stdout + proc.stderr
        said = proc.stderr.strip().splitlines()[-1]
        assert said.startswith(f"error: the SQLite results store at {missing} does not exist (this command {doing}, "
                               "never creates it)"), said  # fmt: skip
        assert not missing.exists(), command


async def test_commands_that_record_into_the_results_store_create_no_ledger_file(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """``replay``/``park``/``unpark --app`` and the console record into the results store, never the ledger: a
    ledger file that is not there stays not there (helper-195: each made an empty ``ledgr.db``)."""
    from amqpjobs import SqliteResults

    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    SqliteResults(tmp_path / "results.db")  # the workers' results store: there
    (tmp_path / "ledgerapp.py").write_text(
        "from amqpjobs import App, SqliteLedger, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('results.db'), ledger=SqliteLedger('ledgr.db'))\n"
    )
    for command in (["replay", "work"], ["quarantine", "park", "work", "--yes"],
                    ["quarantine", "unpark", "work", "--yes"], ["job", "show", "j-1"]):  # fmt: skip
        proc = await asyncio.to_thread(run, broker, tmp_path, *command, "--app", "ledgerapp:app")
        found_nowhere = command[0] == "job"  # j-1 was never enqueued: `job show` exits 1 for it
        assert proc.returncode == (1 if found_nowhere else 0), (command, proc.stdout + proc.stderr)
        assert not (tmp_path / "ledgr.db").exists(), command


@pytest.mark.parametrize("content", ["empty", "another database"])
async def test_reading_commands_refuse_a_results_file_without_our_table(
    broker: BrokerSettings, tmp_path: Path, content: str
) -> None:
    """A file that is there but holds no ``amqpjobs_results`` table (``touch results.db``, or another program's
    database at that path): helper-203 saw ``job show`` exit 3 with SQLite's raw ``no such table``."""
    import sqlite3

    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    there = tmp_path / "results.db"
    there.touch()
    if content == "another database":
        with sqlite3.connect(there) as db:
            db.execute("CREATE TABLE orders (id INTEGER)")
    before = there.read_bytes()
    (tmp_path / "emptyapp.py").write_text(
        "from amqpjobs import App, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('results.db'))\n"
    )
    proc = await asyncio.to_thread(run, broker, tmp_path, "job", "show", "j-1", "--app", "emptyapp:app")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: the SQLite results store at {there} has no amqpjobs_results table (an empty file, or another "
        "program's database; this command reads it, never creates it): point the app's SqliteResults at the file "
        "its workers write (a relative path is taken from the current folder), or run the command on the host or "
        "in the container that has the file"
    )
    assert there.read_bytes() == before  # left as it was


async def test_a_sibling_apps_missing_results_file_blocks_no_command_of_the_named_app(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """helper-207: ``replay --app noresults:app`` exit 2 with the words of ANOTHER app of the module (its
    ``resutls.db`` "does not exist (this command records into it, ...)"). Only the named app is judged."""
    await make_app(broker, tmp_path)
    wrong_app(tmp_path)
    with (tmp_path / "wrongapp.py").open("a") as f:
        f.write("plain = App('plain', topology='t.toml', payload_store=FilePayloadStore('payloads'))\n")
    for command in (["replay", "work"], ["quarantine", "show", "work"]):  # park --app needs a results store
        proc = await asyncio.to_thread(run, broker, tmp_path, *command, "--app", "wrongapp:plain")
        assert proc.returncode == 0, (command, proc.stdout + proc.stderr)
        assert "resutls.db" not in proc.stderr, (command, proc.stderr)
    assert not (tmp_path / "resutls.db").exists()
