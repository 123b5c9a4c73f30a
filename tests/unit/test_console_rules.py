"""The console's pure rules (issue 26): Host names, loopback, credentials from the environment."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from amqpjobs.console.audit import AuditEntry, AuditLog
from amqpjobs.console.config import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    ConsoleConfig,
    Credentials,
    check_bind,
    credentials_from_env,
    is_loopback,
)
from amqpjobs.console.forms import filter_options, selection_of
from amqpjobs.console.security import MAX_FORM, Guard, host_name
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.wire.settings import broker_settings

HOSTS = [
    ("127.0.0.1:8480", "127.0.0.1"),
    ("LocalHost:8480", "localhost"),
    ("localhost", "localhost"),
    ("[::1]:8480", "::1"),
    ("[::1]", "::1"),
    ("::1", "::1"),  # no port can be told apart: the name as it is
    ("evil.example:80", "evil.example"),
    ("", ""),
]


@pytest.mark.parametrize(("header", "name"), HOSTS)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("::1", True), ("[::1]", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("console.internal", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_credentials_from_env_and_the_bind_rule(tmp_path: Path) -> None:
    broker = broker_settings("amqp://guest:guest@127.0.0.1:5672/", None)
    assert credentials_from_env({}) == Credentials()
    assert credentials_from_env({TOKEN_ENV: "t" * 16}).required
    assert credentials_from_env({USER_ENV: "u", PASSWORD_ENV: "p"}).required
    with pytest.raises(ConfigurationError, match=f"set both {USER_ENV} and {PASSWORD_ENV}"):
        credentials_from_env({USER_ENV: "u"})
    assert "sekret" not in repr(Credentials(token="sekret-0123456789", user="u", password="sekret"))
    check_bind(ConsoleConfig(broker, audit_path=tmp_path / "a"))  # loopback: no credentials needed
    with pytest.raises(ConfigurationError, match="not loopback"):
        check_bind(ConsoleConfig(broker, host="0.0.0.0", audit_path=tmp_path / "a"))
    check_bind(
        ConsoleConfig(broker, host="0.0.0.0", credentials=Credentials(token="t" * 16), audit_path=tmp_path / "a")
    )


def test_host_names_allowed() -> None:
    broker = broker_settings("amqp://guest:guest@127.0.0.1:5672/", None)
    assert ConsoleConfig(broker).host_names() == {"127.0.0.1", "localhost", "::1"}
    wildcard = ConsoleConfig(broker, host="0.0.0.0", allowed_hosts=("Jobs.Example.com",))
    assert wildcard.host_names() == {"127.0.0.1", "localhost", "::1", "jobs.example.com"}
    assert ConsoleConfig(broker, host="10.0.0.5").host_names() == {"127.0.0.1", "localhost", "::1", "10.0.0.5"}


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_the_audit_log_refuses_a_number_json_has_not(tmp_path: Path, number: float) -> None:
    """NaN and Infinity are no JSON (RFC 8259 section 6): a line holding one is refused, not written."""
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append(AuditEntry("2026-11-30T00:00:00.000Z", "ops", "127.0.0.1", "replay", "q", {"rate": 1.5}, "ok", "s"))
    with pytest.raises(ValueError, match="JSON compliant"):
        log.append(AuditEntry("2026-11-30T00:00:01.000Z", "ops", "::1", "replay", "q", {"rate": number}, "ok", ""))
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert json.loads(line)["params"] == {"rate": 1.5}


def test_audit_lines_that_are_no_entries_are_skipped_whatever_they_hold(tmp_path: Path) -> None:
    """A torn, hand-edited or foreign line (bytes that are not UTF-8, a field of the wrong type) is skipped.

    The audit page and every message page (its audit entries) read the whole log: one such line
    made both a 500.
    """
    log = AuditLog(tmp_path / "audit.jsonl")
    good = AuditEntry("2026-11-30T00:00:00.000Z", "ops", "127.0.0.1", "replay", "q", {"rate": 1.5}, "ok", "s", ["m-1"])
    log.append(good)
    fields = json.dumps({**json.loads(json.dumps(good.__dict__)), "job_ids": None})
    with (tmp_path / "audit.jsonl").open("ab") as fh:
        fh.write(b"\xff\xfe not UTF-8\n")
        fh.write(fields.encode() + b"\n")  # job_ids null
        fh.write(fields.replace('"summary": "s"', '"summary": 5').replace("null", '["m-1"]').encode() + b"\n")
        fh.write(fields.replace("null", '"m-1"').encode() + b"\n")  # a string, not a list: no substring match
        fh.write(b'{"at": "2026-11-30T00:00:01.000Z"}\n[1, 2]\n"text"\n')
    log.append(good)
    assert log.recent() == [good, good]
    assert log.for_job("m-1") == [good, good]
    assert log.for_job("m") == []


def test_filter_options_select_the_unknown_one_only_when_it_is_chosen() -> None:
    """A job (or reason) present as "" is the "(unknown)" option; no filter chosen selects none of them."""
    present = ["", "mail"]
    assert filter_options(present, "") == [("(unknown)", "(unknown)", False), ("mail", "mail", False)]
    assert filter_options(present, "(unknown)") == [("(unknown)", "(unknown)", True), ("mail", "mail", False)]
    assert filter_options(present, "mail") == [("(unknown)", "(unknown)", False), ("mail", "mail", True)]
    query = QueryParams({"job": "(unknown)", "reason": "exhausted", "search": "(unknown)"})
    assert selection_of(query) == Selection(job="", reason="exhausted", search="(unknown)")
    assert selection_of(QueryParams({"job": ""})) == Selection()


MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe())'"
BAD_TOKENS = [
    pytest.param("", "is set but blank", id="empty"),
    pytest.param("   ", "is set but blank", id="blank"),
    pytest.param("hunter2", "is 7 characters: give one of at least 16", id="short"),
    pytest.param("x" * 15, "is 15 characters: give one of at least 16", id="one-short"),
    pytest.param("0123456789abcdef\n", "holds whitespace", id="newline-from-a-file"),
]


@pytest.mark.parametrize(("token", "why"), BAD_TOKENS)
def test_a_blank_or_short_token_is_refused_saying_how_to_make_one(token: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        credentials_from_env({TOKEN_ENV: token})
    assert f"{TOKEN_ENV} {why}" in str(refused.value)
    assert MAKE_ONE in str(refused.value)
    assert token.strip() == "" or token.strip() not in str(refused.value)  # the secret is never repeated
    with pytest.raises(ConfigurationError, match=r"at least 16|blank|whitespace"):
        Credentials(token=token)  # the rule holds for the Python API too
    assert credentials_from_env({TOKEN_ENV: "x" * 16}).token == "x" * 16


@pytest.mark.parametrize(
    ("root_path", "ok"),
    [("", True), ("/jobs", True), ("/ops/jobs-2", True), ("jobs", False), ("/jobs/", False), ("/", False),
     ("/a b", False), ('/x"onload=', False), ("//evil.example", False)],
)  # fmt: skip
def test_a_root_path_is_a_plain_url_path(root_path: str, ok: bool) -> None:
    broker = broker_settings("amqp://guest:guest@127.0.0.1:5672/", None)
    if ok:
        assert ConsoleConfig(broker, root_path=root_path).root_path == root_path
    else:
        with pytest.raises(ConfigurationError, match="is not a path like /jobs"):
            ConsoleConfig(broker, root_path=root_path)


def _guarded(credentials: Credentials) -> TestClient:
    """A one-route app behind the console's Guard: it answers the user and the size of the body it read."""

    async def echo(request: Request) -> PlainTextResponse:
        body = await request.body()
        return PlainTextResponse(f"{request.scope['state']['user']}:{len(body)}")

    broker = broker_settings("amqp://guest:guest@127.0.0.1:5672/", None)
    config = ConsoleConfig(broker, credentials=credentials)
    app = Guard(Starlette(routes=[Route("/", echo, methods=["GET", "POST", "PUT"])]), config, csrf_token="c" * 20)
    return TestClient(app, base_url="http://127.0.0.1:8480")


def test_the_guard_refuses_a_malformed_basic_header_takes_the_token_as_a_password_and_bounds_bodies() -> None:
    token = "tok-0123456789abcdef"
    c = _guarded(Credentials(token=token, user="ops", password="pw-0123456789"))

    def basic(text: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(text.encode()).decode()}

    assert c.get("/", headers={"Authorization": "Basic not-base64!"}).status_code == 401
    assert c.get("/", headers=basic("ops:wrong")).status_code == 401
    assert c.get("/", headers=basic(f"ci:{token}")).text == "ci:0"  # any user name with the token: that name
    assert c.get("/", headers=basic(f":{token}")).text == "token:0"
    put = c.put("/", headers=basic(f"ci:{token}"))
    assert (put.status_code, put.text) == (405, "method not allowed")
    csrf = {"X-CSRF-Token": "c" * 20, **basic(f"ci:{token}")}
    assert c.post("/", headers=csrf, content=b"x" * MAX_FORM).text == f"ci:{MAX_FORM}"  # the body, replayed
    big = c.post("/", headers=csrf, content=b"x" * (MAX_FORM + 1))
    assert (big.status_code, big.text) == (413, "request body too large")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("!!!", "job_id: a checked message's key is not base64url (got '!!!')"),  # was read as "": 0 parked, "ok"
        ("Y3RsLRtbMkoH4oCuYWJj!!!", "is not base64url (got 'Y3RsLRtbMkoH4oCuYWJj!!!')"),  # was cut to its start
        ("__4=", "job_id: a checked message's key is not UTF-8 text once decoded (got '__4=')"),
        ("", None),  # an empty field is no key
    ],
)
def test_a_checked_keys_base64url_is_read_strictly(value: str, words: str | None) -> None:
    """helper-230: the decoding dropped what was not base64url, and said "not base64url" of valid base64url."""
    if words is None:
        assert selection_of(QueryParams({"job_key64": value})) == Selection()
        return
    with pytest.raises(ConfigurationError) as caught:
        selection_of(QueryParams({"job_key64": value}))
    assert words in str(caught.value)
    key = "ctl-\x1b[2J\u202eabc"
    sent = base64.urlsafe_b64encode(key.encode()).decode()
    assert selection_of(QueryParams({"job_key64": sent})).job_ids == frozenset({key})
    assert selection_of(QueryParams({"job_key64": sent.rstrip("=")})).job_ids == frozenset({key})  # padding optional
