"""A SQLite ledger or results store that can't be opened: a setting to fix (exit 2) or busy now (exit 3)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from amqpjobs import SqliteLedger, SqliteResults
from amqpjobs.errors import ConfigurationError, LedgerUnavailableError, ResultsUnavailableError
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.sqlite_errors import open_failure

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize("store", [SqliteLedger, SqliteResults])
def test_a_path_in_a_missing_directory_is_a_setting_that_names_the_file_and_the_fix(tmp_path: Path, store: type):
    path = tmp_path / "no-such-dir" / "x.db"
    with pytest.raises(ConfigurationError) as refused:
        store(path)
    what = "ledger" if store is SqliteLedger else "results store"
    assert str(refused.value) == (
        f"can't open the SQLite {what} at {path}: unable to open database file (SQLITE_CANTOPEN); "
        "check that its directory exists and that this user can create and write files in it"
    )


@pytest.mark.parametrize("store", [SqliteLedger, SqliteResults])
def test_a_file_that_is_no_sqlite_database_is_a_setting(tmp_path: Path, store: type):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    with pytest.raises(ConfigurationError) as refused:
        store(path)
    assert "file is not a database (SQLITE_NOTADB); point it at a SQLite file of its own" in str(refused.value)
    assert path.read_bytes().startswith(b"these are my notes")  # left as it was


@pytest.mark.parametrize("store", [SqliteLedger, SqliteResults])
@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_a_path_that_is_no_regular_file_is_a_setting_naming_what_it_is(tmp_path: Path, store: type, kind: str):
    """Was: a FIFO 'disk I/O error (SQLITE_IOERR_READ); the disk failed a read or write' (exit 3), /dev/null
    'cannot rollback - no transaction is active (SQLITE_ERROR); check that its directory exists ...' (helper-177).
    """
    if kind == "folder":
        path, what = tmp_path, "a folder"
    elif kind == "fifo":
        path, what = tmp_path / "pipe", "a FIFO"
        os.mkfifo(path)
    else:
        path, what = Path("/dev/null"), "a device"
    with pytest.raises(ConfigurationError) as refused:
        store(path)
    owner = store.__name__
    assert str(refused.value) == (
        f"{owner}({str(path)!r}): {path} is {what}, not a regular file; give the path of a SQLite database "
        "file (created when missing)"
    )


def busy_error(path: Path) -> sqlite3.Error:
    """A real SQLITE_BUSY: another connection holds the write lock and this one does not wait."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError) as busy:
            other.execute("CREATE TABLE u (x)")
        other.close()
        return busy.value
    finally:
        holder.close()


def test_a_busy_database_is_unavailable_not_a_setting(tmp_path: Path):
    exc = busy_error(tmp_path / "busy.db")
    ledger = open_failure("ledger", tmp_path / "busy.db", exc)
    results = open_failure("results store", tmp_path / "busy.db", exc)
    assert isinstance(ledger, LedgerUnavailableError)
    assert isinstance(results, ResultsUnavailableError)
    assert str(ledger) == (
        f"can't open the SQLite ledger at {tmp_path / 'busy.db'} now: database is locked (SQLITE_BUSY); "
        "another process holds it locked: try again"
    )


@pytest.mark.parametrize("error", [LedgerUnavailableError, ResultsUnavailableError])
def test_an_app_module_whose_store_is_unavailable_at_import_fails_as_unavailable_not_as_a_bad_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
):
    module = f"unavailable_{error.__name__.lower()}"
    (tmp_path / f"{module}.py").write_text(
        f"from amqpjobs.errors import {error.__name__}\nraise {error.__name__}('the store is down')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(error, match=r"^the store is down$"):  # exit 3 (a service failed us), as at any other time
        load_app(f"{module}:app")
