"""Reading commands read a SQLite store they may not write: ``job show`` opens the app's stores read-only.

An operator's account, a read-only mount of a backup, a container whose volume is mounted
``:ro``: the results store (and the ledger beside it) can be read but not written. ``job show``
loads the app, whose module builds its stores, and each store's first open used to create
the file and its tables read-write, so the command failed before it read anything.

Before: exit 2, ``error: importing module ...: ConfigurationError: can't open the SQLite ledger at
...: attempt to write a readonly database (SQLITE_READONLY)`` (or ``unable to open database file``
on a read-only mount). Now the stores of a reading command open their files read-only (``mode=ro``,
or ``immutable=1`` on a read-only mount where SQLite can't make its ``-shm`` file), never create
nor change them; a file this user can't read at all is named, with what to do (exit 2).

Run as the ``nobody`` user (file and folder owned by root, mode 0644 / 0755: readable, not
writable) and, as root, on a read-only bind mount. Skipped unless the tests run as root.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpjobs import SqliteLedger, SqliteResults, StateRecord
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = pytest.mark.broker
EXE = str(Path(sys.executable).with_name("amqpjobs"))
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder any user may read (pytest's tmp_path is root's own, mode 0700)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to run a command as nobody and to mount)")
    where = Path(tempfile.mkdtemp(prefix="amqpjobs-ro-"))
    where.chmod(0o755)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


async def written_store(broker: BrokerSettings, where: Path, tmp_path: Path) -> str:
    """An app module in ``where`` with a results store (one record of job 'job-1') and a ledger beside it."""
    await make_app(broker, tmp_path)
    (where / "t.toml").write_text(APPLIED_TOPOLOGY)
    (where / "roapp.py").write_text(
        "from amqpjobs import App, SqliteLedger, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('results.db'), ledger=SqliteLedger('ledger.db'))\n"
    )
    store = SqliteResults(where / "results.db")
    await store.write([StateRecord("job-1", "count", "succeeded", 1, time.time(), "", "", "work", 0.0, "42", "")])
    await SqliteLedger(where / "ledger.db").close()
    for name in ("results.db", "ledger.db", "roapp.py", "t.toml"):
        os.chmod(where / name, 0o644)
    return "roapp:app"


def listing(where: Path) -> list[str]:
    return sorted(os.listdir(where))


def mount_read_only(where: Path) -> None:
    subprocess.run(["mount", "--bind", str(where), str(where)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True, capture_output=True)


def job_show(broker: BrokerSettings, where: Path, ref: str, as_user: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
               PYTHONDONTWRITEBYTECODE="1", HOME=str(where))  # fmt: skip
    if as_user:  # pytest-cov's subprocess coverage: another user can't write its data file (CI 48: a Traceback)
        env = {k: v for k, v in env.items() if not k.startswith(("COV_CORE_", "COVERAGE_"))}
    return subprocess.run([*as_user, EXE, "job", "show", "job-1", "--app", ref], capture_output=True, text=True,
                          env=env, cwd=where, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip


async def test_job_show_reads_a_store_this_user_may_not_write(
    broker: BrokerSettings, open_dir: Path, tmp_path: Path
) -> None:
    ref = await written_store(broker, open_dir, tmp_path)
    before = listing(open_dir)
    proc = await asyncio.to_thread(job_show, broker, open_dir, ref, NOBODY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "job job-1: succeeded" in proc.stdout
    assert listing(open_dir) == before  # nothing created beside it


async def test_job_show_reads_a_store_on_a_read_only_mount(
    broker: BrokerSettings, open_dir: Path, tmp_path: Path
) -> None:
    ref = await written_store(broker, open_dir, tmp_path)
    try:
        await asyncio.to_thread(mount_read_only, open_dir)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"can't bind-mount read-only here: {exc}")
    proc = await asyncio.to_thread(job_show, broker, open_dir, ref, [])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "job job-1: succeeded" in proc.stdout


async def test_a_store_this_user_can_not_read_is_named_with_what_to_do(
    broker: BrokerSettings, open_dir: Path, tmp_path: Path
) -> None:
    ref = await written_store(broker, open_dir, tmp_path)
    (open_dir / "results.db").chmod(0o600)  # root's own
    proc = await asyncio.to_thread(job_show, broker, open_dir, ref, NOBODY)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    path = open_dir / "results.db"
    assert (
        f"can't read the SQLite results store at {path} (opened read-only, as reading commands do): "
        "unable to open database file (SQLITE_CANTOPEN); this user must be able to read the file and its folder"
    ) in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_job_show_names_a_results_store_path_that_does_not_exist(broker: BrokerSettings, tmp_path: Path) -> None:
    """A wrong path (a typo, another host's file) is no empty store: exit 2 naming the path, nothing created.

    Before: exit 0, ``job job-1: unknown`` (no record), as for a job id mistyped.
    """
    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    (tmp_path / "wrongapp.py").write_text(
        "from amqpjobs import App, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('resutls.db'))\n"
    )
    proc = await asyncio.to_thread(job_show, broker, tmp_path, "wrongapp:app", [])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stderr.strip().splitlines()[-1]
    assert said.startswith(f"error: the SQLite results store at {tmp_path / 'resutls.db'} does not exist"), said
    assert not (tmp_path / "resutls.db").exists()
    # asyncapi reads no store: the same module still works there
    done = await asyncio.to_thread(subprocess.run, [EXE, "asyncapi", "wrongapp:app"], capture_output=True,
                                   text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr


async def test_an_error_of_ours_raised_by_the_apps_module_is_said_as_ours(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """A bad topology file named by the module: our own words, not wrapped as the module's failure.

    Before: ``error: importing module 'badtopo' failed: TopologyValidationError: ...``.
    """
    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text('[[job_queue]]\nname = "work"\nretry = ["soon"]\n')
    (tmp_path / "badtopo.py").write_text(
        "from amqpjobs import App\nfrom amqpjobs.topology.loader import load_topology\n"
        "app = App('badtopo', topology=load_topology('t.toml').topology)\n"
    )
    proc = await asyncio.to_thread(job_show, broker, tmp_path, "badtopo:app", [])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stderr.strip().splitlines()
    assert not any("importing module" in line for line in said), said
    assert said[0] == "error: invalid topology (2 problem(s)):", said  # its lines, not one line with \n in it
    assert said[1].startswith("  - t.toml: job_queue[0].exchange: Field required"), said


async def test_a_command_recording_into_a_results_store_path_that_does_not_exist_is_refused(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """``quarantine park --app`` (and ``replay --app``) record each moved job's state in the app's results store.

    Before: the module's SqliteResults('resutls.db') created an empty file there and the command
    recorded into it (exit 0): `job show` against the workers' store never saw those records.
    """
    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    (tmp_path / "wrongapp.py").write_text(
        "from amqpjobs import App, SqliteResults\n"
        "app = App('roapp', topology='t.toml', results=SqliteResults('resutls.db'))\n"
    )
    env = dict(os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url)
    for command in (["quarantine", "park", "work", "--yes"], ["replay", "work.quarantine"]):
        proc = await asyncio.to_thread(subprocess.run, [EXE, *command, "--app", "wrongapp:app"], capture_output=True,
                                       text=True, cwd=tmp_path, env=env, timeout=60)  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        said = proc.stderr.strip().splitlines()[-1]
        assert said.startswith(f"error: the SQLite results store at {tmp_path / 'resutls.db'} does not exist"), said
        assert not (tmp_path / "resutls.db").exists()
