"""Issue 25 (first half): large payloads by reference (claim-check) with each store, on a real broker.

Stores: a shared directory, PostgreSQL (the shared test database; each test its own store
name, so rows never mix), and S3 through boto3 against moto's S3 server, an emulator run
in this process on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, FilePayloadStore, JobContext, PayloadStore, Reject
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.payload_refs import parse_ref
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.parking import park
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, drain
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

GRACE = 1.0
SWEEP = 0.2
FIVE_MIB = 5 * 1024 * 1024


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server (an emulator of the S3 API), in a thread on a free loopback port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_options(endpoint: str) -> dict[str, str]:
    return {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing"}  # fmt: skip


@pytest.fixture(params=["file", "postgres", "s3"])
def store_source(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Python source of a fresh store (the test app and an app module for ``--app`` build the same one)."""
    common = f"grace={GRACE}, sweep_every={SWEEP}"
    if request.param == "file":
        return f"FilePayloadStore({str(tmp_path / 'payloads')!r}, {common})"
    if request.param == "postgres":
        name = f"t{uuid.uuid4().hex[:12]}"
        return f"PostgresPayloadStore({request.getfixturevalue('pg_url')!r}, name={name!r}, {common})"
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"t{uuid.uuid4().hex[:12]}"
    import boto3

    boto3.client("s3", **s3_options(endpoint)).create_bucket(Bucket=bucket)
    return f"S3PayloadStore({bucket!r}, client_options={s3_options(endpoint)!r}, {common})"


def build_store(source: str) -> PayloadStore:
    import amqpjobs

    store = eval(source, {name: getattr(amqpjobs, name) for name in amqpjobs.__all__})
    assert isinstance(store, PayloadStore)
    return store


def app_module(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An app module (``MODULE:APP`` for ``--app``) on the applied topology with the test's payload store."""
    module = f"payapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / "t.toml").write_text(APPLIED_TOPOLOGY)
    (tmp_path / f"{module}.py").write_text(
        "from amqpjobs import *\n"
        f"app = App('payapp', topology={str(tmp_path / 't.toml')!r}, payload_store={source})\n"
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    return f"{module}:app"


def big_payload() -> dict[str, Any]:
    return {"blob": "x" * FIVE_MIB, "tag": uuid.uuid4().hex}


def digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


async def wait_gone(store: PayloadStore, key: str, limit: float) -> float:
    """Seconds until the store no longer holds ``key`` (fails after ``limit``)."""
    started = time.monotonic()
    while await store.read(key) is not None:
        assert time.monotonic() - started < limit, f"payload {key} still stored after {limit}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def app_with(broker: BrokerSettings, tmp_path: Path, store: PayloadStore | None) -> App:
    app = await make_app(broker, tmp_path)
    app.payload_store = store
    return app


async def test_5mib_payload_through_retry_quarantine_park_and_replay_then_deleted_after_grace(
    broker: BrokerSettings, tmp_path: Path, store_source: str, monkeypatch: pytest.MonkeyPatch
):
    store = build_store(store_source)
    app = await app_with(broker, tmp_path, store)
    seen: list[tuple[int, str]] = []
    fail = {"on": True}

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append((ctx.attempt, digest(payload)))
        if fail["on"] and ctx.attempt == 1:
            raise ValueError("first attempt fails")
        if fail["on"]:
            raise Reject("second attempt rejects")

    payload = big_payload()
    async with running_worker(app, broker) as (_, rec):
        job_id = await app.enqueue("big", payload)
        await rec.wait_for(lambda o: any(x.kind == "quarantined" for x in o))
    assert seen == [(1, digest(payload)), (2, digest(payload))]  # the retried copy carried the reference too

    # the quarantined copy: empty body, the reference; the store keeps the payload, unmarked
    ref_module = app_module(tmp_path, store_source, monkeypatch)
    shown = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json", "--app", ref_module)
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout.splitlines()[0])
    assert doc["message_id"] == job_id
    assert doc["body_b64"] == ""
    assert doc["payload"] == payload
    assert doc["stored_payload_problem"] == ""
    ref = parse_ref(doc["headers"][envelope.PAYLOAD_REF])
    assert ref.store == store.name
    assert len(ref.key) == 32
    text = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--app", ref_module)
    assert '    payload:    {"blob": "xxxxxxxx' in text.stdout
    plain = await asyncio.to_thread(cli, broker, "quarantine", "show", "work")
    assert "payload:    (stored: give --app MODULE:APP" in plain.stdout
    assert await store.read(ref.key) == envelope.encode_payload(payload)

    # parked, then replayed from the parked queue: every copy keeps the reference; now it succeeds
    assert (await park(broker, "work")).taken == 1
    await asyncio.sleep(GRACE + 2 * SWEEP)  # nothing sweeps a payload whose job never succeeded
    assert await store.read(ref.key) is not None
    fail["on"] = False
    async with running_worker(app, broker) as (_, rec):
        assert (await replay(broker, "work.parked", ReplayOptions(rate=100))).replayed == 1
        await rec.wait_for(lambda o: any(x.kind == "succeeded" for x in o))
        assert seen[-1] == (1, digest(payload))
        kept = await store.read(ref.key)
        assert kept is not None  # within the grace a redelivery still finds it
        waited = await wait_gone(store, ref.key, GRACE + 10)
    assert waited >= GRACE - 0.5, waited  # not before the grace (the mark is set after the ack)
    await app.close()


async def test_a_deleted_stored_payload_quarantines_payload_missing_with_evidence(
    broker: BrokerSettings, tmp_path: Path, store_source: str, monkeypatch: pytest.MonkeyPatch
):
    store = build_store(store_source)
    app = await app_with(broker, tmp_path, store)
    ran: list[str] = []

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    refs = []
    put = store.put

    async def noting_put(data: bytes) -> Any:
        refs.append(await put(data))
        return refs[-1]

    monkeypatch.setattr(store, "put", noting_put)
    small = await app.enqueue("big", {"tag": "small"})  # under the threshold: in the body, as ever
    job_id = await app.enqueue("big", big_payload())
    [ref] = refs
    await store.remove(ref.key)
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == 2)
    assert ran == [small]
    [quarantined] = await drain(broker, "work.quarantine")
    headers = quarantined.headers
    assert headers[evidence.REASON] == "payload-missing"
    assert headers[evidence.ERROR_TYPE] == "PayloadRefError"
    assert f"holds no payload {ref.key!r}" in str(headers[evidence.ERROR_MESSAGE])
    # the queue to purge named, not a placeholder (helper-229)
    assert "(amqpjobs quarantine purge work.quarantine --reason payload-missing)" in str(
        headers[evidence.ERROR_MESSAGE]
    )
    assert headers[envelope.PAYLOAD_REF] == str(ref)
    assert quarantined.body == b""
    assert quarantined.message_id == job_id
    await app.close()


async def test_sync_publisher_keeps_a_large_payload_in_the_apps_store(broker: BrokerSettings, tmp_path: Path):
    """The sync publisher carries the app's options over, the payload store too (a copy with its own connections)."""
    store = FilePayloadStore(tmp_path / "payloads")
    app = await app_with(broker, tmp_path, store)
    app.job("big", queue="work")(lambda p, c: None)
    payload = {"blob": "y" * (1024 * 1024)}
    with app.sync_publisher() as pub:
        job_id = await asyncio.to_thread(pub.enqueue, "big", payload)
    [message] = await drain(broker, "work")
    assert message.message_id == job_id
    assert message.body == b""
    ref = parse_ref(message.headers[envelope.PAYLOAD_REF])
    assert ref.store == "file"
    assert await store.read(ref.key) == envelope.encode_payload(payload)
    await app.close()


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` takes no new file: immutable for root (who ignores modes), mode 0555 for anyone else."""
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
        if made.returncode:  # tmpfs, for one, has no immutable flag
            pytest.skip(f"root can't make {directory} read-only here: chattr +i: {made.stderr.strip()}")
    else:
        directory.chmod(0o555)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)


async def test_a_worker_whose_file_store_takes_no_done_mark_says_so_at_start_and_still_runs_the_job(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """helper-229: a read-only store was said only by a warning after each success, at start nothing."""
    store = FilePayloadStore(tmp_path / "payloads")
    app = await app_with(broker, tmp_path, store)
    ran: list[str] = []
    app.job("big", queue="work")(lambda p, c: ran.append(p["tag"]))
    payload = big_payload()
    await app.enqueue("big", payload)
    with read_only(store.root / "done"), caplog.at_level(logging.WARNING, logger="amqpjobs"):
        async with running_worker(app, broker) as (_, rec):
            await rec.wait_for(lambda o: len(o) == 1)
        assert (store.root / "done").exists()
    assert ran == [payload["tag"]]
    started = [r.getMessage() for r in caplog.records if "can't write its done marks" in r.getMessage()]
    assert len(started) == 1, [r.getMessage() for r in caplog.records]
    assert str(store.root / "done") in started[0]
    assert "no stored payload is ever deleted" in started[0]
    assert "write access" in started[0]
    assert list((store.root / "done").iterdir()) == []  # the probe left nothing behind
    await app.close()
