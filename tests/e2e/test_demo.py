"""The README's first command: ``make demo`` runs ``examples/demo.py``; run it the same way and check its figures.

It runs on the test broker (README "Tests": ``AMQP_URL``, testcontainers or the local node),
passed with ``--url``, as ``make demo`` would use the local node.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import BrokerRoot

ROOT = Path(__file__).resolve().parents[2]

# the demo runs against the suite's broker (demo.py --url); one broker version is enough
pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.mark.serial  # asserts the demo's total time < 40 s: not beside other tests
@pytest.mark.timeout(180)
def test_demo_runs_every_job_exactly_once_and_quarantines_the_poison(broker_root: BrokerRoot):
    vhost = f"amqpjobs-demo-e2e-{uuid.uuid4().hex[:8]}"  # never the vhost of a `make demo` running beside us
    settings = broker_root.settings
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--cleanup",
            "--url",
            settings.with_vhost(vhost).url,  # the vhost as a user gives it: the URL's path (no --vhost)
            "--management-url",
            settings.management_url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed (exit {proc.returncode}):\n{out}\n{proc.stderr}"
    assert out.startswith("amqpjobs demo: ")
    assert f"[1/6] broker {settings.with_vhost(vhost).safe_url} " in out  # the test's broker, not a node of its own
    for line in (
        "orders.confirm      200/200",
        "orders.sync_crm      20/20",
        "reports.daily        20/20",
        "payments.capture     20/20",
        "retried: 20 orders.sync_crm jobs failed on attempt 1 (ConnectionError), 20 succeeded on attempt 2",
        "quarantined: 5 ",
        "emails: 200 received by the SMTP sink, for 200 distinct orders",
        "duplicates: 0 (side effects recorded twice) + 0 orders e-mailed twice",
        "worker: SIGTERM -> drained in-flight jobs and exited with code 0",
        "RESULT: OK: all 261 jobs done or quarantined with a reason, no side effect ran twice",
    ):
        assert line in out, f"{line!r} missing from the demo's output:\n{out}"
    reasons = {
        (queue, reason): int(n)
        for queue, reason, n in re.findall(r"^ {4}(\w+\.quarantine) +([\w-]+) +(\d+) ", out, re.MULTILINE)
    }
    assert reasons == {
        ("urgent.quarantine", "undecodable"): 1,
        ("urgent.quarantine", "invalid-payload"): 1,
        ("urgent.quarantine", "unknown-job"): 1,
        ("urgent.quarantine", "unsupported-content-type"): 1,
        ("billing.quarantine", "rejected"): 1,
    }
    folder = vhost.replace(".", "%2E")  # "." and ".." must not name a folder of their own: none has a dot here
    assert f"; work folder .demo/{folder} (the shop's database, the worker's log)" in out  # replaced by the next run
    assert not (ROOT / ".demo" / folder).exists()  # --cleanup
    assert "guest:guest" not in out + proc.stderr  # credentials are never printed
    seconds = float(re.search(r"total time: ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    assert seconds < 40
