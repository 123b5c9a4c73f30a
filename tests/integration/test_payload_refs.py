"""Issue 25: bad payload references, a quarantined copy that keeps its stored payload, and purges that retire them.

The rules do not depend on the store: a shared directory (FilePayloadStore) stands for all three.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import FilePayloadStore, JobContext, Reject
from amqpjobs.jobs import envelope, evidence
from amqpjobs.runtime.parking import park
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, drain, raw_channel
from tests.integration.test_payload_store import GRACE, SWEEP, app_module, app_with, wait_gone
from tests.integration.worker_env import running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def publish_raw(broker: BrokerSettings, job_id: str, headers: dict[str, Any], body: bytes = b"") -> None:
    """A job message for 'big' as another publisher would send it, straight to the work queue."""
    async with raw_channel(broker) as channel:
        message = aio_pika.Message(body, headers=headers, message_id=job_id, type="big",
                                   content_type="application/json", delivery_mode=2)  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")


@pytest.mark.parametrize("with_store", [True, False])
async def test_bad_or_foreign_references_are_quarantined_with_a_reason_never_dropped(
    broker: BrokerSettings, tmp_path: Path, with_store: bool
):
    store = FilePayloadStore(tmp_path / "payloads") if with_store else None
    app = await app_with(broker, tmp_path, store)
    ran: list[str] = []

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    cases = {
        "no-colon": ("file-abc", "payload-ref-invalid", "no ':' between store and key"),
        "path": ("file:../../etc/passwd", "payload-ref-invalid", "payload key '../../etc/passwd' must be"),
        "not-text": (42, "payload-ref-invalid", "header amqpjobs-payload-ref is an integer"),
        "foreign": ("s3-elsewhere:abc123", "payload-store-unknown", "names store 's3-elsewhere'"),
        "unknown-key": ("file:0123abcd", "payload-missing", "holds no payload '0123abcd'"),
    }
    retries = 0
    if store is not None:  # a store that fails to read: retried through the 3 tiers, then quarantined
        (tmp_path / "payloads" / "data" / "a-directory").mkdir(parents=True)
        cases["unreadable"] = ("file:a-directory", "payload-store-error", "failed to read 'a-directory'")
        retries = 3
        # the next step is in the evidence: what the operator can do about a missing payload
        cases["unknown-key"] = ("file:0123abcd", "payload-missing", "enqueue the job again with its payload")
        cases["gone"] = ("file:4567cdef", "payload-missing", "--reason payload-missing")
        # a stored payload that is not a JSON object: the message says it is the stored payload, and what is wrong
        latin1, text = await store.put(b"caf\xe9"), await store.put(b"not json")
        cases["latin1"] = (str(latin1), "undecodable", f"stored payload '{latin1}' is not UTF-8")
        cases["not-json"] = (str(text), "undecodable", f"stored payload '{text}' is not JSON: Expecting value")
    else:  # a worker without a store can't read any reference: unknown store, says how to fix
        cases["foreign"] = ("s3-elsewhere:abc123", "payload-store-unknown", "this app has no payload store")
        cases["unknown-key"] = ("file:0123abcd", "payload-store-unknown", "give it one (App(payload_store=...))")
    for job_id, (ref, _, _) in cases.items():
        await publish_raw(broker, job_id, {envelope.PAYLOAD_REF: ref}, body=b'{"decoy": true}')
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == len(cases) + retries)
    assert [o.kind for o in rec.outcomes].count("retried") == retries
    assert ran == []  # the decoy body is never run in place of the stored payload
    quarantined = {m.message_id: m for m in await drain(broker, "work.quarantine")}
    assert set(quarantined) == set(cases)  # every one kept
    for job_id, (ref, reason, says) in cases.items():
        headers = quarantined[job_id].headers
        assert headers[evidence.REASON] == reason, job_id
        assert says in str(headers[evidence.ERROR_MESSAGE]), (job_id, headers[evidence.ERROR_MESSAGE])
        assert headers[envelope.PAYLOAD_REF] == ref  # kept as sent: a replay after the fix can read it
        assert quarantined[job_id].body == b'{"decoy": true}'
    await app.close()


async def test_a_quarantined_copy_keeps_its_payload_past_the_grace_and_purge_spares_a_payload_still_named(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    source = f"FilePayloadStore({str(tmp_path / 'payloads')!r}, grace={GRACE}, sweep_every={SWEEP})"
    store = FilePayloadStore(tmp_path / "payloads", grace=GRACE, sweep_every=SWEEP)
    app = await app_with(broker, tmp_path, store)

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        if ctx.job_id.startswith("bad"):
            raise Reject("no")

    shared = await store.put(envelope.encode_payload({"n": 1}))  # one payload, two copies (a lost ack's redelivery)
    parked = await store.put(envelope.encode_payload({"n": 2}))
    async with running_worker(app, broker) as (_, rec):
        await publish_raw(broker, "bad-2", {envelope.PAYLOAD_REF: str(parked)})
        await rec.wait_for(lambda o: [x.kind for x in o] == ["quarantined"])
        assert (await park(broker, "work")).taken == 1
        await publish_raw(broker, "ok-1", {envelope.PAYLOAD_REF: str(shared)})
        await rec.wait_for(lambda o: [x.kind for x in o] == ["quarantined", "succeeded"])
        await publish_raw(broker, "bad-1", {envelope.PAYLOAD_REF: str(shared)})
        await rec.wait_for(lambda o: [x.kind for x in o] == ["quarantined", "succeeded", "quarantined"])
        await asyncio.sleep(GRACE + 3 * SWEEP)  # the worker sweeps meanwhile
        assert await store.read(shared.key) == b'{"n":1}'  # its done mark went when the copy was quarantined
        assert await store.read(parked.key) == b'{"n":2}'

    # a forged copy naming the same payload waits in the parked queue: purging quarantine leaves the payload alone
    async with raw_channel(broker) as channel:
        forged = aio_pika.Message(b"", headers={envelope.PAYLOAD_REF: str(shared)}, message_id="forged", type="big")
        await channel.default_exchange.publish(forged, routing_key="work.parked")
    done = tmp_path / "payloads" / "done"
    ref = app_module(tmp_path, source, monkeypatch)
    out = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work", "--yes", "--app", ref)
    assert out.exit_code == 0, out.output
    assert "purged 1 message(s) from work.quarantine; 0 left" in out.stdout
    assert await store.read(shared.key) == b'{"n":1}'  # the forged parked copy still names it
    assert sorted(p.name for p in done.iterdir()) == []  # not even marked
    out = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.parked", "--yes", "--app", ref)
    assert "purged 2 message(s) from work.parked; 0 left" in out.stdout
    # nothing names them now: marked done, deleted by a worker's sweep after the grace (not at once)
    assert sorted(p.name for p in done.iterdir()) == sorted([shared.key, parked.key])
    assert await store.read(parked.key) == b'{"n":2}'
    async with running_worker(app, broker):
        await wait_gone(store, shared.key, GRACE + 10)
        await wait_gone(store, parked.key, GRACE + 10)
    assert sorted(p.name for p in (tmp_path / "payloads" / "data").iterdir()) == []
    await app.close()


async def test_show_json_says_what_is_wrong_with_each_stored_payload(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``quarantine show --json``: ``stored_payload_problem`` on every message that names a stored payload."""
    source = f"FilePayloadStore({str(tmp_path / 'payloads')!r})"
    store = FilePayloadStore(tmp_path / "payloads")
    app = await app_with(broker, tmp_path, store)
    good, latin1, array = await store.put(b'{"n": 1}'), await store.put(b"caf\xe9"), await store.put(b"[1]")
    refs = {"good": str(good), "latin1": str(latin1), "array": str(array), "missing": "file:0123abcd"}
    async with raw_channel(broker) as channel:
        for job_id, ref in refs.items():
            message = aio_pika.Message(b"", headers={envelope.PAYLOAD_REF: ref}, message_id=job_id, type="big",
                                       content_type="application/json")  # fmt: skip
            await channel.default_exchange.publish(message, routing_key="work.quarantine")
        await channel.default_exchange.publish(aio_pika.Message(b'{"small": 1}', message_id="inline", type="big"),
                                               routing_key="work.quarantine")  # fmt: skip
    module = app_module(tmp_path, source, monkeypatch)
    out = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json", "--app", module)
    assert out.exit_code == 0, out.output
    docs = {d["message_id"]: d for d in map(json.loads, out.stdout.splitlines())}
    problems = {job_id: d.get("stored_payload_problem") for job_id, d in docs.items()}
    assert problems["good"] == ""
    assert docs["good"]["payload"] == {"n": 1}
    assert problems["latin1"].startswith(f"undecodable: stored payload '{latin1}' is not UTF-8: ")
    assert problems["array"] == f"invalid-payload: stored payload '{array}' must be a JSON object, got list"
    assert problems["missing"].startswith("payload-missing: payload store 'file' holds no payload '0123abcd'")
    assert "enqueue the job again with its payload" in problems["missing"]
    assert problems["inline"] is None  # no stored payload: no key
    assert docs["inline"]["payload"] == {"small": 1}
    assert [docs[j]["payload"] for j in ("latin1", "array", "missing")] == [None, None, None]

    # the text form says the same; without --app every reference says how to read it
    text = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--app", module)
    assert f"payload:    (stored, not readable) undecodable: stored payload '{latin1}' is not UTF-8" in text.stdout
    plain = await asyncio.to_thread(cli, broker, "quarantine", "show", "work", "--json")
    unread = {d["message_id"]: d.get("stored_payload_problem") for d in map(json.loads, plain.stdout.splitlines())}
    assert unread == {j: "not read: give --app MODULE:APP to read it from the app's payload store" for j in refs} | {
        "inline": None
    }
    await app.close()


@pytest.mark.parametrize("kind", ["file", "postgres"])
async def test_purge_with_a_store_it_cannot_open_purges_nothing_and_exits_3(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
):
    """`--app` whose store can't be opened: before, the messages were purged (exit 0), the payloads never marked."""
    (tmp_path / "not-a-dir").write_text("a regular file where the store's root should be")
    source = {
        "file": f"FilePayloadStore({str(tmp_path / 'not-a-dir')!r})",
        "postgres": "PostgresPayloadStore('postgresql://amqpjobs:WRONG@127.0.0.1:5442/amqpjobs')",
    }[kind]
    app = await app_with(broker, tmp_path, None)

    @app.job("big", queue="work")
    async def big(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    async with running_worker(app, broker) as (_, rec):
        await publish_raw(broker, "bad-1", {envelope.PAYLOAD_REF: "file:0123abcd"}, body=b"{}")
        await rec.wait_for(lambda o: [x.kind for x in o] == ["quarantined"])
    ref = app_module(tmp_path, source, monkeypatch)
    out = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work", "--yes", "--app", ref)
    assert out.exit_code == 3, out.output
    assert f"payload store {kind!r} can't be opened" in out.output, out.output
    assert "nothing was purged" in out.output
    assert "WRONG" not in out.output  # never the password
    assert [m.message_id for m in await drain(broker, "work.quarantine")] == ["bad-1"]
