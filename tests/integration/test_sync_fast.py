"""The sync publisher's fast path on the real broker: what the calling thread publishes is ``App.enqueue``'s.

README "Enqueueing" (from synchronous code): once the app is connected and the broker's alarms
are known, ``sync_publisher().enqueue`` publishes from the calling thread on a blocking
connection of its own (``amqpjobs/runtime/sync_fast.py``, ``amqpjobs/wire/blocking.py``). These
tests hold that path to the async enqueue's promises: the same message on the queue, the same
errors for the same refusals, a connection the broker closed or left idle replaced before a
publish (never an uncertain error for it), one connection per call at once, all closed at the end.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from amqpjobs import App
from amqpjobs.errors import MessageTooLargeError, QueueFullError, UnroutableError
from amqpjobs.runtime.sync_publisher import SyncPublisher
from amqpjobs.wire.blocking import BlockingPublisher
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, depth, drain, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"

[[job_queue]]
name = "other"
exchange = "jobs"

[[job_queue]]
name = "capped"
exchange = "jobs"
max_length = 1
"""
UNAPPLIED = '\n[[exchange]]\nname = "later"\n\n[[job_queue]]\nname = "unapplied"\nexchange = "later"\n'


async def make(broker: BrokerSettings, tmp_path: Path, url: str | None = None) -> App:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "fast", unapplied=UNAPPLIED, url=url)
    app.job("work", queue="work")(lambda p, c: None)
    app.job("other", queue="other")(lambda p, c: None)
    app.job("cap", queue="capped")(lambda p, c: None)
    app.job("early", queue="unapplied")(lambda p, c: None)
    return app


def fast_calls(pub: SyncPublisher) -> int:
    assert pub._fast is not None
    return pub._fast.calls


def connects(pub: SyncPublisher) -> list[int]:
    assert pub._fast is not None
    return [one.connects for one in pub._fast.connections()]


def warm(pub: SyncPublisher) -> None:
    """The first enqueue connects the app (the async path) and reads the alarms; the next ones are fast."""
    pub.enqueue("other", {"warm": True})


async def test_the_calling_thread_publishes_what_enqueue_publishes(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    await app.enqueue("work", {"n": 0}, job_id="by-async", tenant="acme", headers={"note": "a"})
    await app.close()

    def publish() -> tuple[int, list[int]]:
        with app.sync_publisher() as pub:
            warm(pub)
            for n in range(1, 21):
                pub.enqueue("work", {"n": n}, job_id=f"by-sync-{n}", tenant="acme", headers={"note": "a"})
            return fast_calls(pub), connects(pub)

    calls, opened = await asyncio.to_thread(publish)
    assert calls == 20
    assert opened == [1]
    got = await drain(broker, "work")
    assert [m.message_id for m in got] == ["by-async", *(f"by-sync-{n}" for n in range(1, 21))]
    first, fast = got[0], got[1]
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "type", "app_id", "expiration"):
        assert getattr(fast, name) == getattr(first, name), name
    assert sorted(fast.headers) == sorted(first.headers)
    assert fast.headers["note"] == "a"
    assert fast.headers["amqpjobs-tenant"] == first.headers["amqpjobs-tenant"] == "acme"
    assert fast.body == b'{"n":1}' or fast.body.replace(b" ", b"") == b'{"n":1}'


async def test_an_enqueue_without_options_is_filled_in_from_the_jobs_stencil(broker: BrokerSettings, tmp_path: Path):
    """No priority, tenant or headers: the properties come from the job's stencil, as App.enqueue's would be."""
    app = await make(broker, tmp_path)
    started = time.time()
    await app.enqueue("work", {"n": 0, "x": 1.5, "s": "é"})
    await app.close()

    def publish() -> tuple[list[str], int, dict[str, Any]]:
        with app.sync_publisher() as pub:
            warm(pub)
            ids = [pub.enqueue("work", {"n": n, "x": 1.5, "s": "é"}) for n in range(1, 11)]
            assert pub._fast is not None
            return ids, fast_calls(pub), dict(pub._fast._stencils)

    ids, calls, stencils = await asyncio.to_thread(publish)
    assert calls == 10
    assert stencils["work"] is not None  # the path under test was taken
    got = await drain(broker, "work")
    assert [m.message_id for m in got[1:]] == ids
    assert len({m.message_id for m in got}) == 11
    assert all(uuid.UUID(one).version == 4 for one in ids)
    first = got[0]
    for n, fast in enumerate(got[1:], start=1):
        for name in ("content_type", "content_encoding", "delivery_mode", "priority", "type", "app_id", "expiration",
                     "correlation_id", "reply_to"):  # fmt: skip
            assert getattr(fast, name) == getattr(first, name), name
        assert fast.priority == 0
        assert sorted(fast.headers) == sorted(first.headers) == ["amqpjobs-attempt", "amqpjobs-enqueued-at"]
        assert fast.headers["amqpjobs-attempt"] == 1
        assert fast.timestamp is not None
        sent = fast.timestamp.timestamp()
        assert int(started) <= sent <= time.time()
        enqueued = datetime.fromisoformat(str(fast.headers["amqpjobs-enqueued-at"]).replace("Z", "+00:00"))
        assert int(enqueued.timestamp()) == sent  # the same time, to the second the timestamp property holds
        assert fast.body == f'{{"n":{n},"x":1.5,"s":"é"}}'.encode()
    assert first.body == '{"n":0,"x":1.5,"s":"é"}'.encode()


async def test_refusals_on_the_fast_path_are_enqueues_refusals(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)

    def publish() -> tuple[list[str], int, list[int]]:
        seen = []
        with app.sync_publisher() as pub:
            warm(pub)
            with pytest.raises(UnroutableError, match="exchange 'later' does not exist: apply the topology"):
                pub.enqueue("early", {})
            with pytest.raises(MessageTooLargeError, match="over the connection's frame_max of 131072 bytes"):
                pub.enqueue("work", {}, headers={"note": "x" * 140_000})
            seen.append(pub.enqueue("cap", {}, job_id="first"))  # the channel the 404 closed was replaced
            with pytest.raises(QueueFullError, match="work queue 'capped' is full: the broker nacked job 'second'"):
                pub.enqueue("cap", {}, job_id="second")
            seen.append(pub.enqueue("work", {}, job_id="after"))
            return seen, fast_calls(pub), connects(pub)

    seen, calls, opened = await asyncio.to_thread(publish)
    assert seen == ["first", "after"]
    assert calls == 5  # each on the fast path (the too-large one refused before anything was written)
    assert opened == [1]  # a 404 closes the channel only
    assert await depth(broker, "capped") == 1
    assert [m.message_id for m in await drain(broker, "work")] == ["after"]


async def test_a_publish_with_no_queue_bound_is_unroutable(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    vhost = quote(broker.vhost, safe="")
    with ManagementClient(broker) as mgmt:
        (binding,) = [b for b in mgmt.request("GET", f"/exchanges/{vhost}/jobs/bindings/source")
                      if b["destination"].startswith("other")]  # fmt: skip
        mgmt.request("DELETE", f"/bindings/{vhost}/e/jobs/q/{quote(binding['destination'], safe='')}/"
                               f"{quote(binding['properties_key'], safe='')}")  # fmt: skip

    def publish() -> int:
        with app.sync_publisher() as pub:
            pub.enqueue("work", {})  # connects, reads the alarms (async path)
            with pytest.raises(UnroutableError, match="unroutable: no queue is bound to exchange 'jobs'"):
                pub.enqueue("other", {}, job_id="lost")
            pub.enqueue("work", {}, job_id="next")
            return fast_calls(pub)

    assert await asyncio.to_thread(publish) == 2
    assert [m.message_id for m in await drain(broker, "work")][-1] == "next"


def blocking_connections(broker: BrokerSettings) -> list[str]:
    """The names of the sync publisher's blocking connections the management API lists in the test's vhost.

    The test's own: tests running beside it (pytest -n) have connections of that name in their vhosts.
    """
    with ManagementClient(broker) as mgmt:
        return [c["name"] for c in mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
                if (c.get("client_properties") or {}).get("connection_name") == "fast-sync-publisher"]  # fmt: skip


async def test_a_connection_the_broker_closed_between_calls_is_replaced(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)

    def publish() -> tuple[list[int], list[int]]:
        with app.sync_publisher() as pub:
            warm(pub)
            pub.enqueue("work", {}, job_id="before")
            before = connects(pub)
            deadline = time.monotonic() + 15
            while not (names := blocking_connections(broker)) and time.monotonic() < deadline:
                time.sleep(0.2)
            with ManagementClient(broker) as mgmt:
                for name in names:
                    mgmt.request("DELETE", f"/connections/{quote(name, safe='')}")
            time.sleep(0.3)  # the broker's connection.close is on its way (or read already)
            pub.enqueue("work", {}, job_id="after")  # the alarms are a second old by now: read again (async path)
            calls = fast_calls(pub)
            pub.enqueue("work", {}, job_id="again")
            assert fast_calls(pub) == calls + 1
            return before, connects(pub)

    before, after = await asyncio.to_thread(publish)
    assert before == [1]
    assert after == [2]
    assert [m.message_id for m in await drain(broker, "work")] == ["before", "after", "again"]


async def test_a_connection_idle_for_half_its_heartbeat_is_replaced(broker: BrokerSettings, tmp_path: Path):
    url = broker.url + ("&" if "?" in broker.url else "?") + "heartbeat=2"
    app = await make(broker, tmp_path, url=url)

    def publish() -> tuple[list[int], list[int], int]:
        with app.sync_publisher() as pub:
            warm(pub)
            pub.enqueue("work", {}, job_id="one")
            before = connects(pub)
            time.sleep(1.2)  # past half the heartbeat (and the alarms' age: the next call reads them again)
            pub.enqueue("work", {}, job_id="two")
            pub.enqueue("work", {}, job_id="three")
            return before, connects(pub), fast_calls(pub)

    before, after, calls = await asyncio.to_thread(publish)
    assert before == [1]
    assert after == [2]
    assert calls >= 2
    assert [m.message_id for m in await drain(broker, "work")] == ["one", "two", "three"]


async def test_threads_share_a_pool_and_close_closes_every_connection(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    ids: list[str] = []
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def publish() -> tuple[int, int]:
        with app.sync_publisher() as pub:
            warm(pub)

            def one_thread(t: int) -> None:
                start.wait()
                try:
                    ids.extend(pub.enqueue("work", {"t": t}, job_id=f"t{t}-{i}") for i in range(50))
                except BaseException as exc:  # the assertion names it
                    failures.append(exc)

            threads = [threading.Thread(target=one_thread, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            return len(connects(pub)), fast_calls(pub)

    pooled, calls = await asyncio.to_thread(publish)
    assert failures == []
    assert 1 <= pooled <= 4
    assert calls >= 150  # the alarms are read again each second: a call may take the async path then
    assert sorted(str(m.message_id) for m in await drain(broker, "work")) == sorted(ids)
    assert len(ids) == 200

    await wait_until(lambda: not blocking_connections(broker), 10, "the sync publisher's blocking connections closed")


async def test_a_blocking_connection_that_cannot_open_leaves_the_call_to_the_async_path(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make(broker, tmp_path)

    def publish() -> tuple[list[str], int, bool]:
        with app.sync_publisher() as pub:
            warm(pub)
            assert pub._fast is not None
            # a node that refuses (nothing listens on port 1): the blocking connect fails, the enqueue still goes out
            pub._fast._settings = replace(broker, url=broker.url.replace(f":{urlsplit(broker.url).port}/", ":1/"))
            sent = [pub.enqueue("work", {}, job_id="via-loop")]
            retry_later = pub._fast._down_until > time.monotonic()
            sent.append(pub.enqueue("work", {}, job_id="still-via-loop"))  # not tried again for 5 s
            return sent, fast_calls(pub), retry_later

    sent, calls, retry_later = await asyncio.to_thread(publish)
    assert sent == ["via-loop", "still-via-loop"]
    assert calls == 0
    assert retry_later
    assert [m.message_id for m in await drain(broker, "work")] == sent


async def test_a_call_interrupted_while_it_waits_leaves_no_answer_for_the_next(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    app = await make(broker, tmp_path)
    vhost = quote(broker.vhost, safe="")
    with ManagementClient(broker) as mgmt:  # "other" unroutable: its return and confirm come after the interrupt
        (binding,) = [b for b in mgmt.request("GET", f"/exchanges/{vhost}/jobs/bindings/source")
                      if b["destination"].startswith("other")]  # fmt: skip
        mgmt.request("DELETE", f"/bindings/{vhost}/e/jobs/q/{quote(binding['destination'], safe='')}/"
                               f"{quote(binding['properties_key'], safe='')}")  # fmt: skip
    confirm = BlockingPublisher._confirm

    def interrupted(self: BlockingPublisher, tag: int, deadline: float) -> None:
        monkeypatch.setattr(BlockingPublisher, "_confirm", confirm)
        raise KeyboardInterrupt  # as a signal handler's exception would, after the frames went out

    def publish() -> tuple[str, list[int]]:
        with app.sync_publisher() as pub:
            pub.enqueue("work", {}, job_id="warm")
            monkeypatch.setattr(BlockingPublisher, "_confirm", interrupted)
            with pytest.raises(KeyboardInterrupt):
                pub.enqueue("other", {}, job_id="interrupted")
            return pub.enqueue("work", {}, job_id="next"), connects(pub)

    sent, opened = await asyncio.to_thread(publish)
    assert sent == "next"
    assert opened == [2]  # the interrupted call's connection was dropped, not pooled with its answer pending
    assert [m.message_id for m in await drain(broker, "work")] == ["warm", "next"]


async def test_a_forked_child_leaves_the_parents_connections_alone(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the alarms read counts as fresh for a minute here: the fork and the child's wait took over the 1 s of
    # REFRESH under CI's load, and "parent-2" then went the async path by that rule, not the fork's
    # (local CI 60 on a 2-core AMD VM: 'assert (1, 1) == (2, 1)')
    from amqpjobs.runtime import sync_fast

    monkeypatch.setattr(sync_fast, "REFRESH", 60.0)
    app = await make(broker, tmp_path)

    def publish() -> tuple[int, int]:
        with app.sync_publisher() as pub:
            warm(pub)
            pub.enqueue("work", {}, job_id="parent-1")
            assert pub._fast is not None
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the fast path steps aside (the parent's pooled socket is not its own)
                answer = pub._fast.enqueue("work", {}, "child", None, None, None)
                os.write(write, b"none" if answer is None else b"sent")
                os._exit(0)
            os.waitpid(pid, 0)
            assert os.read(read, 4) == b"none"
            pub.enqueue("work", {}, job_id="parent-2")
            return fast_calls(pub), len(connects(pub))

    calls, pooled = await asyncio.to_thread(publish)
    assert (calls, pooled) == (2, 1)
    assert [m.message_id for m in await drain(broker, "work")] == ["parent-1", "parent-2"]


async def test_the_alarm_read_ahead_begins_once_the_calling_threads_publish_is_answered(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """As the async gate's (test_enqueue_write_queue.py): the read's thread does not compete with the publish."""
    app = await make(broker, tmp_path)
    events: list[str] = []
    for name in ("publish", "publish_encoded"):
        real = getattr(BlockingPublisher, name)

        def publishing(self: BlockingPublisher, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            events.append("publish")
            try:
                return _real(self, *args, **kwargs)
            finally:
                events.append("answered")

        monkeypatch.setattr(BlockingPublisher, name, publishing)

    def publish() -> tuple[int, list[str]]:
        with app.sync_publisher() as pub:
            warm(pub)  # the async path: alarms read
            assert pub._fast is not None
            gate = pub._fast._app._gate  # the app bound to the publisher's loop
            assert gate is not None
            read_alarms = gate._management_alarms

            def reading() -> list[str]:
                events.append("read")
                return read_alarms()

            gate._management_alarms = reading  # type: ignore[method-assign]
            events.clear()
            time.sleep(0.6)  # older than half a second: the next call has them read again on the loop
            pub.enqueue("work", {}, job_id="a")
            deadline = time.monotonic() + 3
            while "read" not in events and time.monotonic() < deadline:
                time.sleep(0.01)
            pub.enqueue("work", {}, job_id="b")  # read just now: no read
            time.sleep(0.1)
            return fast_calls(pub), list(events)

    calls, seen = await asyncio.to_thread(publish)
    assert calls == 2
    assert seen == ["publish", "answered", "read", "publish", "answered"]
    assert [m.message_id for m in await drain(broker, "work")] == ["a", "b"]


def _connection_names(broker: BrokerSettings) -> list[str]:
    with ManagementClient(broker) as mgmt:
        found = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
    return sorted(str((c.get("client_properties") or {}).get("connection_name")) for c in found)


async def test_the_sync_publishers_connections_are_named_apart_from_the_apps(broker: BrokerSettings, tmp_path: Path):
    """README "Enqueueing": the app's own ``fast-publisher``; the sync publisher's ``fast-sync-publisher-thread``
    (on its thread) and ``fast-sync-publisher`` (each blocking one).

    Before, the sync publisher's asyncio connection (its first call, and any the fast path leaves) was named
    ``fast-publisher`` too: two connections alike in the management UI, and the app's one not to be told apart."""
    app = await make(broker, tmp_path)
    await app.enqueue("work", {"n": 0})

    def publish() -> list[str]:
        with app.sync_publisher() as pub:
            warm(pub)  # the async path: its own connection
            pub.enqueue("work", {"n": 1})  # the fast path: a blocking connection
            deadline = time.monotonic() + 10
            while len(names := _connection_names(broker)) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)  # the management API lists a connection a moment after it opened
            return names

    try:
        names = await asyncio.to_thread(publish)
    finally:
        await app.close()
    assert names == ["fast-publisher", "fast-sync-publisher", "fast-sync-publisher-thread"], names
