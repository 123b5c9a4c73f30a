"""``job show`` with the broker out of reach still prints what the results store records.

Before (helper-204), a quarantined job's ``job show`` failed as a whole, exit 3, printing nothing
of its record: the one place an operator reads a job's state and history during a broker outage.
Now the record is printed, the ``now:`` line says where it is can't be checked, and the exit is 3.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from amqpjobs import SqliteResults
from amqpjobs.cli import main
from amqpjobs.jobs.results import StateRecord

TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n'


def show(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    env = {"AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/", "AMQPJOBS_MANAGEMENT_URL": "http://127.0.0.1:1/"}
    result = CliRunner().invoke(main, ["job", "show", "q-1", "--app", "offapp:app", "--connect-timeout", "1s",
                                       *extra], env=env, catch_exceptions=False)  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def quarantined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An app module whose SQLite results store records job q-1 quarantined (no broker anywhere)."""
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    (tmp_path / "offapp.py").write_text(
        "from amqpjobs import App, SqliteResults\n"
        "app = App('offapp', topology='t.toml', results=SqliteResults('results.db'))\n"
        "@app.job('mail', queue='work')\nasync def mail(payload, ctx):\n    pass\n"
    )
    store = SqliteResults(tmp_path / "results.db")
    record = StateRecord("q-1", "mail", "quarantined", 3, time.time(), detail="exhausted", error="ValueError: no",
                         where="work.quarantine")  # fmt: skip
    asyncio.run(store.write([record]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("offapp", None)


def test_the_record_is_printed_and_where_it_is_now_is_said_unknown(quarantined: Path) -> None:
    code, out, err = show(quarantined)
    assert code == 3, out + err
    assert out.startswith("job q-1: quarantined"), out
    now = [line for line in out.splitlines() if line.startswith("now: ")]
    assert len(now) == 1, out
    assert now[0].startswith("now: not known: broker at amqp://"), now[0]  # the wire's words, as every command's
    assert " unreachable after " in now[0], now[0]
    assert now[0].endswith("; the state above is the results store's record"), now[0]


def test_as_json_where_is_null_and_why_is_given(quarantined: Path) -> None:
    code, out, err = show(quarantined, "--json")
    assert code == 3, out + err
    doc = json.loads(out)
    assert (doc["job_id"], doc["state"], doc["where"]) == ("q-1", "quarantined", None)
    assert doc["where_unknown"].startswith("broker at amqp://"), doc
    assert " unreachable after " in doc["where_unknown"], doc
