"""Rate limits' pure rules: parsing, the token grid and expirations, queue names (README "Flow control")."""

from __future__ import annotations

import bisect
import random
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from amqpjobs import App, JobContext
from amqpjobs.errors import ConfigurationError, TopologyError
from amqpjobs.jobs.rate import (
    HOLD_FRACTION,
    RateLimit,
    first_tick,
    next_tick,
    parse_rate_limit,
    tick_time,
    token_expiration,
)
from amqpjobs.runtime.rate_status import rate_findings, rated_jobs
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.models import JobQueueSpec, Topology
from amqpjobs.topology.naming import QueueName, parse_queue_name, rate_queue_names
from amqpjobs.topology.orphans import orphan_queues
from amqpjobs.topology.rate_queues import rate_declarations
from amqpjobs.wire.arguments import queue_arguments
from amqpjobs.wire.lock import LockHolder


@pytest.mark.parametrize(
    ("text", "count", "period", "interval"),
    [("10/s", 10, 1.0, 0.1), ("30/m", 30, 60.0, 2.0), ("500/h", 500, 3600.0, 7.2), ("1/h", 1, 3600.0, 3600.0),
     ("100/s", 100, 1.0, 0.01)],
)  # fmt: skip
def test_parse_rate_limit(text: str, count: int, period: float, interval: float) -> None:
    rate = parse_rate_limit(text)
    assert (rate.count, rate.period) == (count, period)
    assert rate.interval == pytest.approx(interval)
    assert str(rate) == text.replace(" ", "")


@pytest.mark.parametrize(
    "text",
    ["10", "10/d", "0/s", "-1/s", "1.5/s", "ten/s", "10/sec", "", "10/S", "/s", "10/ s", " 10/s", "10/s\n",
     "010/s", "\uff11\uff10/s", "1\u00a0/s", "+1/s", "1_0/s", " 1 / h "],
)  # fmt: skip
def test_a_bad_rate_limit_names_the_value_and_the_forms(text: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_rate_limit(text, "sms")
    message = str(caught.value)
    assert f"job 'sms': rate_limit {text!r} is not a rate" in message
    assert "'<count>/s', '<count>/m' or '<count>/h'" in message


def test_a_rate_just_above_100_per_second_shows_its_exact_value() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_rate_limit("360001/h")
    assert "rate_limit '360001/h' is 360001 starts an hour (100.00027777777778 a second); at most 100/s" in str(
        caught.value
    )


def test_a_rate_above_100_per_second_is_refused_naming_the_maximum() -> None:
    with pytest.raises(ConfigurationError, match=r"rate_limit '101/s' is 101 starts a second; at most 100/s"):
        parse_rate_limit("101/s")
    with pytest.raises(ConfigurationError, match="at most 100/s"):
        parse_rate_limit("6001/m")
    assert parse_rate_limit("6000/m").per_second == 100


def test_the_decorator_takes_a_rate_limit_and_refuses_a_bad_one() -> None:
    app = App("t")
    app.job("sms", queue="work", rate_limit="10/s")(lambda p, c: None)
    assert app.resolve("sms").rate_limit == RateLimit(10, 1.0, "10/s")
    assert app.resolve(app.job("plain", queue="work")(lambda p, c: None)).rate_limit is None
    with pytest.raises(ConfigurationError, match=r"job 'bad': rate_limit '10 per second' is not a rate"):
        app.job("bad", queue="work", rate_limit="10 per second")
    with pytest.raises(ConfigurationError, match="characters the AMQP client refuses"):
        app.job("sms\u00e9", queue="work", rate_limit="1/s")  # goes into queue names


def test_tokens_are_on_an_absolute_grid_and_expire_half_an_interval_after_their_time() -> None:
    rate = parse_rate_limit("10/s")
    k = first_tick(rate, 1000.03)
    assert tick_time(rate, k) == pytest.approx(1000.1)
    assert first_tick(rate, 1000.1) == k  # exactly on a tick: that one
    assert token_expiration(rate, k, 1000.1) == pytest.approx(0.05)  # on time: half an interval
    assert token_expiration(rate, k, 1000.13) == pytest.approx(0.02)  # late: less
    assert token_expiration(rate, k, 1000.16) < 0  # too late: skipped
    assert next_tick(rate, k, 1000.1) == k + 1
    # a publisher late by 0.33 s skips the tokens already too late, keeps the one still good
    assert tick_time(rate, next_tick(rate, k, 1000.43)) == pytest.approx(1000.4)


def test_n_plus_one_at_most_in_any_period() -> None:
    """Starts come within 3/4 of an interval of their token's time (broker 1/2, worker 1/4): N + 1 in any period."""
    rate = parse_rate_limit("10/s")
    k0 = first_tick(rate, 5000.0)
    # the worst case: one token used as late as it may be, the next ten at once
    latest = rate.interval * (0.5 + HOLD_FRACTION)
    worst = [tick_time(rate, k0) + latest - 1e-6] + [tick_time(rate, k) for k in range(k0 + 1, k0 + 40)]
    assert most_in_one_second(worst) == 11
    chance = random.Random(28)
    for _ in range(20):
        starts = [tick_time(rate, k) + chance.uniform(0, latest) for k in range(k0, k0 + 300)]
        assert most_in_one_second(sorted(starts)) <= 11


def most_in_one_second(starts: list[float]) -> int:
    return max(bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts))


def test_rate_queue_names_parse_back_and_are_no_orphans() -> None:
    names = rate_queue_names("work", "mail.send.quarantine")
    assert (names.waiting, names.tokens, names.emitter) == (
        "work.rate-waiting.mail.send.quarantine", "work.rate-tokens.mail.send.quarantine",
        "work.rate-emitter.mail.send.quarantine",
    )  # fmt: skip
    assert parse_queue_name(names.waiting) == QueueName("waiting", "work", job="mail.send.quarantine")
    assert parse_queue_name(names.tokens) == QueueName("tokens", "work", job="mail.send.quarantine")
    assert parse_queue_name(names.emitter) == QueueName("emitter", "work", job="mail.send.quarantine")
    assert parse_queue_name("work.rate-waiting.a.retry.5s").kind == "waiting"  # the job's name, not a tier
    topology = load_topology_text('[[exchange]]\nname = "jobs"\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n')
    assert orphan_queues(topology.layouts(), [names.waiting, names.tokens, names.emitter]) == []


def load_topology_text(text: str) -> Topology:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.toml"
        path.write_text(text)
        return load_topology(path).topology


def test_a_job_queue_named_with_a_rate_marker_is_refused() -> None:
    with pytest.raises(TopologyError, match=r"'a.rate-waiting.b' holds '.rate-waiting.', which marks a rate-limited"):
        load_topology_text('[[exchange]]\nname = "jobs"\n[[job_queue]]\nname = "a.rate-waiting.b"\nexchange = "jobs"\n')


def test_the_rate_queues_follow_the_job_queue_and_hold_one_token() -> None:
    classic, tokens = rate_declarations(JobQueueSpec(name="work", exchange="jobs"), "sms").queues
    assert queue_arguments(classic) == {"x-queue-type": "classic", "x-dead-letter-exchange": "work.quarantine"}
    assert queue_arguments(tokens) == {"x-queue-type": "classic", "x-max-length": 1, "x-overflow": "drop-head"}
    quorum, _ = rate_declarations(JobQueueSpec(name="work", exchange="jobs", type="quorum"), "sms").queues
    assert queue_arguments(quorum) == {
        "x-queue-type": "quorum", "x-dead-letter-exchange": "work.quarantine", "x-dead-letter-strategy":
        "at-least-once", "x-delivery-limit": 10, "x-overflow": "reject-publish",
    }  # fmt: skip


async def test_the_in_memory_double_runs_a_rate_limited_job_without_a_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[exchange]]\nname = "jobs"\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n')
    app = App("t", topology=load_topology(path).topology)
    seen: list[str] = []

    @app.job("sms", queue="work", rate_limit="1/h")
    async def sms(payload: dict[str, str], ctx: JobContext) -> None:
        seen.append(ctx.queue)

    async with TestBroker(app) as broker:
        for _ in range(3):
            await app.enqueue("sms", {})
        done = await broker.drain()
    assert (seen, [p.kind for p in done]) == (["work"] * 3, ["succeeded"] * 3)


@dataclass
class Figures:
    name: str
    exists: bool = True
    ready: int = 0
    unacked: int = 0
    consumers: int = 0


def test_status_finds_rate_limited_jobs_by_their_waiting_rooms_and_names_their_emitter() -> None:
    holder = LockHolder("token emitter of job sms at 10/s", "web-1", 4242, datetime(2026, 12, 1, 5, 0, tzinfo=UTC))
    live = {
        "work": {}, "work.rate-waiting.sms": {}, "work.rate-tokens.sms": {},
        "work.rate-emitter.sms": {"arguments": holder.arguments()}, "work.rate-waiting.push": {},
        "work.rate-tokens.push": {},
        "other.rate-waiting.sms": {},
    }  # fmt: skip
    rated = rated_jobs("work", live)
    assert [(r.job, r.waiting, r.emitter) for r in rated] == [
        ("push", "work.rate-waiting.push", None),
        ("sms", "work.rate-waiting.sms", "token emitter of job sms at 10/s (pid 4242 on web-1, since "
                 "2026-12-01T05:00:00Z)"),
    ]  # fmt: skip
    assert [(r.tokens, r.missing) for r in rated] == [("work.rate-tokens.push", ()), ("work.rate-tokens.sms", ())]
    figures = {"work.rate-waiting.sms": Figures("work.rate-waiting.sms", ready=3, consumers=0),
               "work.rate-waiting.push": Figures("work.rate-waiting.push", unacked=2, consumers=1)}  # fmt: skip
    problems, notes = rate_findings(rated, figures.__getitem__)
    assert problems == [
        "no worker mints the tokens of rate-limited job 'push': 2 job(s) wait in work.rate-waiting.push",
        "no worker takes from waiting room work.rate-waiting.sms: 3 job(s) of 'sms' wait",
    ]
    assert notes[1] == (
        "job 'sms' is rate-limited: 3 job(s) in waiting room work.rate-waiting.sms; tokens minted by token emitter "
        "of job sms at 10/s (pid 4242 on web-1, since 2026-12-01T05:00:00Z)"
    )
    assert notes[0].endswith("; no worker mints its tokens")


def test_a_paused_job_queue_s_idle_waiting_room_is_a_note_not_a_problem() -> None:
    """An operator's pause stops the waiting rooms too (README "Pause and resume"): no consumer is what was asked."""
    from amqpjobs.runtime.rate_status import RatedJob

    rated = [RatedJob("sms", "work.rate-waiting.sms", None, "work.rate-tokens.sms", "10/s", None, (), (), None)]
    figures = {"work.rate-waiting.sms": Figures("work.rate-waiting.sms", ready=38, consumers=0)}
    problems, notes = rate_findings(rated, figures.__getitem__, paused=True)
    assert problems == []
    assert "38 job(s) in waiting room work.rate-waiting.sms" in notes[0]
    assert "paused: no worker takes from it until resume" in notes[0]
    problems, _ = rate_findings(rated, figures.__getitem__)
    assert problems == ["no worker takes from waiting room work.rate-waiting.sms: 38 job(s) of 'sms' wait"]


def test_a_lock_holder_carries_details_in_its_arguments() -> None:
    since = datetime(2026, 12, 1, 5, 0, tzinfo=UTC)
    holder = LockHolder("token emitter of job sms at 10/s", "web-1", 4242, since, (("rate", "10/s"),))
    assert holder.arguments()["amqpjobs-lock-rate"] == "10/s"
    assert LockHolder.from_arguments(holder.arguments()) == holder
    assert LockHolder.from_arguments(holder.arguments()).detail("rate") == "10/s"  # type: ignore[union-attr]
    plain = LockHolder("replay", "web-1", 1, since)
    assert (LockHolder.from_arguments(plain.arguments()), plain.detail("rate")) == (plain, None)


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "yesterday"])
def test_a_lock_holder_whose_since_no_datetime_holds_in_utc_is_no_holder(since: str) -> None:
    """Whoever declared the lock queue wrote a time whose UTC is out of range: unknown holder, not an OverflowError."""
    plain = LockHolder("replay", "web-1", 1, datetime(2026, 12, 1, 5, 0, tzinfo=UTC))
    assert LockHolder.from_arguments({**plain.arguments(), "amqpjobs-lock-since": since}) is None


def test_status_reads_the_minters_rate_each_workers_rate_and_missing_rate_queues() -> None:
    since = datetime(2026, 12, 1, 5, 0, tzinfo=UTC)
    holder = LockHolder("token emitter of job sms at 1/h", "web-1", 4242, since, (("rate", "1/h"),))
    live = {
        "work.rate-waiting.sms": {}, "work.rate-emitter.sms": {"arguments": holder.arguments()},
        "work.rate-tokens.push": {},  # push's waiting room was deleted by hand
    }  # fmt: skip
    consumers = {
        "work.rate-waiting.sms": {
            "consumer_details": [
                {"arguments": {"amqpjobs-rate": "1/h"}},
                {"arguments": {"amqpjobs-rate": "2/h"}},
                {"arguments": {}},
            ]
        }
    }
    now = datetime(2026, 12, 1, 5, 40, tzinfo=UTC).timestamp()
    rated = rated_jobs("work", live, consumers, now)
    push, sms = rated
    assert (push.job, push.missing, push.rate, push.minter) == ("push", ("work.rate-waiting.push",), None, None)
    assert (sms.job, sms.missing, sms.rate, sms.worker_rates) == ("sms", ("work.rate-tokens.sms",), "1/h",
                                                                  ("1/h", "2/h"))  # fmt: skip
    assert sms.minter == {"host": "web-1", "pid": 4242, "since": "2026-12-01T05:00:00+00:00"}
    assert sms.next_token_at == "2026-12-01T06:00:00.000Z"
    assert sms.to_json() == {
        "job": "sms", "waiting_room": "work.rate-waiting.sms", "token_queue": "work.rate-tokens.sms",
        "minter": {"host": "web-1", "pid": 4242, "since": "2026-12-01T05:00:00+00:00"}, "rate": "1/h",
        "worker_rates": ["1/h", "2/h"], "missing": ["work.rate-tokens.sms"],
        "next_token_at": "2026-12-01T06:00:00.000Z",
    }  # fmt: skip
    figures = {n: Figures(n, exists=n in live, ready=1, consumers=1) for n in ("work.rate-waiting.sms",
                                                                                 "work.rate-waiting.push")}  # fmt: skip
    problems, notes = rate_findings(rated, figures.__getitem__)
    assert problems == [
        "waiting room work.rate-waiting.push of rate-limited job 'push' is missing: its deliveries wait for a token "
        "in their work queue's slots; a worker declares it again when it finds it missing (restart one if this stays)",
        "token queue work.rate-tokens.sms of rate-limited job 'sms' is missing: no start gets a token; a worker "
        "declares it again when it finds it missing (restart one if this stays)",
    ]
    assert "workers of job 'sms' have different rate limits (1/h, 2/h); the minter's, 1/h, applies" in notes[1]
    assert "next token at 2026-12-01T06:00:00.000Z" in notes[1]
