"""Issue 25: payload references and the claim-check rules, without a broker (FilePayloadStore on tmp_path)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from amqpjobs import ConfigurationError, FilePayloadStore, PostgresPayloadStore, S3PayloadStore
from amqpjobs.jobs import envelope
from amqpjobs.jobs.envelope import PAYLOAD_REF, OutgoingMessage
from amqpjobs.jobs.outcome import Ack, Quarantine, RetryLater
from amqpjobs.jobs.payload_refs import PayloadRef, PayloadRefError, parse_ref
from amqpjobs.runtime.payloads import DEFAULT_THRESHOLD, after_outcome, check_in, check_out


@pytest.mark.parametrize(
    ("value", "ref"),
    [("file:abc", PayloadRef("file", "abc")), (b"s3-eu:9f.a_b-c", PayloadRef("s3-eu", "9f.a_b-c")),
     ("postgres:" + "k" * 200, PayloadRef("postgres", "k" * 200))],
)  # fmt: skip
def test_references_parse(value: str | bytes, ref: PayloadRef) -> None:
    assert parse_ref(value) == ref
    assert str(ref) == (value.decode() if isinstance(value, bytes) else value)


@pytest.mark.parametrize(
    ("value", "says"),
    [("file", "no ':' between store and key"), (":abc", "payload store name ''"), ("File:abc", "payload store name"),
     ("file:", "payload key ''"), ("file:../x", "payload key '../x'"), ("file:a/b", "payload key 'a/b'"),
     ("file:.hidden", "payload key '.hidden'"), ("file:" + "k" * 201, "must be 1-200 characters"),
     (42, "is an integer, not"), (None, "is void")],
)  # fmt: skip
def test_malformed_references_name_what_is_wrong(value: object, says: str) -> None:
    with pytest.raises(PayloadRefError) as err:
        parse_ref(value)
    assert err.value.reason == "payload-ref-invalid"
    assert says in err.value.detail


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"name": "Bad Name"}, "payload store name 'Bad Name'"), ({"threshold": -1}, "threshold must be an int"),
     ({"threshold": True}, "threshold must be an int"), ({"grace": "soon"}, "not a duration"),
     ({"sweep_every": 0}, "payload store 'file'")],
)  # fmt: skip
def test_bad_store_settings_are_refused(tmp_path: Path, kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        FilePayloadStore(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_store_defaults_and_names() -> None:
    file, pg, s3 = FilePayloadStore("/x"), PostgresPayloadStore("postgresql://h/db"), S3PayloadStore("b")
    assert (file.name, pg.name, s3.name) == ("file", "postgres", "s3")
    assert file.threshold == DEFAULT_THRESHOLD == 262144
    assert (file.grace, file.sweep_every, FilePayloadStore("/x", grace="90s").grace) == (3600.0, 60.0, 90.0)


async def test_check_in_stores_only_bodies_over_the_threshold(tmp_path: Path) -> None:
    store = FilePayloadStore(tmp_path, threshold=10)
    small = OutgoingMessage(body=b"0123456789", headers={"a": 1})
    same, ref = await check_in(store, small)
    assert same is small
    assert ref is None
    big = OutgoingMessage(body=b"01234567890", headers={"a": 1}, message_id="j1")
    sent, ref = await check_in(store, big)
    assert ref is not None
    assert sent.body == b""
    assert sent.headers == {"a": 1, PAYLOAD_REF: f"file:{ref.key}"}
    assert sent.message_id == "j1"
    assert (tmp_path / "data" / ref.key).read_bytes() == b"01234567890"
    assert await check_out(store, sent.headers) == b"01234567890"
    assert await check_out(store, {"a": 1}) is None


async def test_check_out_reasons(tmp_path: Path) -> None:
    store = FilePayloadStore(tmp_path, name="shared")
    for store_arg, headers, reason in [
        (store, {PAYLOAD_REF: "other:abc"}, "payload-store-unknown"),
        (None, {PAYLOAD_REF: "shared:abc"}, "payload-store-unknown"),
        (store, {PAYLOAD_REF: "shared:abc"}, "payload-missing"),
        (store, {PAYLOAD_REF: "shared"}, "payload-ref-invalid"),
    ]:
        with pytest.raises(PayloadRefError) as err:
            await check_out(store_arg, headers)
        assert err.value.reason == reason


async def test_done_marks_quarantine_unmarks_and_the_sweep_keeps_the_grace(tmp_path: Path) -> None:
    store = FilePayloadStore(tmp_path, grace=60)
    refs = [await store.put(b'{"n":%d}' % i) for i in range(3)]
    done_ref, kept_ref, retried_ref = refs
    await after_outcome(store, {PAYLOAD_REF: str(done_ref)}, Ack(), acked=True)
    await after_outcome(store, {PAYLOAD_REF: str(kept_ref)}, Ack(), acked=True)
    await after_outcome(store, {PAYLOAD_REF: str(kept_ref)}, Quarantine("rejected"), acked=True)  # a later copy
    await after_outcome(store, {PAYLOAD_REF: str(retried_ref)}, RetryLater(tier=0, delay=1.0, next_attempt=2), True)
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == [done_ref.key]
    assert await store.prune(60) == 0  # marked just now: within the grace
    (tmp_path / "done" / done_ref.key).write_text(repr(time.time() - 61))
    assert await store.prune(60) == 1
    assert await store.read(done_ref.key) is None
    assert await store.read(kept_ref.key) == b'{"n":1}'
    assert await store.read(retried_ref.key) == b'{"n":2}'


def test_every_copy_keeps_the_reference() -> None:
    """Retry tier, hand-back/suspect, quarantine, park, replay (and a canary, which is a replay) copies."""
    from amqpjobs.jobs import quarantine as q
    from amqpjobs.jobs.failure import quarantine_headers, retry_headers, unstarted_headers
    from amqpjobs.jobs.outcome import Register

    received = {PAYLOAD_REF: "s3:abc", "x-death": [{"count": 1}], "amqpjobs-attempt": 2}
    now = "2026-11-30T00:00:00.000Z"
    sent = 1_700_000_000  # a foreign publisher's: no amqpjobs-enqueued-at
    quarantined = quarantine_headers(received, "rejected", ("Reject", "no", ""), 1, queue="work", exchange="jobs",
                                     routing_key="work", job="big", job_id="j1", host="h", pid=1, version="1",
                                     app_version="", now=now, timestamp=sent)  # fmt: skip
    item = q.describe(quarantined, "j1", "big")
    copies = {
        "retry": retry_headers(
            received, RetryLater(tier=0, delay=1.0, next_attempt=3), 1, "jobs", "work", now, timestamp=sent
        ),
        "hand-back": unstarted_headers(received, None, "work", "jobs", "work", "h", 1, now, timestamp=sent),
        "suspect": unstarted_headers(received, Register(2), "work", "jobs", "work", "h", 1, now, timestamp=sent),
        "quarantine": quarantined,
        "park": q.park_headers(quarantined, item, now, timestamp=sent),
        "replay": q.replay_headers(quarantined, item, "run-1", timestamp=sent),
    }
    for kind, headers in copies.items():
        assert headers[PAYLOAD_REF] == "s3:abc", kind
        assert "x-death" not in headers, kind
        assert headers[envelope.ENQUEUED_AT] == "2023-11-14T22:13:20.000Z", kind  # the first enqueue, never lost


async def test_a_store_that_hangs_is_a_store_error_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from amqpjobs.runtime import payloads

    store = FilePayloadStore(tmp_path)
    ref = await store.put(b"{}")

    async def hang(key: str) -> bytes:
        await asyncio.sleep(60)
        return b""

    monkeypatch.setattr(store, "read", hang)
    monkeypatch.setattr(payloads, "STORE_TIMEOUT", 0.05)
    with pytest.raises(PayloadRefError) as err:
        await store.get(ref)
    assert err.value.reason == "payload-store-error"
    assert "TimeoutError: no answer within 0.05s" in err.value.detail


async def test_the_in_memory_double_runs_jobs_with_stored_payloads(tmp_path: Path) -> None:
    """amqpjobs.testing: an app with a payload store enqueues by reference and its jobs see the payload."""
    from datetime import UTC, datetime

    from amqpjobs import App, JobContext, Reject
    from amqpjobs.testing import TestBroker
    from amqpjobs.topology.loader import load_topology

    (tmp_path / "t.toml").write_text('[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n')
    store = FilePayloadStore(tmp_path / "payloads", threshold=10)
    app = App("t", topology=load_topology(tmp_path / "t.toml").topology, payload_store=store)
    seen: list[str] = []

    @app.job("echo", queue="work")
    async def echo(payload: dict[str, str], ctx: JobContext) -> None:
        seen.append(payload["text"])
        if payload["text"].startswith("bad"):
            raise Reject("no")

    async with TestBroker(app, start=datetime(2026, 11, 30, tzinfo=UTC)) as broker:
        await app.enqueue("echo", {"text": "a long enough text"})
        await app.enqueue("echo", {"text": "bad and long enough"})
        await broker.drain()
        assert sorted(seen) == ["a long enough text", "bad and long enough"]
        [quarantined] = broker.quarantine("work")
        assert quarantined.headers[PAYLOAD_REF].startswith("file:")
        assert len(list((tmp_path / "payloads" / "data").iterdir())) == 2
        assert len(list((tmp_path / "payloads" / "done").iterdir())) == 1  # the success's mark; the sweep is a worker's


@pytest.mark.parametrize(
    ("store", "got"),
    [("/mnt/payloads", "got a str"), (FilePayloadStore, "got the class FilePayloadStore itself: create one"),
     ({"root": "/x"}, "got a dict")],
    ids=["a-path", "the-class", "a-dict"],
)  # fmt: skip
def test_an_app_refuses_a_payload_store_of_the_wrong_type(store: object, got: str) -> None:
    from amqpjobs import App

    with pytest.raises(ConfigurationError) as err:
        App("t", payload_store=store)  # type: ignore[arg-type]
    says = str(err.value)
    assert says.startswith("App(payload_store=...) must be a payload store")
    assert got in says
    assert "FilePayloadStore('/mnt/shared/payloads')" in says  # what to give instead


@pytest.mark.parametrize(
    ("value", "got"),
    [("16MiB", "got '16MiB', a str"), (0, "got 0"), (-1, "got -1"), (True, "got True, a bool"),
     (1.5e6, "got 1500000.0, a float")],
    ids=["a-str", "zero", "negative", "a-bool", "a-float"],
)  # fmt: skip
def test_an_app_refuses_a_max_message_size_that_is_no_count_of_bytes(value: object, got: str) -> None:
    """Was taken as given: '16MiB' failed every enqueue with a TypeError, 0 meant the broker's default, -1
    refused every message as too large, True let through 1 byte."""
    from amqpjobs import App

    with pytest.raises(ConfigurationError) as err:
        App("t", max_message_size=value)  # type: ignore[arg-type]
    says = str(err.value)
    assert says.startswith("App(max_message_size=...) must be a whole number of bytes >= 1"), says
    assert got in says
    assert "16 * 1024 * 1024" in says  # how to write 16 MiB
    assert App("t", max_message_size=16 * 1024 * 1024).max_message_size == 16 * 1024 * 1024


@pytest.mark.parametrize("root", ["", "   ", Path("")])
def test_a_file_store_refuses_an_empty_root(root: str | Path) -> None:
    with pytest.raises(ConfigurationError, match=r"FilePayloadStore\(root=\.\.\.\) is empty"):
        FilePayloadStore(root)


@pytest.mark.parametrize("bucket", ["", " "])
def test_an_s3_store_refuses_an_empty_bucket(bucket: str) -> None:
    with pytest.raises(ConfigurationError, match=r"S3PayloadStore\(bucket=\.\.\.\) is empty"):
        S3PayloadStore(bucket)


@pytest.mark.parametrize(
    ("dsn", "says"),
    [("mysql://u:s3cret@h/db", "scheme 'mysql'"), ("amqp://guest:s3cret@h:5672/", "scheme 'amqp'"),
     ("", "is empty"), ("  ", "is empty"), ("just-a-hostname", "not a URL")],
)  # fmt: skip
def test_a_postgres_store_refuses_a_dsn_that_is_not_postgresql(dsn: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        PostgresPayloadStore(dsn)
    message = str(err.value)
    assert "PostgresPayloadStore(dsn=...)" in message
    assert says in message
    assert "postgresql://user:password@host:5432/dbname" in message  # the fix
    assert "s3cret" not in message  # never the password


@pytest.mark.parametrize("dsn", ["postgresql://h/db", "postgres://u:p@h:5432/db", "host=h dbname=db user=u"])
def test_a_postgres_store_takes_urls_and_keyword_strings(dsn: str) -> None:
    assert PostgresPayloadStore(dsn).dsn == dsn


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [("grace", -1, "-1 must be a positive, finite duration"), ("grace", float("nan"), "nan must be"),
     ("grace", float("inf"), "inf must be"), ("grace", "soon", "'soon' is not a duration"),
     ("sweep_every", "-5s", "'-5s' must be a positive"), ("sweep_every", 0, "0 must be a positive")],
)  # fmt: skip
def test_bad_grace_or_sweep_every_names_the_argument(option: str, value: object, says: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        FilePayloadStore("/x", **{option: value})  # type: ignore[arg-type]
    assert f"payload store 'file': {option}: " in str(err.value)
    assert says in str(err.value)
