"""A Node.js publisher (amqplib) that knows amqpjobs only from ``amqpjobs asyncapi`` (issue 20).

``tests/node/wire_publisher.cjs`` reads the AsyncAPI document, builds a good job and a
malformed one from it (exchange, routing key and shard from the channels, properties from
the operation binding and ``x-amqp-properties``, headers and payload from their schemas),
publishes them with confirms and ``mandatory``, and reads the quarantine evidence back.

Node and npm come from Debian (``scripts/node-deps.sh``, run by ``make test``), amqplib
at the version pinned in ``tests/node/package-lock.json`` into ``.cache/node``. Without
node the test is skipped, except in CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from amqpjobs import App, JobContext
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.asyncapi import asyncapi_document
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import running_worker

# one xdist worker runs the module: scripts/node-deps.sh installs into the checkout's .cache/node
pytestmark = [pytest.mark.broker, pytest.mark.version_independent, pytest.mark.xdist_group("node-publisher")]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "node" / "wire_publisher.cjs"
TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
shards = 2
retry_tiers = ["200ms"]
"""


class Mail(BaseModel):
    to: str
    order_id: int = Field(ge=1)


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """amqplib installed by ``scripts/node-deps.sh``; a skip (a failure in CI) without node."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        reason = "node/npm not installed (Debian: apt-get install nodejs npm, or `make node-deps` as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Node publisher test: {reason}")
        pytest.skip(reason)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "node-deps.sh")], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def node(node_modules: Path, *args: str) -> Any:
    done = subprocess.run(
        ["node", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "NODE_PATH": str(node_modules)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_node_publisher_from_the_asyncapi_document(
    broker: BrokerSettings, tmp_path: Path, node_modules: Path
) -> None:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    await apply_topology(tmp_path / "t.toml", broker)
    app = App("node-test", topology=load_topology(tmp_path / "t.toml").topology, url=broker.url)
    seen: list[tuple[Mail, JobContext]] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        seen.append((payload, ctx))

    doc_path = tmp_path / "asyncapi.json"
    doc_path.write_text(json.dumps(asyncapi_document(app.name, app.app_version, app, app.topology())))
    before = time.time()
    async with running_worker(app, broker, queues=("work",)) as (_, rec):
        sent = node(node_modules, "publish", str(doc_path), broker.url, "mail", "node-good", "acme", "node-bad")
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()

    # the shard the Node publisher picked from the document is the enqueue rule's
    shard = zlib.crc32(b"acme") % 2
    bad_shard = zlib.crc32(b"node-bad") % 2
    assert (sent["good"]["exchange"], sent["good"]["routingKey"]) == ("jobs", f"work.shard-{shard}")
    assert sent["bad"]["routingKey"] == f"work.shard-{bad_shard}"
    assert sent["returned"] == ["node-good-stray"]  # mandatory: a key no channel has comes back
    assert sent["good"]["payload"] == {"to": "node-to", "order_id": 1}
    assert isinstance(sent["good"]["options"]["timestamp"], int)

    ((payload, ctx),) = seen
    assert payload == Mail(to="node-to", order_id=1)
    assert (ctx.job_id, ctx.tenant, ctx.attempt, ctx.queue) == ("node-good", "acme", 1, f"work.shard-{shard}")
    assert ctx.enqueued_at is not None
    assert ctx.enqueued_at.tzinfo == UTC
    assert before - 1 <= ctx.enqueued_at.timestamp() <= time.time()

    (quarantined,) = node(node_modules, "evidence", broker.url, "work.quarantine")
    headers = quarantined["headers"]
    assert quarantined["properties"]["messageId"] == "node-bad"
    assert quarantined["properties"]["type"] == "mail"
    assert abs(quarantined["properties"]["timestamp"] - before) <= 2  # integer seconds, kept on the copy
    assert {k: headers[k] for k in (evidence.REASON, evidence.ERROR_TYPE, evidence.ATTEMPTS, evidence.JOB,
                                    evidence.JOB_ID, evidence.ORIGINAL_QUEUE, envelope.ATTEMPT)} == {
        evidence.REASON: "invalid-payload", evidence.ERROR_TYPE: "pydantic.ValidationError",
        evidence.ATTEMPTS: 0, evidence.JOB: "mail", evidence.JOB_ID: "node-bad",
        evidence.ORIGINAL_QUEUE: f"work.shard-{bad_shard}", envelope.ATTEMPT: 1,
    }  # fmt: skip
    assert envelope.TENANT not in headers  # sent without a tenant: the evidence writes none
    assert sent["bad"]["payload"] == {"to": 12345, "order_id": 1}  # the first required field, wrong type
    assert "to\n  Input should be a valid string" in headers[evidence.ERROR_MESSAGE]
    assert datetime.fromisoformat(headers[evidence.LAST_FAILURE_AT]).tzinfo is not None
