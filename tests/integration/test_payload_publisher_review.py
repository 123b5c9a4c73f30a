"""Second review of issue 25 on the broker: how long a full queue waited, what a purge marked, a 401's cause."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aio_pika
import pytest

from amqpjobs import FilePayloadStore, QueueFullError
from amqpjobs.errors import ManagementApiError
from amqpjobs.jobs import envelope
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import cli, raw_channel
from tests.integration.test_backpressure import make_app as bounded_app
from tests.integration.test_payload_store import app_module
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_queue_full_says_how_long_it_waited(broker: BrokerSettings, tmp_path: Path):
    app = await bounded_app(broker, tmp_path, queue_full_wait="1s")
    try:
        for i in range(3):
            await app.enqueue("ok", {}, job_id=f"j{i}")
        await asyncio.sleep(1.05)  # the gate reads the queue's figures at most once a second
        with pytest.raises(QueueFullError) as refused:
            await app.enqueue("ok", {}, job_id="over")
    finally:
        await app.close()
    assert refused.value.waited >= 1.0
    assert "still full after waiting 1." in str(refused.value)
    assert "(queue_full_wait 1s)" in str(refused.value)
    app = await bounded_app(broker, tmp_path)  # queue_full_wait 0: refused at once, and it says so
    try:
        await asyncio.sleep(1.05)
        with pytest.raises(QueueFullError) as at_once:
            await app.enqueue("ok", {}, job_id="over-2")
    finally:
        await app.close()
    assert at_once.value.waited == 0.0
    assert "not waited: App(queue_full_wait=...) is 0" in str(at_once.value)


async def _publish(broker: BrokerSettings, queue: str, job_id: str, ref: str) -> None:
    async with raw_channel(broker) as channel:
        message = aio_pika.Message(b"", headers={envelope.PAYLOAD_REF: ref}, message_id=job_id, type="big")
        await channel.default_exchange.publish(message, routing_key=queue)


async def test_purge_with_the_app_counts_the_payloads_it_marked(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    await make_app(broker, tmp_path)
    store = FilePayloadStore(tmp_path / "payloads")
    one, two, kept = [await store.put(envelope.encode_payload({"n": n})) for n in range(3)]
    for job_id, ref in (("a", one), ("b", two), ("c", kept), ("d", one)):  # d: a second copy naming one
        await _publish(broker, "work.quarantine", job_id, str(ref))
    await _publish(broker, "work.parked", "e", str(kept))  # still names kept: spared
    app_ref = app_module(tmp_path, f"FilePayloadStore({str(tmp_path / 'payloads')!r})", monkeypatch)
    out = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.quarantine", "--yes", "--app", app_ref)
    assert out.exit_code == 0, out.output
    assert "purged 4 message(s) from work.quarantine; 0 left" in out.stdout
    assert "marked 2 stored payload(s) for deletion after the store's grace" in out.stdout, out.stdout
    assert "1 still named by a message left" in out.stdout, out.stdout
    assert sorted(p.name for p in (tmp_path / "payloads" / "done").iterdir()) == sorted([one.key, two.key])


async def test_purge_counts_only_the_marks_it_made_and_names_the_payloads_already_gone(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    await make_app(broker, tmp_path)
    store = FilePayloadStore(tmp_path / "payloads")
    there, gone = [await store.put(envelope.encode_payload({"n": n})) for n in range(2)]
    await store.remove(gone.key)  # a sweep (or a person) took it already
    for job_id, ref in (("a", there), ("b", gone)):
        await _publish(broker, "work.quarantine", job_id, str(ref))
    app_ref = app_module(tmp_path, f"FilePayloadStore({str(tmp_path / 'payloads')!r})", monkeypatch)
    out = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.quarantine", "--yes", "--app", app_ref)
    assert out.exit_code == 0, out.output
    assert "purged 2 message(s) from work.quarantine; 0 left" in out.stdout
    assert (
        "marked 1 stored payload(s) for deletion after the store's grace (3600s); 0 still named by a message left; "
        "1 already gone (nothing to mark)\n"
    ) in out.stdout, out.stdout
    assert [p.name for p in (tmp_path / "payloads" / "done").iterdir()] == [there.key]


def test_a_401_for_a_user_without_the_management_tag_says_so(broker: BrokerSettings):
    user = f"notag-{uuid.uuid4().hex[:8]}"
    with ManagementClient(broker) as admin:
        admin.request("PUT", f"/users/{user}", json={"password": "pw-sekret", "tags": ""})
    try:
        host = broker.management_url.split("@", 1)[-1].split("//", 1)[-1]
        amqp_host = broker.url.split("@", 1)[1].split("/", 1)[0]
        settings = broker_settings(f"amqp://{user}:pw-sekret@{amqp_host}/", f"http://{user}:pw-sekret@{host}")
        with ManagementClient(settings) as mgmt, pytest.raises(ManagementApiError) as refused:
            mgmt.request("GET", "/overview")
        wrong = broker_settings(f"amqp://{user}:nope@{amqp_host}/", f"http://{user}:nope@{host}")
        with ManagementClient(wrong) as mgmt, pytest.raises(ManagementApiError) as bad_password:
            mgmt.request("GET", "/overview")
    finally:
        with ManagementClient(broker) as admin:
            admin.request("DELETE", f"/users/{user}", allow_404=True)
    message = str(refused.value)
    assert refused.value.status == 401
    assert "management tag" in message, message
    assert "check the user and password" not in message  # not a password, its tag
    assert "pw-sekret" not in message
    assert "check the user and password in the URL" in str(bad_password.value)
