"""Cron next-fire times through DST, missed-tick planning, tick ids, and the @app.cron API (no broker)."""

from __future__ import annotations

import decimal
import inspect
import itertools
import logging
import math
import random
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from amqpjobs import App, BrokerError, ConfigurationError, CronRule, JobContext, Schedule, tick_id
from amqpjobs.jobs.cron import (
    format_tick,
    leader_queue,
    parse_tick,
    plan_ticks,
    rewound_cursor,
    running_queue,
    tick_queue,
)
from amqpjobs.jobs.json_values import json_problem
from amqpjobs.jobs.tick_record import TickRecord, latest_record
from amqpjobs.runtime.paced_warnings import PacedWarnings
from amqpjobs.runtime.scheduler import GUARD_ATTRIBUTE
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from tests.integration.helpers import cli


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ticks(rule: CronRule, after: str, count: int) -> list[str]:
    return [format_tick(t) for t in rule.upcoming(utc(after), count)]


# ---------------------------------------------------------------------------- DST
# 2026 transitions: Paris 03-29 02:00 CET -> 03:00 CEST (01:00Z) and 10-25 03:00 CEST -> 02:00 CET
# (01:00Z); New York 03-08 02:00 EST -> 03:00 EDT (07:00Z) and 11-01 02:00 EDT -> 01:00 EST
# (06:00Z); Lord Howe (30-minute shift) 04-05 02:00 -> 01:30 (15:00Z on 04-04) and
# 10-04 02:00 -> 02:30 (15:30Z on 10-03).
@pytest.mark.parametrize(
    ("tz", "expression", "after", "expected"),
    [
        # daily at a time inside the spring-forward gap: that day at the end of the gap, once
        ("Europe/Paris", "30 2 * * *", "2026-03-27T12:00Z",
         ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
        ("America/New_York", "30 2 * * *", "2026-03-06T12:00Z",
         ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
        ("Australia/Lord_Howe", "15 2 * * *", "2026-10-02T12:00Z",
         ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]),
        # daily at a time inside the repeated hour: its first occurrence only
        ("Europe/Paris", "30 2 * * *", "2026-10-23T12:00Z",
         ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
        ("America/New_York", "30 1 * * *", "2026-10-30T12:00Z",
         ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
        ("Australia/Lord_Howe", "45 1 * * *", "2026-04-03T12:00Z",
         ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]),
        # daily outside the transition hours: the UTC time moves by the offset change
        ("Europe/Paris", "0 8 * * *", "2026-03-28T00:00Z", ["2026-03-28T07:00:00Z", "2026-03-29T06:00:00Z"]),
        ("Europe/Paris", "0 8 * * *", "2026-10-24T00:00Z", ["2026-10-24T06:00:00Z", "2026-10-25T07:00:00Z"]),
        # several matches inside one gap collapse into one tick at its end (03:00 CEST = 01:00Z)
        ("Europe/Paris", "*/30 * * * *", "2026-03-29T00:00Z",
         ["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z"]),
        # hourly through the repeated hour: 02:30 CEST fires, 02:30 CET (01:30Z) does not
        ("Europe/Paris", "30 * * * *", "2026-10-24T22:00Z",
         ["2026-10-24T22:30:00Z", "2026-10-24T23:30:00Z", "2026-10-25T00:30:00Z", "2026-10-25T02:30:00Z"]),
        ("America/New_York", "0 * * * *", "2026-11-01T03:30Z",
         ["2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]),
        # UTC (the default zone) has no transitions; seconds as the sixth field
        ("UTC", "* * * * * */20", "2026-11-29T08:00:05Z",
         ["2026-11-29T08:00:20Z", "2026-11-29T08:00:40Z", "2026-11-29T08:01:00Z"]),
    ],
)  # fmt: skip
def test_next_fire_times_through_dst(tz: str, expression: str, after: str, expected: list[str]) -> None:
    assert ticks(CronRule(expression, tz), after, len(expected)) == expected


@pytest.mark.parametrize(
    ("tz", "expression", "after", "expected"),
    [
        # the scheduler restarts during the second pass of the repeated hour: nothing fires twice
        ("Europe/Paris", "30 2 * * *", "2026-10-25T01:10Z", "2026-10-26T01:30:00Z"),
        ("Europe/Paris", "30 * * * *", "2026-10-25T01:10Z", "2026-10-25T02:30:00Z"),
        ("America/New_York", "30 1 * * *", "2026-11-01T06:10Z", "2026-11-02T06:30:00Z"),
        # exactly at the end of a gap: its tick is that instant, so the next is a day later
        ("Europe/Paris", "30 2 * * *", "2026-03-29T01:00Z", "2026-03-30T00:30:00Z"),
        # one second before the gap: the gap's tick
        ("America/New_York", "30 2 * * *", "2026-03-08T06:59:59Z", "2026-03-08T07:00:00Z"),
    ],
)
def test_next_fire_from_inside_a_transition(tz: str, expression: str, after: str, expected: str) -> None:
    assert format_tick(CronRule(expression, tz).next_after(utc(after))) == expected


def between(rule: CronRule, start: str, end: str) -> list[datetime]:
    out: list[datetime] = []
    moment = utc(start)
    while (moment := rule.next_after(moment)) < utc(end):
        out.append(moment)
    return out


def test_every_minute_never_fires_in_the_second_pass_of_the_repeated_hour() -> None:
    rule = CronRule("* * * * *", "Europe/Paris")
    fired = between(rule, "2026-10-24T21:59:59Z", "2026-10-25T03:00Z")  # 00:00 CEST .. 04:00 CET
    local = [t.astimezone(rule.zone).replace(tzinfo=None) for t in fired]
    assert len(fired) == 240  # 4 wall-clock hours, each minute once (5 real hours)
    assert len(set(local)) == 240
    assert [t for t in fired if utc("2026-10-25T01:00Z") <= t < utc("2026-10-25T02:00Z")] == []
    assert format_tick(fired[0]) == "2026-10-24T22:00:00Z"
    assert format_tick(fired[-1]) == "2026-10-25T02:59:00Z"


def test_every_minute_through_the_gap_fires_once_per_real_minute() -> None:
    rule = CronRule("* * * * *", "Europe/Paris")
    fired = between(rule, "2026-03-28T22:59:59Z", "2026-03-29T03:00Z")  # 00:00 CET .. 05:00 CEST
    assert len(fired) == 240 == len(set(fired))
    steps = {b - a for a, b in itertools.pairwise(fired)}
    assert steps == {timedelta(minutes=1)}  # the 60 gap minutes collapsed into 01:00Z (03:00 CEST)


def test_the_system_time_zone_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = CronRule("30 2 * * *", "Europe/Paris")
    expected = ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    try:
        for system_tz in ("America/New_York", "Europe/Paris", "Asia/Kolkata"):
            monkeypatch.setenv("TZ", system_tz)
            time.tzset()
            assert ticks(rule, "2026-03-27T12:00Z", 3) == expected
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    ("tz", "expression", "start"),
    [
        ("Europe/Paris", "* * * * *", "2026-03-28T23:00Z"),  # crosses the gap
        ("Europe/Paris", "* * * * *", "2026-10-24T23:00Z"),  # crosses the repeated hour
        ("Europe/Paris", "30 2 * * *", "2026-03-27T00:00Z"),
        ("Europe/Paris", "30 2 * * *", "2026-10-23T00:00Z"),
        ("America/New_York", "*/7 1-3 * * *", "2026-10-30T00:00Z"),
        ("America/New_York", "*/7 1-3 * * *", "2026-03-06T00:00Z"),
        ("Australia/Lord_Howe", "15,45 * * * *", "2026-10-02T00:00Z"),
        ("UTC", "* * * * * */13", "2026-11-29T00:00Z"),
    ],
)
def test_latest_at_or_before_matches_the_forward_sequence(tz: str, expression: str, start: str) -> None:
    rule = CronRule(expression, tz)
    forward = [rule.next_after(utc(start))]
    while forward[-1] < forward[0] + timedelta(days=4) and len(forward) < 2000:
        forward.append(rule.next_after(forward[-1]))
    span = int((forward[-1] - forward[0]).total_seconds())
    rng = random.Random(5)
    for _ in range(60):
        at = forward[0] + timedelta(seconds=rng.randrange(0, span))  # before the last one listed
        expected = max(t for t in forward if t <= at)
        assert rule.latest_at_or_before(at, floor=forward[0]) == expected, at


# ---------------------------------------------------------------------------- missed ticks
def every_second(missed: Any = "catch-up-once", grace: float = 60.0) -> Schedule:
    return Schedule("s", "job", CronRule("* * * * * *"), {}, missed, "allow", grace)


def test_plan_nothing_due_keeps_the_cursor() -> None:
    plan = plan_ticks(every_second(), utc("2026-11-29T08:00:00Z"), utc("2026-11-29T08:00:00.900Z"))
    assert (plan.due, plan.on_time, plan.missed_from, plan.cursor) == (False, None, None, utc("2026-11-29T08:00:00Z"))


def test_plan_one_tick_on_time() -> None:
    plan = plan_ticks(every_second(), utc("2026-11-29T07:59:59Z"), utc("2026-11-29T08:00:00.300Z"))
    assert plan.due
    assert (plan.on_time, plan.missed_from, plan.missed_until) == (utc("2026-11-29T08:00:00Z"), None, None)
    assert plan.cursor == utc("2026-11-29T08:00:00Z")


def test_plan_30_seconds_down_is_one_missed_window_plus_the_current_tick() -> None:
    plan = plan_ticks(every_second(), utc("2026-11-29T08:00:00Z"), utc("2026-11-29T08:00:30.300Z"))
    assert plan.on_time == utc("2026-11-29T08:00:30Z")
    assert (plan.missed_from, plan.missed_until) == (utc("2026-11-29T08:00:01Z"), utc("2026-11-29T08:00:29Z"))
    assert plan.cursor == utc("2026-11-29T08:00:30Z")


def test_plan_a_week_down_on_an_every_second_schedule_is_quick() -> None:
    started = time.perf_counter()
    plan = plan_ticks(every_second(), utc("2026-11-01T00:00:00Z"), utc("2026-11-08T00:00:00.500Z"))
    assert time.perf_counter() - started < 1.0
    assert (plan.missed_from, plan.missed_until) == (utc("2026-11-01T00:00:01Z"), utc("2026-11-07T23:59:59Z"))
    assert plan.on_time == utc("2026-11-08T00:00:00Z")


def test_plan_daily_tick_late_within_grace_is_on_time_and_beyond_is_missed() -> None:
    daily = Schedule("d", "job", CronRule("0 8 * * *"), grace=60.0)
    late = plan_ticks(daily, utc("2026-11-28T08:00Z"), utc("2026-11-29T08:00:45Z"))
    assert (late.on_time, late.missed_from) == (utc("2026-11-29T08:00Z"), None)
    missed = plan_ticks(daily, utc("2026-11-28T08:00Z"), utc("2026-11-29T08:01:01Z"))
    assert (missed.on_time, missed.missed_from, missed.missed_until) == (
        None, utc("2026-11-29T08:00Z"), utc("2026-11-29T08:00Z"),
    )  # fmt: skip
    days = plan_ticks(daily, utc("2026-11-20T08:00Z"), utc("2026-11-29T10:00Z"))
    assert (days.on_time, days.missed_from, days.missed_until, days.cursor) == (
        None, utc("2026-11-21T08:00Z"), utc("2026-11-29T08:00Z"), utc("2026-11-29T08:00Z"),
    )  # fmt: skip


def test_plan_in_local_time_across_both_transitions() -> None:
    paris = Schedule("p", "job", CronRule("30 2 * * *", "Europe/Paris"))
    gap = plan_ticks(paris, utc("2026-03-28T01:30Z"), utc("2026-03-29T01:00:10Z"))
    assert (gap.on_time, gap.missed_from) == (utc("2026-03-29T01:00Z"), None)
    hourly = Schedule("h", "job", CronRule("30 * * * *", "Europe/Paris"))
    second_pass = plan_ticks(hourly, utc("2026-10-25T00:30Z"), utc("2026-10-25T01:45Z"))
    assert (second_pass.due, second_pass.cursor) == (False, utc("2026-10-25T00:30Z"))


# ---------------------------------------------------------------------------- ids, records, names
def test_tick_ids_and_formats() -> None:
    paris = datetime(2026, 11, 29, 9, 0, 0, 700000, tzinfo=CronRule("0 9 * * *", "Europe/Paris").zone)
    assert tick_id("nightly-report", paris) == "cron:nightly-report:2026-11-29T08:00:00Z"
    assert format_tick(utc("2026-11-29T08:00:00Z")) == "2026-11-29T08:00:00Z"
    assert parse_tick("2026-11-29T08:00:00Z") == utc("2026-11-29T08:00:00Z")
    with pytest.raises(ValueError, match="naive"):
        format_tick(datetime(2026, 11, 29, 8))
    assert leader_queue("shop") == "amqpjobs.scheduler.shop.leader"
    assert tick_queue("shop", "nightly") == "amqpjobs.scheduler.shop.ticks.nightly"
    assert running_queue("shop", "nightly") == "amqpjobs.scheduler.shop.running.nightly"


def test_tick_record_round_trip_and_latest() -> None:
    a = TickRecord("s", utc("2026-11-29T08:00:00Z"), utc("2026-11-29T08:00:00Z"), "cron:s:2026-11-29T08:00:00Z",
                   utc("2026-11-29T08:00:00.012Z"), "host:1")  # fmt: skip
    b = TickRecord("s", utc("2026-11-29T08:00:05Z"), None, None, utc("2026-11-29T08:00:05.020Z"), "host:2")
    assert TickRecord.from_bytes(a.to_bytes()) == a
    assert TickRecord.from_bytes(b.to_bytes()) == b
    assert latest_record([b, a]) == b
    assert latest_record([]) is None
    with pytest.raises(ValueError, match="not a tick record"):
        TickRecord.from_bytes(b'{"schedule": "s"}')


@pytest.mark.parametrize(
    ("expression", "tz", "message"),
    [
        ("61 * * * *", "UTC", "is invalid"),
        ("* * * *", "UTC", "is invalid"),
        ("0 0 1 1 * 0 2030", "UTC", "is invalid"),
        ("0 8 * * *", "Mars/Olympus_Mons", "time zone 'Mars/Olympus_Mons' is unknown"),
        ("0 0 30 2 *", "UTC", "never fires"),
    ],
)
def test_bad_rules_are_refused(expression: str, tz: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        CronRule(expression, tz)


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("61 * * * *", "its minute field '61' is not taken (minute: 0-59)"),
        ("0 24 * * *", "its hour field '24' is not taken (hour: 0-23)"),
        ("0 8 0 * *", "its day-of-month field '0' is not taken (day of month: 1-31)"),
        ("0 8 * 13 *", "its month field '13' is not taken (month: 1-12 or jan-dec)"),
        ("0 8 * * 8", "its weekday field '8' is not taken (weekday: 0-7 or sun-sat, 0 and 7 are Sunday)"),
        ("*/0 * * * *", "its minute field '*/0' is not taken (minute: 0-59)"),
        ("0 8 * * mon 61", "its second field '61' is not taken (second: 0-59)"),
    ],
)
def test_a_cron_field_out_of_range_is_named_with_its_range(expression: str, said: str) -> None:
    """Was: "... is invalid: give 5 fields (minute hour day month weekday) ..." when 5 were given (helper-177)."""
    with pytest.raises(ConfigurationError) as refused:
        CronRule(expression)
    assert str(refused.value) == (
        f"cron expression {expression!r} is invalid: {said}; each field takes numbers, a list (1,5), a range "
        "(1-5), a step (*/15) or *"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "a b"}, "schedule name 'a b'"),
        ({"name": "x:y"}, "schedule name 'x:y'"),
        ({"name": ""}, "schedule name ''"),
        ({"missed": "replay-all"}, "missed must be one of catch-up-once, skip$"),
        ({"overlap": "queue"}, "overlap must be one of allow, skip$"),
        ({"grace": -1.0}, "grace must be >= 0"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "ok", "job": "job", "rule": CronRule("@daily")} | kwargs
    with pytest.raises(ConfigurationError, match=message):
        Schedule(**fields)


# ---------------------------------------------------------------------------- @app.cron
class Report(BaseModel):
    kind: str


def test_app_cron_registers_validated_schedules() -> None:
    app = App("crontest")

    @app.cron("0 8 * * *", tz="Europe/Paris", payload={"kind": "daily"}, missed="skip", grace="5m")
    @app.cron("0 * * * *", name="hourly-report", payload=Report(kind="hourly"))
    @app.job("reports.build", queue="batch", payload=Report)
    async def build(payload: Report, ctx: JobContext) -> None: ...

    hourly, daily = app.schedules()  # sorted by name
    assert (daily.name, daily.job, daily.rule, daily.payload, daily.missed, daily.overlap, daily.grace) == (
        "reports.build", "reports.build", CronRule("0 8 * * *", "Europe/Paris"), {"kind": "daily"}, "skip",
        "allow", 300.0,
    )  # fmt: skip
    assert (hourly.name, hourly.payload, hourly.missed, hourly.grace) == (
        "hourly-report", {"kind": "hourly"}, "catch-up-once", 60.0,
    )  # fmt: skip
    assert app.resolve(build).name == "reports.build"


def test_app_cron_overlap_guard_wraps_the_handler_once() -> None:
    app = App("crontest")

    @app.cron("* * * * *", name="a", overlap="skip")
    @app.cron("*/5 * * * *", name="b", overlap="skip")
    @app.job("sync", queue="batch")
    async def sync(payload: dict[str, Any], ctx: JobContext) -> None: ...

    job = app.resolve("sync")
    assert job.handler is sync
    assert getattr(sync, GUARD_ATTRIBUTE) is True
    assert inspect.iscoroutinefunction(job.handler)
    assert inspect.unwrap(sync).__name__ == "sync"
    assert not hasattr(inspect.unwrap(sync), GUARD_ATTRIBUTE)  # wrapped once, not twice
    assert [s.name for s in app.schedules()] == ["a", "b"]


def test_app_cron_refusals() -> None:
    app = App("crontest")

    @app.job("plain", queue="batch", payload=Report)
    def plain(payload: Report, ctx: JobContext) -> None: ...

    async def not_a_job(payload: Any, ctx: JobContext) -> None: ...

    with pytest.raises(ConfigurationError, match=r"put @app\.cron above @app\.job"):
        app.cron("@daily")(not_a_job)
    with pytest.raises(ConfigurationError, match="payload for job 'plain'"):
        app.cron("@daily", payload={"kind": 3})(plain)
    with pytest.raises(ConfigurationError, match="needs an async def handler"):
        app.cron("@daily", payload={"kind": "x"}, overlap="skip")(plain)
    with pytest.raises(ConfigurationError, match="grace"):
        app.cron("@daily", grace="soon")
    app.cron("@daily", payload={"kind": "x"})(plain)
    with pytest.raises(ConfigurationError, match="registered twice"):
        app.cron("@hourly", payload={"kind": "x"})(plain)
    assert [s.name for s in app.schedules()] == ["plain"]


def test_app_cron_refuses_a_payload_json_cannot_carry_at_import() -> None:
    # review H2: a Decimal was accepted at import, then stopped every schedule of the app
    app = App("crontest")

    @app.job("tick", queue="batch")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    with pytest.raises(ConfigurationError) as caught:
        app.cron("* * * * * */1", name="badpay", payload={"x": decimal.Decimal("1.5")})(tick)
    assert str(caught.value) == (
        "schedule 'badpay': the payload holds a value JSON can't carry: payload['x'] = Decimal('1.5') "
        "(a Decimal; fix: give a str, int, float, bool, None, list or dict)"
    )
    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="nan", payload={"a": [1, {"b": math.nan}]})(tick)
    assert str(caught.value) == (
        "schedule 'nan': the payload holds a value JSON can't carry: payload['a'][1]['b'] = nan "
        "(NaN and Infinity are not JSON; fix: give a finite number)"
    )
    with pytest.raises(ConfigurationError, match=r"schedule 'direct': .* payload\['3'\] = b'x'"):
        Schedule("direct", "tick", CronRule("@daily"), {"3": b"x"})
    assert app.schedules() == []


@pytest.mark.parametrize(
    ("key", "shown", "arrives"),
    [(1, "1 (an int)", "'1'"), (None, "None", "'null'"), (1.5, "1.5 (a float)", "'1.5'"),
     (True, "True (a bool)", "'true'"), (math.nan, "nan (a float)", "")],
)  # fmt: skip
def test_app_cron_refuses_a_payload_key_json_would_turn_into_a_string(key: Any, shown: str, arrives: str) -> None:
    # fresh-user review: {1: "a"} was accepted, and the job got {"1": "a"} (a NaN key was refused
    # with the whole payload and "fix: give a str, int, float, ...")
    gets = f", so the job would get {arrives}" if arrives else " (and strict JSON has no NaN or Infinity)"
    app = App("crontest")

    @app.job("tick", queue="batch")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="keys", payload={"a": {key: "x"}})(tick)
    assert str(caught.value) == (
        f"schedule 'keys': the payload has a key that is not a str: payload['a'] has the key {shown}; JSON object "
        f"keys are strings{gets}; fix: write the key as a str"
    )
    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="top", payload={key: "x"})(tick)
    assert str(caught.value).startswith(
        f"schedule 'top': the payload has a key that is not a str: payload has the key {shown};"
    )
    assert app.schedules() == []


def test_app_cron_refusals_name_a_lone_surrogate_a_nan_key_and_a_huge_int_with_their_fix() -> None:
    # fresh-user review: a lone surrogate was refused with "fix: give a str, ..." (it is a str), a
    # NaN key with the whole payload and the same fix, and 10**5000 raised a plain ValueError
    app = App("crontest")

    @app.job("tick", queue="batch")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="text", payload={"s": ["ok", "ab\ud800c"]})(tick)
    assert str(caught.value) == (
        "schedule 'text': the payload holds a value JSON can't carry: payload['s'][1] = 'ab\\ud800c' (a lone "
        "surrogate '\\ud800' at index 2, which UTF-8 can't encode; fix: remove it, or decode the bytes the text "
        "came from with errors='replace')"
    )
    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="textkey", payload={"\udc80": 1})(tick)
    assert str(caught.value) == (
        "schedule 'textkey': the payload holds a key JSON can't carry: payload has the key '\\udc80' (a lone "
        "surrogate '\\udc80' at index 0, which UTF-8 can't encode; fix: remove it, or decode the bytes the text "
        "came from with errors='replace')"
    )
    with pytest.raises(ConfigurationError) as caught:
        app.cron("@daily", name="big", payload={"n": [10**5000]})(tick)
    assert str(caught.value) == (
        "schedule 'big': the payload holds a value JSON can't carry: payload['n'][0] = an int of 5001 digits "
        "(longer than the 4300 digits Python writes as text; fix: give it as a str)"
    )
    assert app.schedules() == []


# ---------------------------------------------------------------------------- amqpjobs schedule list
listed = App("cronlist")


@listed.cron("30 2 * * *", name="paris-daily", tz="Europe/Paris", overlap="skip")
@listed.cron("* * * * * */20", name="fast", missed="skip", grace="2s")
@listed.job("report", queue="batch")
async def report(payload: dict[str, Any], ctx: JobContext) -> None: ...


def test_schedule_list_prints_next_fire_times_in_utc_and_local_time() -> None:
    from amqpjobs.wire.settings import broker_settings

    result = cli(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "schedule", "list",
                 "tests.unit.test_cron:listed", "--after", "2026-03-28T00:00:10Z")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "fast  job=report  cron='* * * * * */20'  tz=UTC  missed=skip  overlap=allow  grace=2s",
        "  2026-03-28T00:00:20Z  2026-03-28 00:00:20 UTC (+00:00)",
        "  2026-03-28T00:00:40Z  2026-03-28 00:00:40 UTC (+00:00)",
        "  2026-03-28T00:01:00Z  2026-03-28 00:01:00 UTC (+00:00)",
        "paris-daily  job=report  cron='30 2 * * *'  tz=Europe/Paris  missed=catch-up-once  overlap=skip  grace=1m",
        "  2026-03-28T01:30:00Z  2026-03-28 02:30:00 CET (+01:00)",
        "  2026-03-29T01:00:00Z  2026-03-29 03:00:00 CEST (+02:00)",
        "  2026-03-30T00:30:00Z  2026-03-30 02:30:00 CEST (+02:00)",
    ]


def test_schedule_list_refuses_a_bad_time() -> None:
    from amqpjobs.wire.settings import broker_settings

    result = cli(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "schedule", "list",
                 "tests.unit.test_cron:listed", "--after", "tomorrow")  # fmt: skip
    assert result.exit_code == 2
    assert "--after 'tomorrow'" in result.output


def test_schedule_run_refuses_an_app_without_schedules() -> None:
    from amqpjobs.wire.settings import broker_settings

    result = cli(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "schedule", "run", "tests.integration.procapp:app")
    assert result.exit_code == 2
    assert "app 'procapp' has no schedules; declare some with @app.cron" in result.output


async def test_scheduler_refuses_unknown_schedule_names_before_connecting() -> None:
    from amqpjobs import Scheduler, SchedulerOptions
    from amqpjobs.wire.settings import broker_settings

    scheduler = Scheduler(
        listed, broker_settings("amqp://guest:guest@127.0.0.1:1/"), SchedulerOptions(("fast", "nope"))
    )
    with pytest.raises(ConfigurationError, match=r"unknown schedule\(s\) nope; the app has fast, paris-daily$"):
        await scheduler.start()


def test_schedule_list_count_gives_that_many_fire_times() -> None:
    from amqpjobs.wire.settings import broker_settings

    result = cli(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "schedule", "list",
                 "tests.unit.test_cron:listed", "--after", "2026-03-28T00:00:10Z", "--count", "5")  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    expected = ["00:20", "00:40", "01:00", "01:20", "01:40"]
    assert [line.split()[0] for line in lines[1:6]] == [f"2026-03-28T00:{t}Z" for t in expected]
    assert lines[6].startswith("paris-daily ")
    assert len(lines) == 2 + 2 * 5
    refused = cli(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "schedule", "list",
                  "tests.unit.test_cron:listed", "--count", "0")  # fmt: skip
    assert refused.exit_code == 2
    assert "--count" in refused.output


def test_a_scheduler_refuses_an_empty_selection_of_schedules() -> None:
    # review L11, the library's side: schedules=() ran every schedule like None
    from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions
    from amqpjobs.wire.settings import broker_settings

    scheduler = Scheduler(listed, broker_settings("amqp://guest:guest@127.0.0.1:1/"), SchedulerOptions(schedules=()))
    with pytest.raises(ConfigurationError) as caught:
        scheduler._select()
    assert str(caught.value) == "no schedule selected: name some of fast, paris-daily, or None for all"


@pytest.mark.parametrize("which", ["leader", "ticks"])
async def test_a_scheduler_queue_with_other_arguments_is_named_with_its_arguments_as_toml(
    tmp_path: Path, which: str
) -> None:
    # fresh-user review: the error printed the arguments as a Python dict ({'x-queue-type': 'classic', ...})
    (tmp_path / "t.toml").write_text('[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n')
    app = App("cronargs", topology=load_topology(tmp_path / "t.toml").topology)

    @app.cron("@daily", name="nightly")
    @app.job("tick", queue="work")
    async def tick(payload: dict[str, Any], ctx: JobContext) -> None: ...

    async with TestBroker(app, scheduler=False) as broker:
        queue = leader_queue("cronargs") if which == "leader" else tick_queue("cronargs", "nightly")
        assert broker.memory.declare(queue, {"x-max-length": 5})
        with pytest.raises(BrokerError) as caught:
            await broker.add_scheduler()
    declared = (
        'x-queue-type = "classic", x-single-active-consumer = true, x-max-length = 1, x-overflow = "reject-publish"'
        if which == "leader"
        else 'x-queue-type = "classic", x-max-length = 1, x-overflow = "drop-head"'
    )
    forgets = "" if which == "leader" else " (it holds the cursor: the schedule starts from now)"
    assert str(caught.value) == (
        f"queue {queue!r} exists with other arguments than the scheduler declares ({declared}): delete it while "
        f"no scheduler of app 'cronargs' runs (rabbitmqctl delete_queue -p / {queue}, or the management UI), "
        f"then start again{forgets}"
    )


def test_paced_warnings_one_line_when_failing_starts_then_one_per_period_with_a_count_then_one_on_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    warnings = PacedWarnings(logging.getLogger("amqpjobs.scheduler"), 60.0, lambda: now[0])
    caplog.set_level(logging.WARNING, logger="amqpjobs.scheduler")
    schedule = "scheduler replica h:1: schedule a"
    warnings.succeeded(schedule)  # never failed: nothing to say
    for _ in range(130):  # one failed look a second for 130 s
        warnings.failed(schedule, "NOT_FOUND - no exchange 'x'", "; its tick waits")
        now[0] += 1.0
    warnings.failed("scheduler replica h:1", "the broker went away", "; trying again in 1s")
    warnings.succeeded(schedule)
    warnings.succeeded(schedule)  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "scheduler replica h:1: schedule a: NOT_FOUND - no exchange 'x'; its tick waits; repeated at most every 1m "
        "while it fails",
        "scheduler replica h:1: schedule a: still failing: 60 failed look(s) in 1m since the last line, failing for "
        "1m: NOT_FOUND - no exchange 'x'",
        "scheduler replica h:1: schedule a: still failing: 60 failed look(s) in 1m since the last line, failing for "
        "2m: NOT_FOUND - no exchange 'x'",
        "scheduler replica h:1: the broker went away; trying again in 1s; repeated at most every 1m while it fails",
        "scheduler replica h:1: schedule a: recovered after 130 failed look(s) over 130s",
    ]


def test_a_cron_payload_too_deep_for_python_is_refused_with_the_depth_words() -> None:
    # review 22 M1: the payload walk itself raised RecursionError past ~1,000 levels
    deep: Any = 1
    for _ in range(1200):
        deep = {"d": deep}
    assert json_problem({"d": deep}) == (
        "the payload is nested deeper than 64 levels (dicts and lists inside each other), more than a worker reads "
        "(it would quarantine the job as undecodable); fix: flatten it, or send the deep part as a JSON string"
    )


def test_a_cursor_ahead_of_the_clock_is_waited_for_within_the_tolerance_and_rewound_past_it():
    now = datetime.fromisoformat("2026-12-05T10:00:00.400+00:00")
    assert rewound_cursor(now - timedelta(seconds=5), now, 60) is None  # behind: nothing to say
    assert rewound_cursor(now + timedelta(seconds=60), now, 60) is None  # a clock a minute behind waits
    # stepped forward an hour and back: start again from the second before now (its tick fires)
    assert rewound_cursor(now + timedelta(hours=1), now, 60) == datetime.fromisoformat("2026-12-05T09:59:59+00:00")
    assert rewound_cursor(now + timedelta(seconds=2), now, 0) == datetime.fromisoformat("2026-12-05T09:59:59+00:00")
