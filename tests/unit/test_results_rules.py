"""Job states and results: the pure rules (amqpjobs.jobs.results)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from amqpjobs import App, JobFailedError, SqliteResults
from amqpjobs.errors import ConfigurationError, ResultsUnavailableError
from amqpjobs.jobs.envelope import job_id_problem
from amqpjobs.jobs.outcome import Ack, Duplicate, HandBack, Outcome, Quarantine, RetryLater, Skip
from amqpjobs.jobs.results import MAX_VALUE, STATES, StateRecord, encode_value, record_for, status_of
from amqpjobs.runtime.pg_text import from_db, to_db
from amqpjobs.runtime.results import wait_result
from amqpjobs.runtime.results_writer import ResultsWriter
from amqpjobs.topology.models import Topology

pytestmark = pytest.mark.version_independent


def outcome(decision: object, acked: bool = True, ran: bool = True) -> Outcome:
    return Outcome(decision=decision, job="mail", job_id="j1", attempt=2, duration=0.1, acked=acked,  # type: ignore[arg-type]
                   queue="work", ran=ran, error="ValueError: boom")  # fmt: skip


def test_a_running_record_past_its_lease_reads_unknown_and_no_record_reads_unknown():
    running = StateRecord("j1", "mail", "running", 1, at=100.0, where="work", lease_until=160.0)
    assert status_of("j1", [running], now=159.9).state == "running"
    late = status_of("j1", [running], now=160.1)
    assert (late.state, late.note) == ("unknown", "running, but its worker's lease passed")
    assert late.current == running
    none = status_of("j1", [], now=0)
    assert (none.state, none.current, none.history) == ("unknown", None, ())


def test_the_latest_record_by_time_is_the_state_whatever_order_they_were_written_in():
    a = StateRecord("j1", "mail", "replayed", 0, at=10.0)
    b = StateRecord("j1", "mail", "running", 1, at=11.0, lease_until=99.0)
    c = StateRecord("j1", "mail", "succeeded", 1, at=12.0, value="[1]")
    status = status_of("j1", [c, a, b], now=50.0)
    assert [r.state for r in status.history] == ["replayed", "running", "succeeded"]
    assert (status.state, status.terminal, status.value()) == ("succeeded", True, [1])


def test_values_are_stored_as_json_up_to_64_kib_else_the_record_says_why():
    assert encode_value({"a": [1, "é"]}) == ('{"a":[1,"é"]}', "")
    assert encode_value(None) == (None, "")
    fits = "x" * (MAX_VALUE - 2)  # with its two quotes: exactly the limit
    assert encode_value(fits) == (json.dumps(fits), "")
    assert encode_value(fits + "x") == (None, f"not stored: {MAX_VALUE + 1} bytes of JSON, over the 65536-byte limit")
    text, note = encode_value({1, 2})
    assert text is None
    assert note.startswith("not stored: not JSON-serialisable (TypeError: Object of type set")
    assert encode_value(float("nan"))[1].startswith("not stored: not JSON-serialisable (ValueError")
    # a lone surrogate (helper-176: UnicodeEncodeError escaped and the record was never written)
    assert encode_value({"k": "caf\udce9"})[1].startswith("not stored: not JSON-serialisable (UnicodeEncodeError: ")
    assert encode_value({"\udcfe": 1})[1].startswith("not stored: not JSON-serialisable (UnicodeEncodeError: ")


@pytest.mark.parametrize(
    ("value", "where", "key", "read_back"),
    [
        ({1: "a"}, "value", "1 (int)", "'1'"),
        ({"a": [{"b": {None: 1}}]}, "value['a'][0]['b']", "None (NoneType)", "'null'"),
        ([1, {2.5: 3}], "value[1]", "2.5 (float)", "'2.5'"),
        ({True: 1}, "value", "True (bool)", "'true'"),
    ],
)
def test_a_value_whose_dict_keys_json_would_change_is_not_stored(value: object, where: str, key: str, read_back: str):
    # helper-226: {1: "a"} was stored, and result() returned {"1": "a"}, without a word (enqueue refuses such a payload)
    assert encode_value(value) == (
        None,
        f"not stored: {where} has the key {key}; JSON object keys are strings, so it would read back as {read_back}; "
        "return the key as a str",
    )


def test_a_key_json_would_change_100_levels_down_is_found_and_its_path_cut():
    # helper-227: looked at 64 levels only, so {5: "x"} under 100 dicts was stored and read back as {"5": "x"}
    deep: dict[object, object] = {}
    inner = deep
    for _ in range(100):
        inner["k"] = inner = {}
    inner[5] = "x"
    stored, why = encode_value(deep)
    assert stored is None
    assert why.startswith("not stored: value['k']['k']")
    assert why.endswith("['k']['k'] has the key 5 (int); JSON object keys are strings, so it would read back as "
                        "'5'; return the key as a str")  # fmt: skip
    assert "…" in why
    assert len(why) < 260
    assert encode_value({"a": [[{"b": 1}] * 3] * 2, "c": {"d": {"e": 2}}}) == (
        '{"a":[[{"b":1},{"b":1},{"b":1}],[{"b":1},{"b":1},{"b":1}]],"c":{"d":{"e":2}}}', ""
    )  # fmt: skip


def test_each_settled_outcome_maps_to_one_state():
    ok = record_for(outcome(Ack()), {"n": 1}, "work", 5.0)
    assert ok is not None
    assert (ok.state, ok.value, ok.attempt, ok.at) == ("succeeded", '{"n":1}', 2, 5.0)
    retry = record_for(outcome(RetryLater(next_attempt=3, tier=1, delay=5.0)), None, "work.retry.5s", 5.0)
    assert retry is not None
    assert (retry.state, retry.detail, retry.where, retry.error) == (
        "retrying", "tier 2 (5s), attempt 3", "work.retry.5s", "ValueError: boom"
    )  # fmt: skip
    bad = record_for(outcome(Quarantine("permanent")), None, "work.quarantine", 5.0)
    assert bad is not None
    assert (bad.state, bad.detail) == ("quarantined", "permanent")
    dup = record_for(outcome(Duplicate(), ran=False), None, "work", 5.0)
    assert dup is not None  # acked without running: terminal, so result() stops waiting (a retest)
    assert (dup.state, dup.detail, dup.value, dup.attempt) == (
        "duplicate",
        "already done: acked without running",
        None,
        2,
    )
    assert status_of("j1", [dup], now=6.0).terminal
    rolled = record_for(outcome(Duplicate(), ran=True), None, "work", 5.0)  # its ctx.transaction() found it done
    assert rolled is not None
    assert rolled.detail == "already done: this run's effect was rolled back"
    assert record_for(outcome(HandBack(), ran=False), None, "work", 5.0) is None
    assert record_for(outcome(Ack(), acked=False), 1, "work", 5.0) is None  # redelivered: the lease covers it
    skipped = record_for(outcome(Skip("overlap", "schedule quarter"), ran=False), None, "work", 5.0)
    assert skipped is not None  # the handler never ran: not a success, and result() stops waiting
    assert (skipped.state, skipped.detail, skipped.value) == ("skipped", "overlap: schedule quarter", None)
    status = status_of("j1", [skipped], now=6.0)
    assert (status.state, status.terminal) == ("skipped", True)
    assert "skipped" in STATES


def test_a_succeeded_job_that_returned_none_shows_result_null_and_a_stored_value_shows_itself():
    none = status_of("j1", [StateRecord("j1", "mail", "succeeded", 1, 10.0)], now=11.0)
    assert "result: null (the handler returned None)" in none.report()
    valued = status_of("j1", [StateRecord("j1", "mail", "succeeded", 1, 10.0, value='{"n":1}')], now=11.0)
    assert 'result: {"n":1}' in valued.report()
    assert not any(line.startswith("result:") for line in status_of(
        "j1", [StateRecord("j1", "mail", "queued", 0, 10.0, where="work")], now=11.0).report())  # fmt: skip


def test_queued_is_a_state_that_is_not_terminal_and_sorts_before_the_run():
    history = [
        StateRecord("j1", "mail", "running", 1, 12.0, lease_until=99.0),
        StateRecord("j1", "mail", "queued", 0, 10.0),
    ]
    status = status_of("j1", history, now=13.0)
    assert "queued" in STATES
    assert (status.state, [r.state for r in status.history]) == ("running", ["queued", "running"])
    assert not status_of("j1", history[1:], now=13.0).terminal


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [("", "job_id is empty"), ("  ", "job_id is empty"), ("é" * 128, "must be 1-255 UTF-8 bytes (got 256 bytes"),
     ("invoice-7", None), ("x\x00y", None),  # AMQP carries a NUL in a message_id: a job can have it
     ("a\ud800b", "job_id 'a\\ud800b' is not UTF-8 text (a lone surrogate at 1)")],
)  # fmt: skip
def test_one_job_id_rule(job_id: str, problem: str | None):
    found = job_id_problem(job_id)
    assert found is None if problem is None else problem in (found or "")


def test_the_same_id_enqueued_again_after_success_still_reads_succeeded():
    history = [
        StateRecord("j1", "mail", "queued", 0, 10.0),
        StateRecord("j1", "mail", "running", 1, 11.0, lease_until=99.0),
        StateRecord("j1", "mail", "succeeded", 1, 12.0, value="7"),
        StateRecord("j1", "mail", "queued", 0, 13.0),  # enqueued again, then acked as a duplicate
        StateRecord("j1", "mail", "duplicate", 1, 14.0, detail="already done: acked without running"),
    ]
    status = status_of("j1", history, now=15.0)
    assert (status.state, status.value(), len(status.history)) == ("succeeded", 7, 5)
    assert status_of("j1", history[:4], now=15.0).state == "succeeded"  # before the duplicate's record
    # an older copy, quarantined before the success, replayed after it: acked as a duplicate (a retest: read
    # "replayed", waiting, for ever)
    replayed = [
        *history[:3],
        StateRecord("j1", "mail", "replayed", 1, 20.0, detail="replay run r1"),
        StateRecord("j1", "mail", "duplicate", 1, 21.0, detail="already done: acked without running"),
    ]
    status = status_of("j1", replayed, now=22.0)
    assert (status.state, status.value(), status.terminal) == ("succeeded", 7, True)
    assert status_of("j1", replayed[:4], now=22.0).state == "replayed"  # the copy on its way: not yet known


@pytest.mark.parametrize(
    "text", ["", "plain", "a\x00b", "\x00", "back\\slash\x00", "\\0", "\uffff", "\uffffa\x00", "\\\x00\\"]
)
def test_postgres_text_escaping_gives_every_text_back_and_one_stored_form_each(text: str):
    stored = to_db(text)
    assert "\x00" not in stored
    assert from_db(stored) == text
    assert stored == text or stored.startswith("\uffff")


def test_the_postgres_stored_forms_never_collide():
    texts = ["a\x00b", "a\\0b", "\uffffa\\0b", "a\\x00b", "\uffffa\x00b"]
    assert len({to_db(t) for t in texts}) == len(texts)


def test_an_escaped_record_spells_out_what_a_database_cannot_hold_and_keeps_its_id():
    record = StateRecord("x\x00y", "j\x00", "quarantined", 2, 1.0, detail="d\ud800", error="E: a\x00b",
                         where="q", value='"\ud800"', value_note="")  # fmt: skip
    assert record.escaped() == StateRecord("x\x00y", "j\\x00", "quarantined", 2, 1.0, detail="d\\ud800",
                                           error="E: a\\x00b", where="q", value='"\\ud800"')  # fmt: skip
    assert json.loads(record.escaped().value or "") == "\ud800"  # in JSON text, the same character


@pytest.mark.parametrize(("job_id", "named"), [(None, "NoneType"), (5, "int"), (b"j1", "bytes")])
async def test_job_status_and_result_refuse_an_id_that_is_no_str_by_the_enqueue_rule(
    job_id: object, named: str, tmp_path: Path
) -> None:
    app = App("reads", topology=Topology(), url="amqp://guest:guest@127.0.0.1:1/",
              results=SqliteResults(tmp_path / "r.db"))  # fmt: skip
    expected = f"job_id must be a str (got {named})"
    assert job_id_problem(job_id) == expected
    for read in (app.job_status(job_id), app.result(job_id, timeout=1)):  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError) as caught:
            await read
        assert str(caught.value) == expected
    with app.sync_publisher() as publisher, pytest.raises(ConfigurationError) as caught:
        await asyncio.to_thread(publisher.job_status, job_id)  # type: ignore[arg-type]
    assert str(caught.value) == expected


async def test_result_stops_at_a_skipped_run_with_the_skip_as_its_reason(tmp_path: Path):
    store = SqliteResults(tmp_path / "results.db")
    skipped = StateRecord("j1", "tick", "skipped", 1, time.time(), detail="overlap: schedule quarter", where="work")
    await store.write([StateRecord("j1", "tick", "queued", 0, time.time() - 1, where="work"), skipped])
    started = time.monotonic()
    with pytest.raises(JobFailedError) as failed:
        await wait_result(store, "j1", limit=5.0, every=0.05)
    assert time.monotonic() - started < 1.0  # a terminal state: no waiting out the timeout
    assert (failed.value.state, failed.value.reason, failed.value.error) == ("skipped", "overlap: schedule quarter", "")
    assert str(failed.value) == "job j1 is skipped: reason overlap: schedule quarter"
    await store.close()


async def test_result_reads_once_more_at_its_timeout_and_waits_all_of_it(tmp_path: Path):
    """``timeout=1.5, poll=0.8``: reads at 0, 0.8 and 1.5 s, so a success at 1.1 s is returned (a retest: it gave up
    at 0.8 s, "no terminal state within 1.5s"); a job that never ends raises after the whole timeout."""
    store = SqliteResults(tmp_path / "results.db")
    await store.write([StateRecord("j1", "mail", "queued", 0, time.time(), where="work")])

    async def succeed_later() -> None:
        await asyncio.sleep(1.1)
        await store.write([StateRecord("j1", "mail", "succeeded", 1, time.time(), value="7", where="work")])

    later = asyncio.create_task(succeed_later())
    assert await wait_result(store, "j1", limit=1.5, every=0.8) == 7
    await later
    await store.write([StateRecord("j2", "mail", "queued", 0, time.time(), where="work")])
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"job j2: no terminal state within 0.5s; last state: queued"):
        await wait_result(store, "j2", limit=0.5, every=0.2)
    assert time.monotonic() - started >= 0.5
    await store.close()


async def test_job_show_says_a_skipped_or_duplicate_job_is_nowhere_without_browsing():
    """Both were acked: nothing to look for (a retest: a skipped one had its quarantine and parked queue browsed)."""
    from typing import Any, cast

    from amqpjobs.runtime.whereabouts import where_now

    skipped = StateRecord("j1", "tick", "skipped", 1, 5.0, detail="overlap: schedule quarter", where="work")
    dup = StateRecord("j2", "mail", "duplicate", 2, 5.0, detail="already done: acked without running", where="work")
    nothing = cast(Any, None)  # no broker, no app: these answers never browse
    assert await where_now(nothing, nothing, status_of("j1", [skipped], now=6.0)) == (
        "nowhere: its run was skipped (overlap: schedule quarter) and acked"
    )
    assert (await where_now(nothing, nothing, status_of("j2", [dup], now=6.0))).startswith(
        "nowhere: it was already done"
    )


def test_an_older_copy_parked_after_the_job_succeeded_leaves_it_succeeded():
    """A copy quarantined before the job succeeded (the same id enqueued again), parked after the success: the job's
    run succeeded and the parked copy is a stale one (a retest: read ``parked``, and ``result()`` raised
    ``JobFailedError``). A copy quarantined after the success (a later run failed) and then parked reads parked."""
    quarantined = StateRecord("j1", "mail", "quarantined", 1, 10.0, detail="rejected", where="work.quarantine")
    succeeded = StateRecord("j1", "mail", "succeeded", 1, 12.0, value="7")
    parked = StateRecord("j1", "mail", "parked", 1, 20.0, detail="rejected", where="work.parked")
    status = status_of("j1", [quarantined, succeeded, parked], now=21.0)
    assert (status.state, status.value(), status.terminal, len(status.history)) == ("succeeded", 7, True, 3)
    assert status.note == "an older copy, quarantined before the success, was parked in work.parked"
    assert f"job j1: succeeded ({status.note})" in status.report()
    # a run after the success failed (a worker records its run's start before its outcome)
    run = StateRecord("j1", "mail", "running", 2, 14.0, where="work", lease_until=99.0)
    later = StateRecord("j1", "mail", "quarantined", 2, 15.0, detail="crashed", where="work.quarantine")
    again = status_of("j1", [quarantined, succeeded, run, later, parked], now=21.0)
    assert (again.state, again.note, again.current) == ("parked", "", parked)
    alone = status_of("j1", [quarantined, parked], now=21.0)
    assert (alone.state, alone.note) == ("parked", "")


def test_an_older_copy_unparked_or_parked_again_after_the_success_leaves_it_succeeded_until_it_runs():
    """``quarantine unpark --app`` records the copy ``quarantined`` again: after the success, with no run since, it
    is the stale copy's (a retest: read ``quarantined``; parked again, ``parked``). A replay runs it again."""
    q1 = StateRecord("j1", "mail", "quarantined", 1, 10.0, detail="rejected", where="work.quarantine")
    ok = StateRecord("j1", "mail", "succeeded", 1, 12.0, value="7")
    parked = StateRecord("j1", "mail", "parked", 1, 20.0, detail="rejected", where="work.parked")
    unparked = StateRecord("j1", "mail", "quarantined", 1, 21.0, detail="rejected", where="work.quarantine")
    parked2 = replace(parked, at=22.0)
    status = status_of("j1", [q1, ok, parked, unparked], now=30.0)
    assert (status.state, status.value(), status.note) == (
        "succeeded",
        7,
        "an older copy, quarantined before the success, was unparked to work.quarantine",
    )
    status = status_of("j1", [q1, ok, parked, unparked, parked2], now=30.0)
    assert (status.state, status.note) == ("succeeded", "an older copy, quarantined before the success, was parked "
                                                        "in work.parked")  # fmt: skip
    replayed = StateRecord("j1", "mail", "replayed", 1, 23.0, detail="replay run r1", where="work")
    assert status_of("j1", [q1, ok, parked, replayed], now=30.0).state == "replayed"  # asked to run again
    run = StateRecord("j1", "mail", "running", 1, 24.0, where="work", lease_until=99.0)
    failed = StateRecord("j1", "mail", "quarantined", 1, 25.0, detail="rejected", where="work.quarantine")
    rerun = status_of("j1", [q1, ok, parked, replayed, run, failed], now=30.0)
    assert (rerun.state, rerun.note, rerun.current) == ("quarantined", "", failed)  # that run's outcome
    # every sequence a job goes through reads its last step
    ran = StateRecord("j1", "mail", "running", 1, 5.0, where="work", lease_until=99.0)
    for steps, state in (
        ([ran, q1, replace(replayed, at=11.0), replace(run, at=11.5), ok], "succeeded"),
        ([ran, q1, replace(parked, at=10.5), replace(unparked, at=10.6), replace(replayed, at=11.0),
          replace(run, at=11.5), ok], "succeeded"),
        ([replace(ran, at=11.0), ok, StateRecord("j1", "mail", "duplicate", 1, 13.0)], "succeeded"),
        ([ran, replace(q1, state="retrying"), replace(ran, at=10.5), replace(q1, state="retrying", at=11.0),
          replace(ran, at=11.5), ok], "succeeded"),
        ([ran, q1, replace(parked, at=10.5), replace(unparked, at=10.6)], "quarantined"),
    ):  # fmt: skip
        assert status_of("j1", steps, now=30.0).state == state, steps


class _FullDisk:
    """A results store whose writes fail (a full disk) until ``ok`` is set."""

    retention = 86400.0

    def __init__(self) -> None:
        self.ok = False
        self.written: list[StateRecord] = []

    async def write(self, records: list[StateRecord]) -> list[StateRecord]:
        if not self.ok:
            raise ResultsUnavailableError("database or disk is full (SQLITE_FULL)")
        self.written.extend(records)
        return []


async def test_every_record_not_written_is_said_in_the_log_within_the_pace_not_only_the_first(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """600 records lost in a burst, then the store writes again: the lines add up to 600 (was: "1", then silence)."""
    monkeypatch.setattr("amqpjobs.runtime.results_writer.WARN_EVERY", 0.3)
    store = _FullDisk()
    writer = ResultsWriter(store)  # type: ignore[arg-type]
    writer.start()
    for i in range(600):
        writer.note(StateRecord(f"j-{i}", "mail", "running", 1, at=1.0))
        if i % 50 == 0:
            await asyncio.sleep(0)  # the writer takes a batch now and then, as under a real burst
    await asyncio.sleep(0.05)
    store.ok = True
    writer.note(StateRecord("after", "mail", "running", 1, at=2.0))
    await asyncio.sleep(0.6)  # past the pace: the rest is said without waiting for the stop
    lines = [r.getMessage() for r in caplog.records if r.name == "amqpjobs.results"]
    await writer.close()
    counts = [int(m.split(": ", 1)[1].split()[0]) for m in lines]
    assert writer.failed == 600
    assert sum(counts) == 600, lines
    assert [r.job_id for r in store.written] == ["after"]


def test_a_purged_copy_reads_purged_unless_the_job_succeeded_since():
    """``quarantine purge --app`` records ``purged`` (before: nothing, and a purged parked job read ``parked``)."""
    q1 = StateRecord("j1", "mail", "quarantined", 1, 10.0, detail="rejected", where="work.quarantine")
    parked = StateRecord("j1", "mail", "parked", 1, 11.0, detail="rejected", where="work.parked")
    purged = StateRecord("j1", "mail", "purged", 1, 12.0, detail="rejected", where="work.parked")
    status = status_of("j1", [q1, parked, purged], now=30.0)
    assert (status.state, status.terminal, status.current) == ("purged", True, purged)
    ok = StateRecord("j1", "mail", "succeeded", 1, 11.5, value="7")
    stale = status_of("j1", [q1, parked, ok, purged], now=30.0)  # a copy quarantined before the success
    assert (stale.state, stale.value(), stale.note) == (
        "succeeded", 7, "an older copy, quarantined before the success, was purged from work.parked"
    )  # fmt: skip
