"""Bad input from publishers we don't control, published raw to a worker on the real broker.

Every line of ``tests/data/bad-messages.jsonl`` (see ``tests/data/README.md``) and every
kind in :data:`OWN_CASES` is published without amqpjobs (plain aio-pika) to exchange
``jobs`` / routing key ``work``, where a worker serves job ``mail`` (payload
``to: str, order_id: int``). For each case the test asserts, with exact values:

* the worker stays up: a valid job enqueued afterwards completes;
* nothing is lost: the message was either handled exactly once, or is in
  ``work.quarantine`` exactly once; the work queue and the retry tier queues are empty;
* a quarantined message carries every evidence header with the expected reason, attempts
  count, error type and job, and keeps its body (byte for byte), properties and headers.

The expected outcomes are in :data:`EXPECT` (the file's lines, by id) and :data:`OWN_CASES`.
Documented choices of the library (``amqpjobs.jobs.envelope``): no content_type → read as
JSON; a UTF-8 BOM is skipped; NaN/Infinity, nesting deeper than 64, a content_encoding
other than identity/utf-8 and an empty body → ``undecodable``; a garbage or negative
attempt header → attempt 1; an attempt header above max_attempts → quarantined
``exhausted`` without running; no message_id → a job id is generated. Chosen here, where
no library rule exists: a 5 MB body is processed (there is no size rule short of the
broker's ``max_message_size``); with duplicate JSON keys the last one wins (as in Python,
JavaScript's ``JSON.parse`` and Go's ``encoding/json``).

Two things plain aio-pika can't send: a message without (or with an empty) message_id,
because aiormq fills in a random one, and a raw ``timestamp`` number; those cases go
through the management API's "publish message" (as from its web UI). aio-pika (pamqp)
sends AMQP byte-array header values from ``bytearray`` (``bytes`` is refused) and decodes
them as ``bytearray``, so ``<bytes:HEX>`` becomes a ``bytearray``.

A case the library gets wrong can be marked ``xfail(strict=True)`` with the finding in
:data:`KNOWN_BUGS` (empty now: the bugs this suite found were fixed); each is expected to
fail with one exception type only, so that another failure in the same case still shows.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aio_pika
import pytest
from pydantic import BaseModel

from amqpjobs.jobs import copy_headers, envelope, evidence
from amqpjobs.jobs.outcome import Ack, Quarantine, RetryLater
from amqpjobs.jobs.registry import JobContext
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.runtime.worker import Outcome
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.chaos]

DATA = Path(__file__).resolve().parents[1] / "data" / "bad-messages.jsonl"
VALID: dict[str, Any] = {"to": "a@example.com", "order_id": 17}
VALID_BODY = json.dumps(VALID).encode()
JSON = "application/json"
CANARY_ID = "canary"
CANARY_ORDER = 424242
TIERS = ("200ms", "400ms", "600ms")  # of job queue "work" in worker_env.FAST_TOPOLOGY
MAX_ATTEMPTS = 4  # the default: one more than the number of tiers
#: Seconds a delivery gets to be acked or quarantined (plus 0.3 s per expected run).
SETTLE = 4.0
#: Bodies this big are compared by length and digest (no multi-megabyte diffs).
BIG = 100_000


class Mail(BaseModel):
    to: str
    order_id: int


@dataclass(frozen=True)
class Run:
    """One handler run, as the handler saw it."""

    job: str
    order_id: int
    attempt: int
    job_id: str
    tenant: str | None
    headers: dict[str, Any]


@dataclass(frozen=True)
class Seen:
    """What a case produced, for case-specific checks."""

    bad_runs: list[Run]
    outcomes: list[Outcome]
    quarantined: list[aio_pika.abc.AbstractIncomingMessage]
    log_text: str


@dataclass(frozen=True)
class Expect:
    """The right outcome for one bad message.

    Attributes:
        outcome: ``processed`` (the handler ran, the delivery was acked) or ``quarantined``.
        runs: ``ctx.attempt`` of each handler run for the message, in order.
        reason / attempts / error_type: evidence headers expected in quarantine.
        error_message: a substring of the ``amqpjobs-error-message`` evidence header.
        job: The job the message names (the ``amqpjobs-job`` evidence header).
        check: Extra, case-specific assertions.

    """

    outcome: Literal["processed", "quarantined"]
    runs: tuple[int, ...] = ()
    reason: str = ""
    attempts: int = 0
    error_type: str = ""
    error_message: str = ""
    job: str = "mail"
    check: Callable[[Seen], None] | None = None


@dataclass(frozen=True)
class Case:
    """A raw message to publish, and what must become of it."""

    id: str
    body: bytes
    properties: dict[str, Any]
    expect: Expect
    generated_body: bool = False
    via: Literal["aio-pika", "management"] = "aio-pika"


# ---------------------------------------------------------------- expectations
def processed(attempt: int = 1, check: Callable[[Seen], None] | None = None) -> Expect:
    """Run once (at ``attempt``) and acked."""
    return Expect("processed", runs=(attempt,), check=check)


def quarantined(
    reason: str,
    error_type: str,
    error_message: str,
    job: str = "mail",
    check: Callable[[Seen], None] | None = None,
) -> Expect:
    """Quarantined at once; the handler never ran (evidence attempts 0)."""
    return Expect("quarantined", (), reason, 0, error_type, error_message, job, check)


def undecodable(error_message: str) -> Expect:
    return quarantined("undecodable", "DecodeError", error_message)


def not_an_object(kind: str) -> Expect:
    return quarantined("invalid-payload", "DecodeError", f"payload must be a JSON object, got {kind}")


def fails_model() -> Expect:
    return quarantined("invalid-payload", "pydantic.ValidationError", "validation error")


def unknown_job(job: str, error_message: str) -> Expect:
    return quarantined("unknown-job", "UnknownJob", error_message, job=job)


def exhausted_unrun(attempt: int) -> Expect:
    """An attempt header above max_attempts: quarantined without running.

    ``amqpjobs-attempts`` is the handler runs counted by the worker on its own copies
    (``amqpjobs-runs``, absent = 0), never arithmetic on the attempt header: a message from
    a publisher has none, and this delivery adds none.
    """
    why = f"attempt header says {attempt}, above max_attempts {MAX_ATTEMPTS}"
    return Expect("quarantined", (), "exhausted", 0, "AttemptsExhausted", why)


def poisoned(check: Callable[[Seen], None]) -> Expect:
    """Job ``poison`` always raises: max_attempts runs through every tier, then quarantine."""
    runs = tuple(range(1, MAX_ATTEMPTS + 1))
    return Expect("quarantined", runs, "exhausted", MAX_ATTEMPTS, "RuntimeError", "poisoned order 17", "poison", check)


# ---------------------------------------------------------------- case-specific checks
def _only_run(seen: Seen) -> Run:
    (run,) = seen.bad_runs
    return run


def _generated_id_logged(seen: Seen) -> None:
    job_id = _only_run(seen).job_id
    assert job_id.startswith("generated-")
    assert len(job_id) > len("generated-")
    assert f"said once per queue; first: job id {job_id})" in seen.log_text


def _generated_id_in_quarantine(seen: Seen) -> None:
    (msg,) = seen.quarantined
    assert str(msg.message_id).startswith("generated-")
    assert msg.headers[evidence.JOB_ID] == msg.message_id
    assert f"said once per queue; first: job id {msg.message_id})" in seen.log_text


def _handler_saw_header(name: str, value: Any) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert _only_run(seen).headers[name] == value

    return check


def _handler_saw_tenant(tenant: str) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert _only_run(seen).tenant == tenant

    return check


def _poison_evidence(seen: Seen) -> None:
    (msg,) = seen.quarantined
    h: dict[str, Any] = dict(msg.headers)
    assert "Traceback (most recent call last)" in str(h[evidence.TRACEBACK])
    assert "RuntimeError: poisoned order 17" in str(h[evidence.TRACEBACK])
    assert h[envelope.ATTEMPT] == MAX_ATTEMPTS
    assert str(h[evidence.FIRST_FAILURE_AT]).endswith("Z")
    assert str(h[evidence.LAST_FAILURE_AT]) >= str(h[evidence.FIRST_FAILURE_AT])
    decisions = [type(o.decision).__name__ for o in seen.outcomes if o.job_id != CANARY_ID]
    assert decisions == ["RetryLater"] * (MAX_ATTEMPTS - 1) + ["Quarantine"]


def _enqueue_time_readable(seen: Seen) -> None:
    """The unreadable enqueue time was replaced (:func:`amqpjobs.jobs.copy_headers.copy_headers`) by a readable one."""
    _poison_evidence(seen)
    assert parse_time(seen.quarantined[0].headers[envelope.ENQUEUED_AT]) is not None


def _poison_evidence_with_tenant(seen: Seen) -> None:
    _poison_evidence(seen)
    assert seen.quarantined[0].headers[evidence.TENANT] == "acme"
    assert seen.quarantined[0].correlation_id == "corr-1"


# ---------------------------------------------------------------- the data file's lines
#: The right outcome of each line of the data file, by id.
EXPECT: dict[str, Expect] = {
    "bad-json": undecodable("body is not JSON"),
    "bad-utf8": undecodable("body is not UTF-8"),
    "empty-body": undecodable("body is empty"),
    "json-array": not_an_object("list"),
    "json-null": not_an_object("NoneType"),
    "json-string": not_an_object("str"),
    "missing-field": fails_model(),
    "wrong-types": fails_model(),
    "deep-nesting": undecodable(f"nested deeper than {envelope.MAX_JSON_DEPTH}"),
    "nan-literal": undecodable("NaN is not valid JSON"),
    "number-overflow": undecodable("body is not JSON: number 1e400 is too large for a float"),
    "bom": processed(),
    "text-plain": quarantined("unsupported-content-type", "DecodeError", "'text/plain'"),
    "gzip-claimed": undecodable("content_encoding 'gzip' is not supported"),
    "no-content-type": processed(),
    "unknown-job": unknown_job("no.such.job", "'no.such.job' is not served from job queue 'work'"),
    "no-job-name": unknown_job("", "no job name"),
    "long-job-name": unknown_job("j" * 255, "is not served from job queue 'work'"),
    "big-body": processed(),
    "attempt-garbage": processed(attempt=1),
    "attempt-negative": processed(attempt=1),
    "attempt-huge": exhausted_unrun(1099511627776),
    "priority-over-max": processed(),
    "no-message-id": processed(check=_generated_id_logged),
    "nested-headers": processed(check=_handler_saw_header("meta", {"a": {"b": [1, "two", True]}})),
    "binary-header": processed(check=_handler_saw_header("blob", b"\x00\xff\x10")),
    "unicode-header-name": processed(check=_handler_saw_header("ключ-名前", "v")),
    "redelivered-poison": poisoned(_poison_evidence),
}

#: The job a line's ``{job}`` stands for (default ``mail``).
JOB_FOR = {"redelivered-poison": "poison"}
#: Lines published without a message_id (through the management API); the others get ``bad-<id>``.
NO_MESSAGE_ID = {"no-message-id"}


def _substitute(value: Any, job: str) -> Any:
    if isinstance(value, dict):
        return {_substitute(k, job): _substitute(v, job) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, job) for v in value]
    if isinstance(value, str):
        if value.startswith("<bytes:") and value.endswith(">"):
            return bytearray.fromhex(value[len("<bytes:") : -1])
        return value.replace("{job}", job).replace("<attempt-header>", envelope.ATTEMPT)
    return value


def _generate(spec: dict[str, Any]) -> bytes:
    if spec["kind"] == "nest":
        nest = int(spec["depth"])
        return b"[" * nest + b"]" * nest
    if spec["kind"] == "pad":
        return json.dumps({**VALID, "pad": "x" * int(spec["bytes"])}).encode()
    raise ValueError(f"unknown body_gen kind {spec['kind']!r}")


def _file_lines() -> list[dict[str, Any]]:
    """The data file's lines replayed here: those whose ``replay`` names another test (typed header values) are its."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if "replay" not in row]


def file_cases() -> list[Case]:
    cases = []
    for raw in _file_lines():
        gen = raw.get("body_gen")
        body = _generate(gen) if gen else base64.b64decode(raw["body_b64"])
        props = _substitute(raw["properties"], JOB_FOR.get(raw["id"], "mail"))
        via: Literal["aio-pika", "management"] = "management" if raw["id"] in NO_MESSAGE_ID else "aio-pika"
        cases.append(Case(raw["id"], body, props, EXPECT[raw["id"]], bool(gen), via))
    return cases


# ---------------------------------------------------------------- more kinds of our own
def _mail(**extra: Any) -> dict[str, Any]:
    return {"content_type": JSON, "type": "mail", **extra}


def _attempt(value: Any) -> dict[str, Any]:
    return _mail(headers={envelope.ATTEMPT: value})


#: Publisher mistakes a RabbitMQ user meets, beyond the data file, with the right outcome.
OWN_CASES: list[Case] = [
    Case("json-number", b"42", _mail(), not_an_object("int")),
    Case("json-bool", b"true", _mail(), not_an_object("bool")),
    # last one wins, as in JSON.parse / encoding/json (the handler gets order_id 17)
    Case("duplicate-keys", b'{"to": "a@example.com", "order_id": 1, "order_id": 17}', _mail(), processed()),
    # Python won't turn more than 4300 digits into an int: a clean quarantine, not a crash
    Case(
        "huge-integer",
        b'{"to": "a@example.com", "order_id": ' + b"9" * 5000 + b"}",
        _mail(),
        undecodable("4300 digits"),
    ),
    # a batch published as NDJSON: two documents in one message
    Case("concatenated-json", VALID_BODY + b"\n" + VALID_BODY, _mail(), undecodable("Extra data")),
    # `echo '{...}' | rabbitmqadmin publish` adds a newline; whitespace around JSON is fine
    Case("trailing-newline", VALID_BODY + b"\r\n", _mail(), processed()),
    # .NET's Encoding.Unicode: UTF-16LE with a BOM
    Case(
        "utf16-body",
        "\ufeff".encode("utf-16-le") + VALID_BODY.decode().encode("utf-16-le"),
        _mail(),
        undecodable("body is not UTF-8"),
    ),
    Case("content-type-charset", VALID_BODY, _mail(content_type="application/json; charset=utf-8"), processed()),
    Case("content-type-uppercase", VALID_BODY, _mail(content_type="Application/JSON"), processed()),
    Case(
        "content-type-octet-stream",
        VALID_BODY,
        _mail(content_type="application/octet-stream"),
        quarantined("unsupported-content-type", "DecodeError", "'application/octet-stream'"),
    ),
    Case("content-encoding-identity", VALID_BODY, _mail(content_encoding="identity"), processed()),
    Case("content-encoding-utf-8", VALID_BODY, _mail(content_encoding="utf-8"), processed()),
    # a job of this app, but served from job queue "ghost", not from "work"
    Case(
        "job-of-other-queue",
        VALID_BODY,
        _mail(type="elsewhere"),
        unknown_job("elsewhere", "'elsewhere' is not served from job queue 'work'"),
    ),
    Case(
        "job-name-wrong-case",
        VALID_BODY,
        _mail(type="Mail"),
        unknown_job("Mail", "'Mail' is not served from job queue 'work'"),
    ),
    # a client that can't set `type` names the job in our header, as an AMQP byte array
    Case(
        "job-name-in-header-as-bytes",
        VALID_BODY,
        {"content_type": JSON, "headers": {envelope.JOB: bytearray(b"mail")}},
        processed(),
    ),
    Case(
        "tenant-header-as-bytes",
        VALID_BODY,
        _mail(headers={envelope.TENANT: bytearray(b"acme")}),
        processed(check=_handler_saw_tenant("acme")),
    ),
    Case("attempt-float", VALID_BODY, _attempt(3.0), processed(attempt=3)),
    Case("attempt-fraction", VALID_BODY, _attempt(2.5), processed(attempt=1)),
    Case("attempt-bytes", VALID_BODY, _attempt(bytearray(b"2")), processed(attempt=2)),
    Case("attempt-digit-string", VALID_BODY, _attempt("3"), processed(attempt=3)),
    Case("attempt-bool", VALID_BODY, _attempt(True), processed(attempt=1)),
    # "²".isdigit() is True but int("²") raises: still garbage, so attempt 1
    Case("attempt-superscript-digit", VALID_BODY, _attempt("²"), processed(attempt=1)),
    # max_attempts lowered from 6 to 4 while a copy with attempt 5 waited in a tier
    Case("attempt-one-above-max", VALID_BODY, _attempt(MAX_ATTEMPTS + 1), exhausted_unrun(MAX_ATTEMPTS + 1)),
    Case("empty-message-id", VALID_BODY, _mail(message_id=""), processed(check=_generated_id_logged), via="management"),
    Case(
        "no-message-id-undecodable",
        b"not json",
        _mail(),
        quarantined("undecodable", "DecodeError", "body is not JSON", check=_generated_id_in_quarantine),
        via="management",
    ),
    # an enqueue time (ISO text, with an offset) whose UTC time falls outside datetime's years 1-9999: unreadable, so
    # unknown (ctx.enqueued_at None), never an OverflowError that quarantines a good job as worker-error
    Case(
        "enqueued-at-out-of-range",
        VALID_BODY,
        _mail(headers={envelope.ENQUEUED_AT: "0001-01-01T00:00:00+01:00"}),
        processed(),
    ),
    # the same on a job that fails: each retry copy and the quarantined one are built from its headers
    Case(
        "poison-enqueued-at-out-of-range",
        VALID_BODY,
        {"content_type": JSON, "type": "poison", "headers": {envelope.ENQUEUED_AT: "9999-12-31T23:59:59-01:00"}},
        poisoned(_enqueue_time_readable),
    ),
    # Node amqplib users often pass Date.now(): milliseconds, not seconds
    Case("timestamp-milliseconds", VALID_BODY, _mail(timestamp=1_764_406_800_123), processed(), via="management"),
    Case("timestamp-microseconds", VALID_BODY, _mail(timestamp=1_764_406_800_123_456), processed(), via="management"),
    # odd headers on a job that keeps failing survive three republishes and the quarantine
    Case(
        "poison-odd-headers",
        VALID_BODY,
        {
            "content_type": JSON,
            "type": "poison",
            "correlation_id": "corr-1",
            "headers": {
                "meta": {"a": {"b": [1, "two", True]}},
                "blob": bytearray(b"\x00\xff\x10"),
                "ключ-名前": "v",
                envelope.TENANT: "acme",
            },
        },
        poisoned(_poison_evidence_with_tenant),
    ),
]


def _expiration_dropped(seen: Seen) -> None:
    """The publisher's per-message TTL went with no copy: it would expire one in a tier or in quarantine."""
    _poison_evidence(seen)
    assert seen.quarantined[0].expiration is None


def _nested(depth: int) -> bytes:
    """A valid mail job whose extra field ``x`` makes the body ``depth`` levels deep."""
    return b'{"to": "a@example.com", "order_id": 17, "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


#: More kinds: a publisher's gzip, stray BOMs and whitespace, the nesting bound's edge, forged broker headers.
OWN_CASES += [
    Case("gzip-body", gzip.compress(VALID_BODY), _mail(content_encoding="gzip"),
         undecodable("content_encoding 'gzip' is not supported")),
    Case("gzip-body-unlabelled", gzip.compress(VALID_BODY), _mail(), undecodable("body is not UTF-8")),
    Case("two-boms", b"\xef\xbb\xbf" * 2 + VALID_BODY, _mail(), undecodable("body is not JSON")),
    Case("whitespace-body", b" \n\t ", _mail(), undecodable("body is empty")),
    Case("nul-body", b"\x00", _mail(), undecodable("body is not JSON")),
    Case("nesting-at-the-bound", _nested(envelope.MAX_JSON_DEPTH), _mail(), processed()),
    Case("nesting-one-past-the-bound", _nested(envelope.MAX_JSON_DEPTH + 1), _mail(),
         undecodable(f"nested deeper than {envelope.MAX_JSON_DEPTH}")),
    Case("content-type-text-json", VALID_BODY, _mail(content_type="text/json"),
         quarantined("unsupported-content-type", "DecodeError", "'text/json'")),
    # a publisher copying a dead-lettered message's headers: x-death & co are read as evidence only, never obeyed
    Case("forged-x-death", VALID_BODY, _mail(headers={"x-death": [{"count": 5, "reason": "rejected", "queue": "work"}],
                                                      "x-first-death-reason": "rejected"}), processed()),
    Case("malformed-x-death", VALID_BODY, _mail(headers={"x-death": "garbage\n\x1b[31m"}), processed()),
    Case("forged-delivery-count", VALID_BODY, _mail(headers={"x-delivery-count": 1000}), processed()),
    Case("poison-forged-x-death", VALID_BODY,
         {"content_type": JSON, "type": "poison", "headers": {"x-death": [{"count": 9, "reason": "expired"}]}},
         poisoned(_poison_evidence)),
    # aio-pika takes seconds: it sends expiration "600000"
    Case("poison-expiration", VALID_BODY, {"content_type": JSON, "type": "poison", "expiration": 600},
         poisoned(_expiration_dropped)),
    Case("attempt-decimal", VALID_BODY, _attempt(Decimal("2")), processed(attempt=2)),  # the count rule: any encoding
    Case("tenant-control-characters", VALID_BODY, _mail(headers={envelope.TENANT: "ac\nme\x1b[31m"}),
         processed(check=_handler_saw_tenant("ac\nme\x1b[31m"))),
    Case("correlation-id-255-bytes", VALID_BODY, _mail(correlation_id="é" * 127 + "c"), processed()),
]  # fmt: skip
NO_MESSAGE_ID_OWN = {"empty-message-id", "no-message-id-undecodable"}


# ---------------------------------------------------------------- known library bugs
class AttemptsEvidenceWrong(AssertionError):
    """The ``amqpjobs-attempts`` evidence header is not the expected handler run count."""


#: Where the library does not (yet) do what the expectation says: id -> (finding, exception).
KNOWN_BUGS: dict[str, tuple[str, type[BaseException]]] = {}


def all_cases() -> list[Any]:
    params = []
    for case in [*file_cases(), *OWN_CASES]:
        marks = []
        if case.id in KNOWN_BUGS:
            reason, raises = KNOWN_BUGS[case.id]
            marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def test_every_line_of_the_data_file_has_an_expected_outcome() -> None:
    ids = [raw["id"] for raw in _file_lines()]
    assert len(ids) == len(set(ids)), "duplicate ids in the data file"
    assert set(ids) == set(EXPECT)
    own = [c.id for c in OWN_CASES]
    assert len(own) == len(set(own))
    assert not set(own) & set(ids)
    assert set(JOB_FOR) | NO_MESSAGE_ID <= set(ids)
    assert NO_MESSAGE_ID_OWN | set(KNOWN_BUGS) <= set(ids) | set(own)


# ---------------------------------------------------------------- the test
def _publish_via_management(broker: BrokerSettings, body: bytes, props: dict[str, Any]) -> None:
    """Publish through the management API, as from its web UI: nothing fills in properties."""
    doc = {
        "properties": props,
        "routing_key": "work",
        "payload": base64.b64encode(body).decode(),
        "payload_encoding": "base64",
    }
    with ManagementClient(broker) as mgmt:
        answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
    assert answer == {"routed": True}


async def _settled(rec: Recorder, predicate: Callable[[list[Outcome]], bool], timeout: float) -> bool:
    try:
        await rec.wait_for(predicate, timeout=timeout)
    except TimeoutError:
        return False
    return True


def _assert_body_kept(got: bytes, case: Case) -> None:
    if case.generated_body or len(case.body) >= BIG:
        assert len(got) == len(case.body)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(case.body).hexdigest()
    else:
        assert got == case.body


@pytest.mark.parametrize("case", all_cases())
async def test_bad_message(broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: Case):
    caplog.set_level(logging.INFO, logger="amqpjobs.worker")
    exp = case.expect
    app = await make_app(broker, tmp_path)
    runs: list[Run] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        runs.append(Run(ctx.job, payload.order_id, ctx.attempt, ctx.job_id, ctx.tenant, dict(ctx.headers)))

    @app.job("poison", queue="work", payload=Mail)
    async def poison(payload: Mail, ctx: JobContext) -> None:
        runs.append(Run(ctx.job, payload.order_id, ctx.attempt, ctx.job_id, ctx.tenant, dict(ctx.headers)))
        raise RuntimeError(f"poisoned order {payload.order_id}")

    @app.job("elsewhere", queue="ghost")  # served by the workers of job queue "ghost"
    async def elsewhere(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(Run(ctx.job, -1, ctx.attempt, ctx.job_id, ctx.tenant, dict(ctx.headers)))

    props = dict(case.properties)
    if case.id not in NO_MESSAGE_ID | NO_MESSAGE_ID_OWN:
        props.setdefault("message_id", f"bad-{case.id}")
    expected_id = props.get("message_id") or None

    async with running_worker(app, broker) as (worker, rec):
        if case.via == "management":
            await asyncio.to_thread(_publish_via_management, broker, case.body, props)
        else:
            async with raw_channel(broker) as ch:
                exchange = await ch.get_exchange("jobs")
                await exchange.publish(aio_pika.Message(case.body, **props), routing_key="work")
        # settled = acked or quarantined (a retried copy comes back from its tier first)
        bad_settled = await _settled(
            rec,
            lambda o: any(not isinstance(x.decision, RetryLater) for x in o),
            timeout=SETTLE + 0.3 * len(exp.runs),
        )
        await app.enqueue("mail", Mail(to="canary@example.com", order_id=CANARY_ORDER), job_id=CANARY_ID)
        canary_done = await _settled(
            rec,
            lambda o: any(x.job_id == CANARY_ID and isinstance(x.decision, Ack) for x in o),
            timeout=SETTLE if bad_settled else 1.0,  # one slot: a stuck delivery blocks the canary anyway
        )
        await asyncio.sleep(0.1)  # nothing more may happen (leftover copies show in the depths below)
        stats = dict(worker.stats)
    await app.close()
    outcomes = list(rec.outcomes)

    # the worker stays up
    assert bad_settled, f"the bad message was neither acked nor quarantined; outcomes: {outcomes}"
    assert canary_done, "a valid job enqueued after the bad message did not complete: the worker is stuck"
    assert [(r.job, r.attempt, r.job_id) for r in runs if r.order_id == CANARY_ORDER] == [("mail", 1, CANARY_ID)]
    assert stats.get("abandoned", 0) == 0
    assert all(o.acked for o in outcomes)

    # the handler ran exactly as expected for the bad message
    bad_runs = [r for r in runs if r.order_id != CANARY_ORDER]
    bad_outcomes = [o for o in outcomes if o.job_id != CANARY_ID]
    assert [r.attempt for r in bad_runs] == list(exp.runs)
    assert {(r.job, r.order_id) for r in bad_runs} <= {(exp.job, 17)}
    if expected_id is not None:
        assert {r.job_id for r in bad_runs} <= {expected_id}
        assert {o.job_id for o in bad_outcomes} == {expected_id}
    if exp.outcome == "processed":
        assert [type(o.decision).__name__ for o in bad_outcomes] == ["Ack"]
    else:
        assert len(bad_outcomes) == max(1, len(exp.runs))
        assert bad_outcomes[-1].decision == Quarantine(exp.reason)

    # nothing lost, nothing left behind
    msgs = await drain(broker, "work.quarantine")
    for tier in TIERS:  # tiers first: a copy only ever moves from a tier to the work queue
        assert await depth(broker, f"work.retry.{tier}") == 0, tier
    assert await depth(broker, "work") == 0
    if exp.outcome == "processed":
        assert msgs == []
    else:
        assert len(msgs) == 1
        msg = msgs[0]
        h: dict[str, Any] = dict(msg.headers)
        assert set(evidence.EVIDENCE_HEADERS) - set(h) <= {evidence.TENANT}  # no tenant: no tenant header
        assert h[evidence.REASON] == exp.reason
        assert h[evidence.ERROR_TYPE] == exp.error_type
        assert exp.error_message in str(h[evidence.ERROR_MESSAGE])
        assert h[evidence.JOB] == exp.job
        assert h[evidence.JOB_ID] == msg.message_id
        if expected_id is not None:
            assert msg.message_id == expected_id
        assert h[evidence.ORIGINAL_QUEUE] == "work"
        assert h[evidence.ORIGINAL_EXCHANGE] == "jobs"
        assert h[evidence.ORIGINAL_ROUTING_KEY] == "work"
        assert h[evidence.APP_VERSION] == "9.9.9"
        assert h[evidence.WORKER_PID] > 0
        if not exp.runs:
            assert h[evidence.TRACEBACK] == ""
        assert [k for k in h if k.startswith(copy_headers.BROKER_HEADER_PREFIXES)] == []
        # the message itself is kept: body byte for byte, properties, the publisher's headers
        _assert_body_kept(msg.body, case)
        assert msg.content_type == props.get("content_type")
        assert msg.content_encoding == props.get("content_encoding")
        assert msg.type == props.get("type")
        assert msg.correlation_id == props.get("correlation_id")
        for name, value in props.get("headers", {}).items():
            if name == envelope.ENQUEUED_AT and len(exp.runs) > 1:  # an unreadable one: the copy's timestamp's
                continue  # (copy_headers: a retry copy's timestamp is when it became ready; _enqueue_time_readable)
            if name.startswith(copy_headers.BROKER_HEADER_PREFIXES):  # removed from every copy (asserted above)
                continue
            if name != envelope.ATTEMPT or not exp.runs:  # a retried copy carries its own attempt
                assert h[name] == value, name
        # last, so that a known-wrong count (KNOWN_BUGS) can't hide another failure
        if h[evidence.ATTEMPTS] != exp.attempts:
            raise AttemptsEvidenceWrong(f"{evidence.ATTEMPTS} is {h[evidence.ATTEMPTS]}, expected {exp.attempts}")

    if exp.check is not None:
        exp.check(Seen(bad_runs, outcomes, msgs, caplog.text))
