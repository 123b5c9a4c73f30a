"""Bad command lines: a clear one-line error, the documented exit code, no traceback, no password."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.urls import redact
from tests.integration.helpers import ROOT, TOPOLOGY, depth
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker
EXE = str(Path(sys.executable).with_name("amqpjobs"))


def run(
    broker: BrokerSettings,
    *args: str,
    url: str | None = None,
    cwd: Path = ROOT,
    env_extra: dict[str, str] | None = None,
    timeout: float = 90,
) -> tuple[int, str, float]:
    env = dict(os.environ, AMQPJOBS_URL=url or broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url)
    env.update(env_extra or {})
    started = time.monotonic()
    proc = subprocess.run(
        [EXE, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def bad_url(broker: BrokerSettings, password: str = "wrong-secret", vhost: str | None = None) -> str:
    host_port = broker.url.split("@", 1)[1].split("/", 1)[0]
    return f"amqp://{broker.username}:{password}@{host_port}/{vhost or broker.vhost}"


CASES = [
    # (id, args, expected exit code, words in the output)
    ("bad-port", ["topology", "plan", "topology"], 2, "bad broker URL"),
    (
        "export-to-missing-dir",
        ["topology", "export", "topology", "-o", "/nonexistent/dir/x.json"],
        2,
        "folder /nonexistent/dir does not exist; create it (mkdir -p /nonexistent/dir)",
    ),
    ("export-empty-vhost", ["topology", "export", "topology", "--vhost", ""], 2, "--vhost is empty"),
    ("consume-missing-module", ["consume", "no_such_module_xyz:app"], 2, "cannot import module"),
    ("consume-missing-attribute", ["consume", "tests.integration.procapp:nope"], 2, "has no attribute 'nope'"),
    ("consume-not-an-app", ["consume", "tests.integration.procapp:sleep"], 2, "not an amqpjobs App"),
    (
        "consume-concurrency-0",
        ["consume", "tests.integration.procapp:app", "--concurrency", "0"],
        2,
        "Error: Invalid value for '--concurrency' / '-c': 0 is not in the range 1<=x<=256.",
    ),
    ("consume-bad-grace", ["consume", "tests.integration.procapp:app", "--grace", "soon"], 2, "not a duration"),
    (
        "apply-declare-timeout-0",
        ["topology", "apply", "topology", "--declare-timeout", "0"],
        2,
        "--declare-timeout: '0' must be a positive",
    ),
    (
        "apply-declare-timeout-garbage",
        ["topology", "apply", "topology", "--declare-timeout", "1e9"],
        2,
        "--declare-timeout: '1e9' is not a duration",
    ),
    ("replay-empty-since", ["replay", "work", "--since", ""], 2, "--since is empty"),
    ("replay-garbage-since", ["replay", "work", "--since", "garbage"], 2, "--since 'garbage'"),
    ("replay-rate-0", ["replay", "work", "--rate", "0"], 2, "--rate must be"),
    ("replay-rate-inf", ["replay", "work", "--rate", "inf"], 2, "--rate must be"),
    ("replay-rate-negative", ["replay", "work", "--rate", "-5"], 2, "--rate must be"),
    ("replay-bad-reason", ["replay", "work", "--reason", "bogus"], 2, "is not a reason"),
    (
        "replay-limit-0",
        ["replay", "work", "--limit", "0"],
        2,
        "Error: Invalid value for '--limit': 0 is not in the range x>=1.",
    ),
    (  # helper-226: said "no quarantine queue 'work.retry.200ms.quarantine'"
        "purge-a-tier-queue",
        ["quarantine", "purge", "work.retry.200ms", "--yes"],
        2,
        "error: 'work.retry.200ms' is retry tier 200ms of work queue work (job queue work), not a quarantine or "
        "parked queue: give its job queue, work",
    ),
    (
        "replay-a-suspects-queue",
        ["replay", "work.suspects"],
        2,
        "error: 'work.suspects' is the suspects queue of job queue work, not a quarantine or parked queue: give its "
        "job queue, work",
    ),
    (  # helper-227: said "no quarantine queue 'amqpjobs.ledger.shop.quarantine'"
        "show-the-ledger-marker",
        ["quarantine", "show", "amqpjobs.ledger.shop"],
        2,
        "error: 'amqpjobs.ledger.shop' is the ledger marker of app shop, not a quarantine or parked queue: give a "
        "job queue's name",
    ),
    (
        "purge-a-scheduler-queue",
        ["quarantine", "purge", "amqpjobs.scheduler.shop.leader", "--yes"],
        2,
        "is a scheduler queue of app shop, not a quarantine or parked queue: give a job queue's name",
    ),
    ("show-missing", ["quarantine", "show", "nope"], 2, "no quarantine queue 'nope.quarantine' in this vhost"),
    (
        "replay-to-missing-queue",
        ["replay", "work", "--to", "nosuchqueue"],
        2,
        "target queue(s) 'nosuchqueue' do not exist",
    ),
    (  # was 'error: [Errno 28] No space left on device': no file named, no fix (helper-177)
        "quarantine-export-to-a-full-disk",
        ["quarantine", "export", "work", "/dev/full"],
        2,
        "error: FILE /dev/full can't be written (No space left on device); give another path\n",
    ),
]


@pytest.mark.parametrize(("case", "args", "code", "words"), CASES, ids=[c[0] for c in CASES])
async def test_bad_command_lines(broker: BrokerSettings, tmp_path: Path, case: str, args: list[str], code: int,
                                 words: str):  # fmt: skip
    await make_app(broker, tmp_path)
    if case in ("replay-to-missing-queue", "quarantine-export-to-a-full-disk"):
        from tests.integration.test_quarantine import fill_quarantine

        await fill_quarantine(broker, 2)
    url = "amqp://u:p@127.0.0.1:notaport/" if case == "bad-port" else None
    got, out, _ = await asyncio.to_thread(run, broker, *args, url=url)
    assert got == code, out
    assert words in out, out
    assert "Traceback" not in out
    if case in ("replay-to-missing-queue", "quarantine-export-to-a-full-disk"):
        assert await depth(broker, "work.quarantine") == 2  # nothing lost


async def test_wrong_password_fails_fast_and_is_never_printed(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    env = {"PROCAPP_TOPOLOGY": str(tmp_path / "applied.toml"), "PROCAPP_RECORD": str(tmp_path / "r.txt")}
    url = bad_url(broker)
    cases = [  # plan asks the management API first; consume connects over AMQP
        (["topology", "plan", str(TOPOLOGY)], f"broker error: management API at {broker.management_url} refused "
         f"user '{broker.username}' (401): check the user and password in the URL\n"),
        (["consume", "tests.integration.procapp:app"],
         f"broker error: broker at {redact(url)} refused the credentials (user '{broker.username}'): check the user "
         "and password in the URL\n"),
    ]  # fmt: skip
    for args, refusal in cases:
        code, out, took = await asyncio.to_thread(run, broker, *args, url=url, env_extra=env)
        assert code == 3, out
        assert out == refusal  # one line, and nothing else
        assert "wrong-secret" not in out
        assert "Traceback" not in out
        assert took < 15, took


async def test_consume_against_missing_vhost_or_topology_is_one_clear_error(broker: BrokerSettings, tmp_path: Path):
    topo = tmp_path / "t.toml"
    topo.write_text('[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n')
    env = {"PROCAPP_TOPOLOGY": str(topo), "PROCAPP_RECORD": str(tmp_path / "r.txt")}
    missing = bad_url(broker, broker.password, "no-such-vhost")
    code, out, _ = await asyncio.to_thread(run, broker, "consume", "tests.integration.procapp:app", url=missing,
                                           env_extra=env)  # fmt: skip
    assert code == 3, out
    assert "no-such-vhost" in out
    assert "Traceback" not in out
    code, out, _ = await asyncio.to_thread(run, broker, "consume", "tests.integration.procapp:app", env_extra=env)
    assert code == 3, out
    assert "queue(s) work.quarantine, work.suspects and exchange(s) work.quarantine do not exist" in out
    assert "apply the topology first" in out
    assert "Traceback" not in out
    assert "Event loop is closed" not in out


async def test_module_raising_at_import(broker: BrokerSettings, tmp_path: Path):
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('config missing')\n")
    (tmp_path / "syntax_mod.py").write_text("def (:\n")
    for module, words in (("broken_mod", "RuntimeError: config missing"), ("syntax_mod", "SyntaxError")):
        code, out, _ = await asyncio.to_thread(run, broker, "consume", f"{module}:app", cwd=tmp_path)
        assert code == 2, out
        assert words in out
        assert "Traceback" not in out


async def test_consume_with_a_payload_store_it_cannot_open_refuses_to_start(broker: BrokerSettings, tmp_path: Path):
    """Before, the worker started and burnt every large job's attempts into quarantine ``payload-store-error``."""
    await make_app(broker, tmp_path)  # the topology applied: only the store is wrong
    (tmp_path / "not-a-dir").write_text("a regular file where the store's root should be")
    (tmp_path / "badstore_app.py").write_text(
        "from amqpjobs import App, FilePayloadStore\n"
        f"app = App('bad-store', topology={str(tmp_path / 'app.toml')!r}, "
        f"payload_store=FilePayloadStore({str(tmp_path / 'not-a-dir')!r}))\n"
        "app.job('big', queue='work')(lambda payload, ctx: None)\n"
    )
    try:
        code, out, _ = await asyncio.to_thread(run, broker, "consume", "badstore_app:app", cwd=tmp_path, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker started with a payload store it can't open")
    assert code == 3, out
    assert "payload store 'file' can't be opened (NotADirectoryError" in out, out
    assert "the worker did not start" in out
    assert "Traceback" not in out


async def test_job_show_says_the_credentials_were_refused_not_that_the_broker_cant_be_reached(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """helper-207: ``now: not known: the broker can't be reached (broker at ... refused the credentials ...)``."""
    from amqpjobs import SqliteResults

    await make_app(broker, tmp_path)
    (tmp_path / "t.toml").write_text((tmp_path / "applied.toml").read_text())
    SqliteResults(tmp_path / "results.db")
    (tmp_path / "showapp.py").write_text(
        "from amqpjobs import App, SqliteResults\n"
        "app = App('showapp', topology='t.toml', results=SqliteResults('results.db'))\n"
    )
    url = bad_url(broker)
    code, out, _ = await asyncio.to_thread(run, broker, "job", "show", "j-1", "--app", "showapp:app", url=url,
                                           cwd=tmp_path)  # fmt: skip
    assert code == 3, out
    assert out.splitlines()[-1] == (
        f"now: not known: broker at {redact(url)} refused the credentials (user '{broker.username}'): check the user "
        "and password in the URL; the state above is the results store's record"
    ), out
    assert "wrong-secret" not in out
