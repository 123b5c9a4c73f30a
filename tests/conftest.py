"""Test fixtures: a real broker for every test that asks, each test in its own vhost.

Where the broker comes from, in order:
1. ``AMQP_URL`` (and optionally ``AMQP_MANAGEMENT_URL``) when set;
2. a testcontainers RabbitMQ when a Docker engine answers ``docker info``;
3. otherwise the project's local node, started by ``scripts/broker.sh up`` (RabbitMQ 3.10),
   with ``AMQPJOBS_TEST_BROKER=4`` by ``scripts/broker4.sh up`` (RabbitMQ 4.0.x in a chroot), or
   with ``AMQPJOBS_TEST_BROKER=43`` by ``scripts/broker43.sh up`` (RabbitMQ 4.3.x in a chroot).
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from amqpjobs.errors import AmqpJobsError
from amqpjobs.runtime.logs import TextFormatter
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings

ROOT = Path(__file__).resolve().parent.parent
BROKER_SCRIPTS = {
    "3": ROOT / "scripts" / "broker.sh",
    "4": ROOT / "scripts" / "broker4.sh",
    "43": ROOT / "scripts" / "broker43.sh",
}
#: Which local node the tests start when neither AMQP_URL nor Docker is there: "3" (3.10), "4" (4.0) or "43" (4.3).
TEST_BROKER_ENV = "AMQPJOBS_TEST_BROKER"
#: How many serial tests may run side by side (``make test`` sets 3 for the ones that stop no shared node).
SERIAL_BESIDE_ENV = "AMQPJOBS_TEST_SERIAL_BESIDE"


@dataclass(frozen=True)
class BrokerRoot:
    """The broker under test, at its default vhost."""

    settings: BrokerSettings
    source: str  # "env", "testcontainers", "local" or "other-checkout" (another checkout's node on our ports)
    version: tuple[int, ...]
    script: Path | None = None

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run rabbitmqctl against the broker (local node only)."""
        if self.source != "local" or self.script is None:
            pytest.skip("rabbitmqctl is only reachable for the project's local node")
        return subprocess.run(
            ["bash", str(self.script), "ctl", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )


def _docker_usable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand out the tests marked ``slow`` (a minute or more each) first.

    Started last, one of them would keep one process busy after the others ran out of tests.
    Every process sorts the same way (xdist requires the same order everywhere).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse pytest 9.2+ with pytest-xdist 3.8 or older under ``-n``: ``xdist_group`` would be ignored (see below)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
        return
    xdist = metadata.version("pytest-xdist")
    if _release(pytest.__version__) >= (9, 2) and _release(xdist) <= (3, 8):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist} ignores xdist_group (tests that share a "
            "fixed-port fixture would run in parallel): `make install` installs the pinned pytest<9.2"
        )


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, refuse to run when pytest-xdist did not tag the ``xdist_group`` tests.

    pytest-xdist sends the tests of one group to one process by appending ``@group`` to their
    node ids; pytest 9.2 made the node id read-only (pytest-xdist 3.8 still writes ``_nodeid``),
    so the groups were silently ignored and the cluster, TLS and Node tests ran in parallel
    against the same fixed ports. pyproject pins ``pytest<9.2`` for that; this check says so
    instead of letting the shared fixtures fight.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(session.config.option, "loadgroup", False):
        return
    untagged = [
        item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if untagged:
        raise pytest.UsageError(  # a worker's error is not shown: the run ends with an INTERNALERROR
            f"pytest-xdist ignored xdist_group for {len(untagged)} test(s), e.g. {untagged[0]} "
            f"(pytest {pytest.__version__}): install the versions pyproject's dev extra pins (make install)"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``serial`` needs the node or the cores to itself: skip it beside other tests (saying why).

    ``make test`` runs the suite in pytest-xdist processes with ``-m "not serial"``, then
    ``-m serial`` in one process (README "Tests": writing parallel-safe tests). The serial
    tests that stop no shared node (the ones run on one broker version only) it runs in
    ``AMQPJOBS_TEST_SERIAL_BESIDE`` (3) processes, as many as the three suites' serial halves
    it runs side by side: that many are allowed under ``-n``.
    """
    beside = int(os.environ.get(SERIAL_BESIDE_ENV, "1"))
    if item.get_closest_marker("serial") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > beside:
        pytest.skip("marked serial (needs the node or the cores to itself): run it alone, `pytest -m serial`, no -n")


def _local_node(script: Path) -> BrokerSettings:
    """The project's node of ``script``, started when it does not answer.

    Under pytest-xdist every process asks at once: a node that answers is used as it is, and
    ``up`` runs in one process at a time (a file lock), since concurrent ``up`` runs rewrote the
    chroot node's config and plugins together and one failed (CI: the 4.0 suite ended before
    its first test). A failure fails the tests with the script's output (``pytest.exit`` in an
    xdist process loses its message).
    """
    urls = subprocess.run(["bash", str(script), "url"], capture_output=True, text=True, timeout=60)
    amqp, mgmt = urls.stdout.strip().splitlines()[-2:]
    settings = broker_settings(amqp, mgmt)
    with open(Path(tempfile.gettempdir()) / f"amqpjobs-{script.stem}-up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(settings):
            return settings
        out = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        message = f"{script.name} up failed:\n{out.stdout}\n{out.stderr}"
        if os.environ.get("PYTEST_XDIST_WORKER"):
            pytest.fail(message)
        pytest.exit(message, returncode=3)
    return settings


def _started_here(script: Path) -> bool:
    """Whether ``script``'s node was started by this checkout (``status`` says up, not "not started by this checkout").

    Another checkout's node answering on the same ports is used, but never stopped or restarted:
    the tests that restart the project's node skip there, saying so.
    """
    status = subprocess.run(["bash", str(script), "status"], capture_output=True, text=True, timeout=60)
    return status.stdout.startswith("up (") and "not started by this checkout" not in status.stdout


def _answers(settings: BrokerSettings) -> bool:
    try:
        with ManagementClient(settings) as client:
            client.broker_version()
    except AmqpJobsError:
        return False
    return True


@pytest.fixture(scope="session")
def broker_root() -> Iterator[BrokerRoot]:
    """The broker for the whole session (see the module docstring for where it comes from)."""
    url = os.environ.get("AMQP_URL")
    container = None
    script: Path | None = None
    if url:
        settings = broker_settings(url, os.environ.get("AMQP_MANAGEMENT_URL"))
        source = "env"
    elif _docker_usable():
        from testcontainers.rabbitmq import RabbitMqContainer

        container = RabbitMqContainer("rabbitmq:4.3-management").with_exposed_ports(15672)
        container.start()
        host = container.get_container_host_ip()
        settings = broker_settings(
            f"amqp://guest:guest@{host}:{container.get_exposed_port(5672)}/",
            f"http://{host}:{container.get_exposed_port(15672)}",
        )
        source = "testcontainers"
    else:
        which = os.environ.get(TEST_BROKER_ENV, "3")
        if which not in BROKER_SCRIPTS:
            pytest.exit(f"{TEST_BROKER_ENV}={which!r}: use 3 (RabbitMQ 3.10), 4 (4.0) or 43 (4.3)", returncode=2)
        script = BROKER_SCRIPTS[which]
        settings = _local_node(script)
        source = "local" if _started_here(script) else "other-checkout"
    with ManagementClient(settings) as mgmt_client:
        version = mgmt_client.broker_version()
    try:
        yield BrokerRoot(settings, source, version, script)
    finally:
        if container is not None:
            container.stop()


@pytest.fixture(autouse=True)
def _log_levels_as_before() -> Iterator[None]:
    """Undo the log levels an in-process CLI call set (``-v``: the amqpjobs logger at DEBUG).

    They outlived the test and changed the next one in the same process: the client
    libraries' failover lines are shown at DEBUG (``amqpjobs.wire.cluster``), so a test
    asserting they are hidden failed when it ran after a ``-v`` test.
    """
    root, ours = logging.getLogger(), logging.getLogger("amqpjobs")
    levels = root.level, ours.level
    yield
    root.setLevel(levels[0])
    ours.setLevel(levels[1])


@pytest.fixture
def broker(broker_root: BrokerRoot, request: pytest.FixtureRequest) -> Iterator[BrokerSettings]:
    """Settings for a fresh vhost of the test broker, deleted after the test."""
    vhost = f"test-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
    with ManagementClient(broker_root.settings) as mgmt:
        mgmt.create_vhost(vhost)
        try:
            yield broker_root.settings.with_vhost(vhost)
        finally:
            mgmt.delete_vhost(vhost)


@pytest.fixture
def mgmt(broker: BrokerSettings) -> Iterator[ManagementClient]:
    """A management API client for the test's broker."""
    with ManagementClient(broker) as client:
        yield client


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A PostgreSQL database: DATABASE_URL, else the project's own cluster (scripts/postgres.sh)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "up"], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        pytest.fail(f"scripts/postgres.sh up failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """The worker's plain-text log, as ``amqpjobs consume`` writes it (``amqpjobs`` loggers at INFO)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("amqpjobs")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
