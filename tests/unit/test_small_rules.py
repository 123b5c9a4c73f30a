"""Small rules with no broker: argument checks of the registry, the envelope, policies and durations."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from typing import Any

import pytest
from pydantic import BaseModel

from amqpjobs import App, ConfigurationError, JobContext, RetryPolicy
from amqpjobs.durations import parse_duration
from amqpjobs.jobs.envelope import MAX_JSON_DEPTH, DecodeError, decode_body, job_message
from amqpjobs.jobs.json_values import encode_payload
from amqpjobs.wire.urls import redact


class Order(BaseModel):
    order_id: int


class Other(BaseModel):
    order_id: int
    note: str = ""


def test_job_registration_refuses_bad_arguments():
    app = App("t")
    app.job("ok", queue="q")(lambda p, c: None)
    for kwargs, words in (
        ({"name": "", "queue": "q"}, "job name '' is empty or blank: give the job a name"),
        ({"name": "j" * 256, "queue": "q"}, "must be 1-255 UTF-8 bytes"),
        ({"name": "\u00e9" * 128, "queue": "q"}, r"must be 1-255 UTF-8 bytes \(got 256 bytes, 128 characters\)"),
        ({"name": "ok", "queue": "q"}, "job 'ok' is registered twice"),
        ({"name": "t1", "queue": "q", "timeout": "soon"}, "job 't1': timeout: 'soon' is not a duration"),
        ({"name": "t2", "queue": "q", "lease": -1}, "job 't2': lease:"),
        (
            {"name": "t3", "queue": "q", "timeout": "2m", "lease": "1m"},
            "lease 60s must be longer than the timeout 120s",
        ),
    ):
        with pytest.raises(ConfigurationError, match=words):
            app.job(**kwargs)
    with pytest.raises(ConfigurationError, match=r"no job 'nope' in app 't'; registered: ok$"):
        app.resolve("nope")
    with pytest.raises(ConfigurationError, match="no job"):
        app.resolve(lambda p, c: None)


def test_job_registration_refuses_a_handler_that_cannot_take_payload_and_ctx():
    """The worker calls handler(payload, ctx): a handler that can't take it failed every run (retried, quarantined)."""
    app = App("t")

    async def one(payload: Any) -> None: ...

    def three(payload: Any, ctx: Any, extra: Any) -> None: ...

    async def keyword_only(*, payload: Any, ctx: Any) -> None: ...

    with pytest.raises(ConfigurationError) as raised:
        app.job("one", queue="q")(one)
    assert str(raised.value) == (
        "job 'one': the worker calls its handler as handler(payload, ctx), and one(payload: 'Any') -> 'None' "
        "can't be called so (too many positional arguments); fix: take two parameters, e.g. "
        "async def one(payload, ctx)"
    )
    with pytest.raises(ConfigurationError, match=r"three\(payload: 'Any', ctx: 'Any', extra: 'Any'\).*"
                       r"\(missing a required argument: 'extra'\)"):  # fmt: skip
        app.job("three", queue="q")(three)
    with pytest.raises(ConfigurationError, match=r"\(too many positional arguments\)"):
        app.job("kw", queue="q")(keyword_only)
    with pytest.raises(ConfigurationError) as raised:
        app.job("p", queue="q")(functools.partial(three, 1, 2))
    assert str(raised.value).endswith(
        "partial(three, ...)(extra: 'Any') -> 'None' can't be called so (too many positional "
        "arguments); fix: take two parameters, e.g. async def handler(payload, ctx)"
    )
    with pytest.raises(ConfigurationError, match=r"job 'n': the handler must be callable \(got int 5\)"):
        app.job("n", queue="q")(5)  # type: ignore[type-var]

    def gen(payload: Any, ctx: Any) -> Any:
        yield 1

    async def agen(payload: Any, ctx: Any) -> Any:
        yield 1

    for name, generator in (("gen", gen), ("agen", agen)):
        with pytest.raises(ConfigurationError) as raised:
            app.job(name, queue="q")(generator)
        assert str(raised.value) == (
            f"job {name!r}: the handler {generator.__name__} is a generator function (it has a yield): calling it "
            "runs none of its body; fix: return a value instead of yielding it"
        )
    assert app.get("one") is None  # nothing registered by a refusal
    assert app.get("three") is None

    # what can take (payload, ctx) is taken: defaults, *args, a bound method, a callable object
    async def defaults(payload: Any, ctx: Any = None, more: int = 1) -> None: ...

    def star(*args: Any) -> None: ...

    class Sender:
        async def send(self, payload: Any, ctx: Any) -> None: ...

        def __call__(self, payload: Any, ctx: Any) -> None: ...

    def needs_db(payload: Any, ctx: Any, db: str) -> None: ...

    @functools.wraps(needs_db)
    def with_db(payload: Any, ctx: Any) -> None:  # a decorator's wrapper: its own signature is what is called
        return needs_db(payload, ctx, "db")

    for name, handler in (("d", defaults), ("s", star), ("m", Sender().send), ("c", Sender()), ("w", with_db)):
        app.job(name, queue="q")(handler)
        assert app.get(name) is not None


def test_payloads_are_validated_and_converted():
    app = App("t")
    app.job("typed", queue="q", payload=Order)(lambda p, c: None)
    app.job("free", queue="q")(lambda p, c: None)
    typed, free = app.resolve("typed"), app.resolve("free")
    assert typed.to_json(Other(order_id=3, note="x")) == {"order_id": 3}  # another model: through its dump
    assert typed.to_json(Order(order_id=4)) == {"order_id": 4}
    assert free.to_json(Order(order_id=5)) == {"order_id": 5}  # no model: a model's JSON form
    with pytest.raises(ConfigurationError, match=r"job 'free': payload must be a dict or a pydantic model \(got list"):
        free.to_json([1, 2])


def test_transaction_is_refused_on_the_event_loop():
    """An async def handler's ``ctx.transaction()`` would block the loop (a retest: it was not refused); from a
    thread it is handed the ledger's transaction."""
    handed: list[str] = []

    def transaction() -> Any:
        handed.append("tx")
        return contextlib.nullcontext("db")

    ctx = JobContext(job="j", job_id="1", attempt=1, max_attempts=1, tenant=None, queue="q", redelivered=False,
                     enqueued_at=None, headers={}, ledger_transaction=transaction)  # fmt: skip

    async def on_the_loop() -> None:
        with pytest.raises(ConfigurationError, match=r"job 'j': ctx.transaction\(\) was called on the event loop"):
            ctx.transaction()
        with await asyncio.to_thread(ctx.transaction) as db:  # asyncio.to_thread: a thread of its own
            assert db == "db"

    asyncio.run(on_the_loop())
    assert handed == ["tx"]


def test_transaction_needs_an_idempotent_job():
    ctx = JobContext(job="j", job_id="1", attempt=1, max_attempts=1, tenant=None, queue="q", redelivered=False,
                     enqueued_at=None, headers={})  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"job 'j': transaction\(\) needs @app.job\(..., idempotent=True\)"):
        ctx.transaction()


def test_encoding_refuses_what_strict_json_cannot_carry():
    with pytest.raises(ValueError, match=r"payload\[.x.\] = nan \(NaN and Infinity are not JSON"):
        encode_payload({"x": float("nan")})
    with pytest.raises(ValueError, match="a value JSON can't carry"):
        encode_payload({"x": {1, 2}})
    looped: dict[str, object] = {"a": [1]}
    looped["self"] = looped
    with pytest.raises(ValueError, match="circular reference") as raised:  # not "NaN or Infinity": it holds neither
        encode_payload(looped)
    assert str(raised.value) == (
        "payload holds a circular reference (a dict or list inside itself), which JSON can't carry"
    )
    with pytest.raises(ValueError, match="job_id must be 1-255 UTF-8 bytes"):
        job_message("j", {}, job_id="i" * 256, now=0)
    assert job_message("j", {}, job_id="\u00e9" * 127 + "i", now=0).message_id == "\u00e9" * 127 + "i"  # 255 bytes
    with pytest.raises(ValueError, match="priority must be an integer 0-255"):
        job_message("j", {}, job_id="i", now=0, priority=256)


def test_nesting_depth_counts_brackets_outside_strings_only():
    wide: dict[str, Any] = {"items": [[] for _ in range(MAX_JSON_DEPTH * 2)]}  # many brackets, depth 3
    assert decode_body(json.dumps(wide).encode(), None, None) == wide
    tricky = {"s": "[" * 100 + '\\"{' * 50, "t": "]]"}  # brackets and escaped quotes inside strings
    assert decode_body(json.dumps(tricky).encode(), None, None) == tricky
    deep: Any = {}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"d": deep}
    with pytest.raises(DecodeError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        decode_body(json.dumps(deep).encode(), None, None)


def test_encoding_refuses_nesting_a_worker_would_not_read():
    """A worker decodes at most MAX_JSON_DEPTH levels (deeper: quarantined undecodable); enqueue refuses more."""
    at_limit: Any = 1
    for _ in range(MAX_JSON_DEPTH - 1):
        at_limit = [at_limit]
    body = encode_payload({"d": at_limit})  # the payload object is level 1
    assert decode_body(body, None, None) == {"d": at_limit}
    words = (
        f"the payload is nested deeper than {MAX_JSON_DEPTH} levels (dicts and lists inside each other), more than a "
        "worker reads (it would quarantine the job as undecodable); fix: flatten it, or send the deep part as a "
        "JSON string"
    )
    for deeper in ({"d": [at_limit]}, {"d": {"e": at_limit}}):
        with pytest.raises(ValueError, match="nested deeper") as raised:
            encode_payload(deeper)
        assert str(raised.value) == words
    very: Any = 1
    for _ in range(5000):  # json.dumps's own RecursionError
        very = [very]
    with pytest.raises(ValueError, match="nested deeper") as raised:
        encode_payload({"v": very})
    assert str(raised.value) == words
    wide = {"rows": [[i, [i]] for i in range(500)], "s": "[[[[" * 100}  # many brackets, shallow
    assert decode_body(encode_payload(wide), None, None) == wide


def test_policies_and_durations_refuse_nonsense():
    with pytest.raises(ConfigurationError, match="max_attempts must be a whole number >= 1"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigurationError, match="immediate_retries must be a whole number >= 0"):
        RetryPolicy(immediate_retries=-1)
    for bad in (2.5, True, "3"):  # an outsider's: 2.5 ran twice, then said "above max_attempts 2.5"
        with pytest.raises(ConfigurationError, match=r"max_attempts must be a whole number >= 1 \(got"):
            RetryPolicy(max_attempts=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"permanent must be a tuple of exception classes"):
        RetryPolicy(permanent=("ValueError",))  # type: ignore[arg-type]  # each failure was a worker-error
    with pytest.raises(ConfigurationError, match="immediate_wait must be seconds >= 0"):
        RetryPolicy(immediate_wait=float("nan"))
    assert RetryPolicy(max_attempts=3, permanent=(ValueError, KeyError)).max_attempts == 3
    with pytest.raises(ValueError, match="is not a duration; give seconds or a string"):
        parse_duration([30])  # type: ignore[arg-type]
    assert redact("amqp://u:p@[::1") == "<unparseable URL>"


def test_encoding_refuses_a_key_json_would_rewrite_and_names_it():
    """json.dumps turns 1, None, True, 1.5 keys into strings: the job would not get the key it was given."""
    with pytest.raises(ValueError, match="not a str") as raised:
        encode_payload({"a": [{"ok": 1}, {7: "x"}]})
    assert str(raised.value) == (
        "the payload has a key that is not a str: payload['a'][1] has the key 7 (an int); JSON object keys are "
        "strings, so the job would get '7'; fix: write the key as a str"
    )
    keys: tuple[tuple[Any, str], ...] = ((None, "'null'"), (True, "'true'"), (1.5, "'1.5'"))
    for key, gets in keys:
        with pytest.raises(ValueError, match=f"so the job would get {gets}"):
            encode_payload({key: 1})
    with pytest.raises(ValueError, match=r"a lone surrogate '\\ud800' at index 1, which UTF-8 can't encode"):
        encode_payload({"s": "a\ud800"})
    # what json.dumps writes as given is still taken: an int past 64 bits (orjson refuses it), a str subclass key
    assert encode_payload({"n": 2**70}) == b'{"n":1180591620717411303424}'

    class Name(str):
        pass

    assert encode_payload({Name("k"): "v\u00e9"}) == '{"k":"v\u00e9"}'.encode()
