"""Helpers for integration tests: raw AMQP access that bypasses amqpjobs on purpose."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractChannel
from click.testing import CliRunner, Result

from amqpjobs import App, JobContext
from amqpjobs.cli import main
from amqpjobs.errors import ManagementApiError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import running_worker
from tests.topologies import work_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topology"
T = TypeVar("T")


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true (looked at every 50 ms); TimeoutError naming ``what`` after ``timeout`` s.

    For a state that the broker, a reconnect or another process reaches in its own time: wait for it, never a
    fixed sleep before asserting it.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_until_async(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """:func:`wait_until` for a predicate that must be awaited (a broker or API look; every 100 ms)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@asynccontextmanager
async def raw_channel(settings: BrokerSettings) -> AsyncIterator[AbstractChannel]:
    """A plain aio-pika channel on the test vhost (``amqps://``: verified by the URL's TLS options, as amqpjobs is)."""
    if settings.url.startswith("amqps://"):
        from amqpjobs.wire.connection import connect

        connection: aio_pika.abc.AbstractConnection = await connect(settings, wait=10, name="test-raw")
    else:
        connection = await aio_pika.connect(settings.url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


def cli(settings: BrokerSettings, *args: str) -> Result:
    """Run the amqpjobs CLI in-process against the test vhost.

    With ``--connect-timeout`` 10 s unless a test gives it (one-shot commands default to 5 s, and
    so does each management API request): in the parallel suite a 4.x node busy with quorum
    queues once took longer than 5 s to answer a `quarantine park` (local CI 48 on 4.3; again on
    4.0 beside four other engineers' suites). The default's own tests give their values.
    """
    env = {"AMQPJOBS_URL": settings.url, "AMQPJOBS_MANAGEMENT_URL": settings.management_url,
           "AMQPJOBS_CONNECT_TIMEOUT": "10s"}  # fmt: skip
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def cli_refused(settings: BrokerSettings, *args: str) -> str:
    """:func:`cli` with ``args``, which must be refused as a usage error (exit 2): its stderr, to assert whole."""
    result = cli(settings, *args)
    assert result.exit_code == 2, result.output
    return result.stderr


@contextmanager
def limited_user(
    broker: BrokerSettings, tags: str = "", limits: dict[str, int] | None = None
) -> Iterator[tuple[str, str]]:
    """A new user of the test vhost with every permission, management ``tags`` and user ``limits`` (e.g.
    ``{"max-channels": 2}``; none: no limit yet): (its name, its URL, password ``lim-secret``). Deleted after."""
    user = f"lim-{uuid.uuid4().hex[:8]}"
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/users/{user}", {"password": "lim-secret", "tags": tags})
        mgmt.request("PUT", f"/permissions/{quote(broker.vhost, safe='')}/{user}",
                     {"configure": ".*", "write": ".*", "read": ".*"})  # fmt: skip
        for limit, value in (limits or {}).items():
            mgmt.request("PUT", f"/user-limits/{user}/{limit}", {"value": value})
    parts = urlsplit(broker.url)
    try:
        yield user, urlunsplit(parts._replace(netloc=f"{user}:lim-secret@{parts.hostname}:{parts.port}"))
    finally:
        with ManagementClient(broker) as mgmt:
            mgmt.request("DELETE", f"/users/{user}", allow_404=True)


def close_connections(broker: BrokerSettings, connection_name: str | None = None, user: str | None = None) -> int:
    """Close (management API) every connection of the test vhost named ``connection_name`` (its client's
    ``connection_name``) or opened by ``user``; how many."""
    with ManagementClient(broker) as mgmt:
        listed = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
        names = [c["name"] for c in listed
                 if (connection_name is not None
                     and (c.get("client_properties") or {}).get("connection_name") == connection_name)
                 or (user is not None and c.get("user") == user)]  # fmt: skip
        for name in names:
            try:
                mgmt.request("DELETE", f"/connections/{quote(name, safe='')}", allow_404=True)
            except ManagementApiError as exc:
                # 500 when the connection closes itself meanwhile (its process exits under the API's call:
                # seen on 3.10.8 when a worker's publishing connection closed after its consuming one)
                gone = mgmt.request("GET", f"/connections/{quote(name, safe='')}", allow_404=True) is None
                if exc.status != 500 or not gone:
                    raise
        return len(names)


def cli_subprocess(settings: BrokerSettings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the installed ``amqpjobs`` console script as a user would."""
    env = dict(os.environ, AMQPJOBS_URL=settings.url, AMQPJOBS_MANAGEMENT_URL=settings.management_url)
    exe = Path(sys.executable).with_name("amqpjobs")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout)


def queue_names(mgmt: Any, vhost: str) -> list[str]:
    return sorted(q["name"] for q in mgmt.queues(vhost))


def exchange_names(mgmt: Any, vhost: str) -> list[str]:
    return sorted(e["name"] for e in mgmt.exchanges(vhost) if e["name"] and not e["name"].startswith("amq."))


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def binding_triples(mgmt: Any, vhost: str) -> Sequence[tuple[str, str, str]]:
    return sorted((b["source"], b["destination"], b["routing_key"]) for b in mgmt.bindings(vhost) if b["source"])


async def applied_app(
    settings: BrokerSettings, tmp_path: Path, topology: str, name: str, unapplied: str = "", url: str | None = None
) -> App:
    """An App named ``name`` over ``topology`` (TOML text), the topology applied first in ``settings``' vhost.

    ``unapplied``: more TOML the app knows but the broker does not (never applied);
    ``url``: the app's broker URL (default ``settings.url``).
    """
    path = tmp_path / f"{name}.toml"
    path.write_text(topology)
    await apply_topology(path, settings)
    if unapplied:
        path = tmp_path / f"{name}-app.toml"
        path.write_text(topology + unapplied)
    return App(name, topology=path, url=url or settings.url)


async def depth(settings: BrokerSettings, queue: str) -> int:
    """Exact number of ready messages in ``queue`` (passive declare; no stats lag)."""
    async with raw_channel(settings) as ch:
        declared = await ch.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0


async def depth_at_least(settings: BrokerSettings, queue: str, count: int) -> bool:
    """Whether ``queue`` holds ``count`` ready messages or more (a predicate for :func:`wait_until_async`)."""
    return await depth(settings, queue) >= count


async def drain(settings: BrokerSettings, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take every message out of ``queue`` (acking), returning them in order."""
    out = []
    async with raw_channel(settings) as ch:
        q = await ch.get_queue(queue, ensure=False)
        while (msg := await q.get(fail=False)) is not None:
            await msg.ack()
            out.append(msg)
    return out


@contextmanager
def consume_subprocess(
    app_ref: str, env: dict[str, str], args: Sequence[str], log: Path, *, terminate: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """``amqpjobs consume APP_REF ARGS`` run from the project root with ``env`` over ``os.environ``, its output
    appended to ``log``. Afterwards one still running is killed (``terminate``: SIGTERM first, killed after 30 s)."""
    exe = Path(sys.executable).with_name("amqpjobs")
    with process_running([str(exe), "consume", app_ref, *args], {**os.environ, **env}, log, terminate=terminate) as p:
        yield p


@contextmanager
def process_running(
    command: Sequence[str], env: dict[str, str], log: Path, *, terminate: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """``command`` run from the project root with exactly ``env``, stdout and stderr appended to ``log``.

    Afterwards one still running is killed (``terminate``: SIGTERM first, killed after 30 s).
    """
    with log.open("a") as out:
        proc = subprocess.Popen(list(command), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                (proc.terminate if terminate else proc.kill)()
            try:
                proc.wait(30 if terminate else 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextmanager
def fresh_database(base: str, prefix: str = "t") -> Iterator[str]:
    """A PostgreSQL database made for one test on the server of ``base`` (a URL); its URL, dropped after."""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{random.randrange(10**9)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def effects_database(base: str) -> Iterator[str]:
    """:func:`fresh_database` with an ``effects`` table (``job_id``, no unique constraint: a side effect run
    twice shows as two rows); its URL."""
    import psycopg

    with fresh_database(base) as url:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("CREATE TABLE effects (job_id TEXT NOT NULL)")
        yield url


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole at once (a temporary file, then a rename).

    A worker process still starting may be reading ``path`` while the test writes it again for
    the next one: a plain rewrite truncates it first, and the worker read an empty topology
    ("declares nothing") and exited (CI run 14: the kill -9 chaos test's restarted worker).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def capture_content_headers(monkeypatch: Any) -> list[bytes]:
    """From now on, the payload of every content-header frame this process receives, in order, as raw bytes.

    Wraps ``pamqp.frame.unmarshal`` (through ``monkeypatch``, undone after the test): the
    bytes as the broker sent them, before any decoding of ours.
    """
    import struct

    import pamqp.frame
    from pamqp import header

    frames: list[bytes] = []
    original: Callable[[bytes], Any] = pamqp.frame.unmarshal

    def capture(data: bytes) -> Any:
        result = original(data)
        if isinstance(result[2], header.ContentHeader):
            (size,) = struct.unpack(">I", data[3:7])
            frames.append(bytes(data[7 : 7 + size]))
        return result

    monkeypatch.setattr(pamqp.frame, "unmarshal", capture)
    return frames


async def until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Return once ``predicate()`` is true (polled every 10 ms); fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(0.01)


def note(job_id: str, **props: Any) -> aio_pika.Message:
    """A message of job ``note`` with body ``{}`` (JSON), ``message_id`` ``job_id`` and ``props`` (aio-pika's)."""
    return aio_pika.Message(b"{}", message_id=job_id, type="note", content_type="application/json", **props)


async def header_runs(
    settings: BrokerSettings,
    tmp_path: Path,
    messages: Sequence[aio_pika.Message],
    read: Callable[[JobContext], T],
    topology: str | None = None,
) -> dict[str, T]:
    """``{job id: read(ctx)}`` of job ``note`` run once for each of ``messages`` (see :func:`note`).

    The header tests' set-up: ``topology`` (default :func:`~tests.topologies.work_topology`) applied,
    the messages published as a foreign publisher does (raw, to exchange ``jobs``, routing key ``work``,
    mandatory), then a worker in this event loop until every job ran once or 10 s passed (then the dict holds fewer:
    the caller's equality says which never ran). The app is closed after.
    """
    app = await applied_app(settings, tmp_path, topology or work_topology(), "app")
    seen: dict[str, T] = {}

    @app.job("note", queue="work")
    async def record(payload: dict[str, Any], ctx: JobContext) -> None:
        seen[ctx.job_id] = read(ctx)

    async with raw_channel(settings) as ch:
        exchange = await ch.get_exchange("jobs")
        for message in messages:
            await exchange.publish(message, routing_key="work", mandatory=True)
    try:
        async with running_worker(app, settings):
            for _ in range(200):
                if len(seen) == len(messages):
                    break
                await asyncio.sleep(0.05)
    finally:
        await app.close()
    return seen


async def stalled_stretch(settings: BrokerSettings, proc: subprocess.Popen[Any], queue: str, first: int) -> tuple[
    int, int, float
]:  # fmt: skip
    """Once ``queue`` holds ``first``, stop mover ``proc`` (SIGSTOP) for 3 s, then go on (SIGCONT) for about 1 s:
    ``queue``'s depth at the stop's end and after that second, and the seconds between the two reads."""
    await wait_until_async(lambda: depth_at_least(settings, queue, first), 30, f"some moved to {queue}")
    proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(3)  # 3 s worth of moves lost
    before = await depth(settings, queue)  # stopped: nothing moves while this is read
    resumed = time.monotonic()
    proc.send_signal(signal.SIGCONT)
    await asyncio.sleep(1)
    return before, await depth(settings, queue), time.monotonic() - resumed
