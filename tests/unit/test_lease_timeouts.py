"""A job given ``lease=`` and no ``timeout`` gets a timeout its own lease covers: no start-up warning, none to chase.

helper-231: the README's example (``lease="2m"``, a plain function) warned at every start that
its claim could expire under a run past its timeout (60 s, half the lease) and asked for a
lease of 125 s; that lease made the timeout 62.5 s and asked for 127.5 s, and so on. The
derived timeout of a plain function is now at most the lease less what its thread may go on
past the timeout (two graces) and the margin, so the rule the warning checks holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.worker_config import WorkerOptions, check_worker, lease_warnings
from amqpjobs.topology.loader import load_topology

pytestmark = pytest.mark.version_independent
TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\nretry_tiers = ["1s"]\n'


def make_app(tmp_path: Path, lease: str) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    app = App("d", topology=load_topology(path).topology, ledger=SqliteLedger(tmp_path / "ledger.db"))

    @app.job("charge", queue="work", idempotent=True, lease=lease)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None: ...

    @app.job("notify", queue="work", idempotent=True, lease=lease)
    async def notify(payload: dict[str, Any], ctx: JobContext) -> None: ...

    return app


@pytest.mark.parametrize(
    ("lease", "grace", "plain", "coroutine"),
    [
        ("2m", 30.0, 55.0, 60.0),  # the README's example, the default grace: 120 - 2 x 30 - 5; async: half
        ("125s", 30.0, 60.0, 62.5),
        ("10m", 30.0, 300.0, 300.0),  # half the lease is the lower one
        ("2m", 5.0, 60.0, 60.0),
    ],
)
def test_the_timeout_a_lease_gives_leaves_no_warning(
    tmp_path: Path, lease: str, grace: float, plain: float, coroutine: float
) -> None:
    app = make_app(tmp_path, lease)
    options = WorkerOptions(queues=("work",), grace=grace)
    _, timeouts = check_worker(app, options)
    assert (timeouts["charge"], timeouts["notify"]) == (plain, coroutine)
    assert lease_warnings(app, timeouts, grace) == []


@pytest.mark.parametrize(("lease", "timeout", "needed"), [("60s", 30.0, 95.0), ("70s", 35.0, 100.0)])
def test_a_lease_too_short_for_the_grace_still_warns_naming_the_lease_it_needs(
    tmp_path: Path, lease: str, timeout: float, needed: float
) -> None:
    """60 s leaves nothing past two graces of 30 s and the margin, 70 s leaves 5 s: not a timeout to impose."""
    app = make_app(tmp_path, lease)
    _, timeouts = check_worker(app, WorkerOptions(queues=("work",), grace=30.0))
    assert timeouts["charge"] == timeout  # half the lease, and the warning says so
    [line] = lease_warnings(app, timeouts, 30.0)
    assert f"give it lease= at least {needed:g}s" in line, line
