"""``--app MODULE:ATTR`` judges the named app only: a sibling App's SQLite store that can't open blocks nothing.

Stores open when an App is built, so a module holding two apps opens both apps' stores at
import. Before, ``replay --app noresults:app`` was refused with the words of ANOTHER app's
missing results file ("... does not exist (this command records into it, ...)"), and a worker
of one app would not start for a sibling's missing folder. Now the named app's own store is
refused with its own words (path and fix), and a sibling's is not judged.
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys
from pathlib import Path

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.loading import load_app, load_app_reading_results

_names = itertools.count()


def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """Write ``body`` as a new module (a name of its own: imports are cached) importable from ``tmp_path``."""
    name = f"siblings_{next(_names)}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("from amqpjobs import App, SqliteLedger, SqliteResults\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def siblings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: str) -> str:
    """A new module of two apps, ``app`` (``App('plain')``, no store) and ``other`` (the expression ``other``)."""
    return module(tmp_path, monkeypatch, f"app = App('plain')\nother = {other}\n")


def other_refused(name: str, mode: str) -> str:
    """Load ``name:app`` then ``name:other`` as a command of ``mode`` (``worker``, ``reading`` or ``existing``)
    does: ``app`` must load whatever its sibling's stores, ``other`` be refused; the refusal's words."""
    kw = {"reading": mode == "reading", "existing": mode == "existing"}
    assert load_app(f"{name}:app", **kw).name == "plain"
    with pytest.raises(ConfigurationError) as info:
        load_app(f"{name}:other", **kw)
    return str(info.value)


def test_a_siblings_missing_results_file_blocks_no_recording_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = siblings(tmp_path, monkeypatch, f"App('other', results=SqliteResults({str(tmp_path / 'none.db')!r}))")
    said = other_refused(name, "existing")  # the named app's own missing file: still refused, in its words
    assert re.search(r"none\.db does not exist \(this command records into it", said), said
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("mode", ["worker", "reading", "existing"])
def test_a_siblings_unusable_store_blocks_no_other_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A sibling's ledger in a missing folder and results store that is no SQLite file: the other app loads."""
    (tmp_path / "notes.txt").write_text("not a database, " * 400)
    name = siblings(tmp_path, monkeypatch, f"App('other', ledger=SqliteLedger({str(tmp_path / 'gone' / 'l.db')!r}), "
                                           f"results=SqliteResults({str(tmp_path / 'notes.txt')!r}))")  # fmt: skip
    said = other_refused(name, mode)
    assert str(tmp_path) in said, said  # the named app's store, its path and fix
    assert not (tmp_path / "gone").exists()


def test_reading_the_named_apps_results_still_refuses_its_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = module(
        tmp_path,
        monkeypatch,
        f"app = App('r', results=SqliteResults({str(tmp_path / 'r.db')!r}))\n"
        f"other = App('o', results=SqliteResults({str(tmp_path / 'o.db')!r}))\n",
    )
    with pytest.raises(ConfigurationError, match=r"r\.db does not exist \(this command reads it"):
        load_app_reading_results(f"{name}:app")
    assert not (tmp_path / "r.db").exists()
    assert not (tmp_path / "o.db").exists()


def test_an_attribute_that_is_no_app_is_named_with_its_article(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "'os:path' is module, not an amqpjobs App"."""
    with pytest.raises(ConfigurationError, match=r"^'os:path' is a module, not an amqpjobs App"):
        load_app("os:path")
    name = module(tmp_path, monkeypatch, "n = 1\nthing = object()\n")
    with pytest.raises(ConfigurationError, match=r"is an int, not an amqpjobs App"):
        load_app(f"{name}:n")
    with pytest.raises(ConfigurationError, match=r"is an object, not an amqpjobs App"):
        load_app(f"{name}:thing")


@pytest.mark.parametrize("mode", ["worker", "reading", "existing"])
def test_a_siblings_store_path_naming_a_folder_blocks_no_other_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Before: "SqliteResults('...'): ... is a folder, not a regular file" for ``--app m:app`` too."""
    (tmp_path / "adir").mkdir()
    name = siblings(tmp_path, monkeypatch, f"App('other', results=SqliteResults({str(tmp_path / 'adir')!r}))")
    said = other_refused(name, mode)
    assert re.search(r"adir is a folder, not a regular file; give the path of a SQLite", said), said


SIBLING_STORES = [
    ("results", "SqliteResults(':memory:')", r"^SqliteResults\(':memory:'\): an in-memory or temporary SQLite"),
    ("ledger", "SqliteLedger('')", r"^SqliteLedger\(''\): an in-memory or temporary SQLite database"),
    ("ledger", "PostgresLedger('nonsense')", r"^PostgresLedger\(dsn=\.\.\.\) is not a URL .*: give the database's URL"),
    ("results", "PostgresResults('mysql://h/db')", r"^PostgresResults\(dsn=\.\.\.\) has scheme 'mysql'"),
    ("results", "SqliteResults('r.db', retention='6M')", r"^SqliteResults\(retention=\.\.\.\)"),
    ("payload_store", "FilePayloadStore('')", r"^FilePayloadStore\(root=\.\.\.\) is empty"),
    # helper-229: taken, then every enqueue failed with "embedded null byte" and a worker exited 3
    ("payload_store", "FilePayloadStore('/tmp/a\\x00b')", r"^FilePayloadStore\(root=\.\.\.\) holds a NUL character"),
]


@pytest.mark.parametrize(("argument", "store", "words"), SIBLING_STORES, ids=[s[1] for s in SIBLING_STORES])
async def test_a_siblings_store_argument_that_cant_work_is_refused_when_used_not_at_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argument: str, store: str, words: str
) -> None:
    """Before: ``--app m:app`` refused with the sibling's words, e.g. "SqliteResults(':memory:'): an in-memory ..."."""
    monkeypatch.chdir(tmp_path)
    body = (
        "from amqpjobs import FilePayloadStore, PostgresLedger, PostgresResults\n"
        f"app = App('plain')\nother = App('other', {argument}={store})\n"
    )
    name = module(tmp_path, monkeypatch, body)
    for kw in ({}, {"reading": True}, {"existing": True}):
        assert load_app(f"{name}:app", **kw).name == "plain"  # the chosen App starts
    sibling = sys.modules[name].other
    with pytest.raises(ConfigurationError, match=words):
        await getattr(sibling, argument).prune(3600)  # used: refused, naming the argument and the fix
    with pytest.raises(ConfigurationError, match=words):
        load_app(f"{name}:other")  # named: refused at once, in the constructor's words
    again = module(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigurationError, match=words):
        importlib.import_module(again)  # a plain import (your program): the constructor raises, as before
