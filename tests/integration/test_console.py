"""Issue 26: the web console's routes and its security, through Starlette's TestClient, on the real broker.

The client runs the app in a thread of its own; the worker (when one runs) runs in the test's
event loop, so every request goes through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from starlette.testclient import TestClient

from amqpjobs import SqliteResults
from amqpjobs.console.app import create_app
from amqpjobs.console.config import PASSWORD_ENV, TOKEN_ENV, USER_ENV, ConsoleConfig, Credentials
from amqpjobs.runtime.quarantine import mover_lock, session
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.console_env import (
    BASE,
    CSRF,
    Handler,
    client,
    failing_app,
    free_port,
    quarantine_jobs,
    quarantine_six,
    wait_done,
)
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_job_status import app_module
from tests.integration.worker_env import running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture
def quarantined(broker: BrokerSettings, tmp_path: Path) -> Handler:
    """6 real failures in work.quarantine (:func:`~tests.integration.console_env.quarantine_six`)."""
    return quarantine_six(broker, tmp_path)


def test_a_foreign_host_header_is_refused_even_on_loopback(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        assert c.get("/").status_code == 200
        for host in ("evil.example", "evil.example:8480", "127.0.0.1.evil.example", "[::2]:8480"):
            answer = c.get("/", headers={"Host": host})
            assert answer.status_code == 403, host
            assert "work" not in answer.text
        assert c.get("/", headers={"Host": "localhost:8480"}).status_code == 200
        assert c.get("/", headers={"Host": "[::1]:8480"}).status_code == 200


def test_the_overview_shows_the_status_figures_and_links_the_quarantine(broker, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        page = c.get("/")
    assert page.status_code == 200
    row = re.search(r'<tr class="unhealthy" data-job-queue="work">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    assert '<a href="/quarantine?queue=work.quarantine">6</a>' in row.group(1)
    assert "6 message(s) in quarantine work.quarantine" in page.text  # the status problem line
    assert page.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self'")


def test_groups_by_stack_fingerprint_and_the_group_page(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        groups = re.findall(r'<tr class="group" data-group="(\w+)">\s*<td class="count">(\d+)</td>', page.text)
        fingerprints = re.findall(r'class="group-link"[^>]*>([^<]*)</a>', page.text)
        assert sorted(int(n) for _, n in groups) == [3, 3]
        # exception type @ frames outermost first (the worker's own, then the handler's), no line numbers
        assert sorted((f.split(" @ ")[0], f.split(" &gt; ")[-2:]) for f in fingerprints) == [
            ("KeyError", ["integration.console_env:mail", "integration.console_env:render"]),
            ("ValueError", ["integration.console_env:mail", "integration.console_env:send"]),
        ]
        assert all(f.split(" @ ")[1].startswith("runtime.runs:") and "line" not in f for f in fingerprints)
        value_group = next(g for (g, _), f in zip(groups, fingerprints, strict=True) if "ValueError" in f)
        one = c.get("/quarantine", params={"queue": "work.quarantine", "group": value_group})
        search = c.get("/quarantine", params={"queue": "work.quarantine", "search": "mail 4"})
    assert re.findall(r'class="message-link"[^>]*>([^<]*)<', one.text) == ["m-0", "m-2", "m-4"]
    assert re.findall(r'class="message-link"[^>]*>([^<]*)<', page.text) == [f"m-{i}" for i in range(6)]
    assert '<span id="matched">3</span>' in one.text
    assert re.findall(r'class="message-link"[^>]*>([^<]*)<', search.text) == ["m-4"]


def test_posts_without_the_right_csrf_token_are_refused_and_move_nothing(broker, tmp_path: Path, quarantined):
    form = {"queue": "work.quarantine", "scope": "all"}
    with client(broker, tmp_path) as c:
        missing = c.post("/actions/park", data=form)
        wrong = c.post("/actions/park", data={**form, "csrf_token": "guessed"})
        wrong_header = c.post("/actions/park", data=form, headers={"X-CSRF-Token": CSRF[:-1]})
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        assert f'name="csrf_token" value="{CSRF}"' in page.text  # every action form carries it
    assert [r.status_code for r in (missing, wrong, wrong_header)] == [403, 403, 403]
    assert "CSRF" in missing.text
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
    assert (tmp_path / "audit.jsonl").read_text() == ""  # no action, no audit line


def test_read_only_offers_no_action_and_refuses_posts(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path, read_only=True) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        message = c.get("/message", params={"queue": "work.quarantine", "id": "m-0"})
        post = c.post("/actions/park", data={"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF})
    assert page.status_code == message.status_code == 200
    assert "<form" in page.text  # the filter form stays
    assert 'method="post"' not in page.text + message.text
    assert 'type="checkbox"' not in page.text
    assert post.status_code == 403
    assert "read-only" in post.text
    assert asyncio.run(depth(broker, "work.quarantine")) == 6


def test_beyond_loopback_the_cli_exits_2_without_credentials(broker: BrokerSettings, monkeypatch):
    for name in (TOKEN_ENV, USER_ENV, PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    result = cli(broker, "console", "--host", "0.0.0.0", "--port", "0")
    assert result.exit_code == 2, result.output
    assert TOKEN_ENV in result.output
    assert "not loopback" in result.output
    monkeypatch.setenv(USER_ENV, "ops")  # half of basic auth is no credential either
    assert cli(broker, "console", "--host", "0.0.0.0").exit_code == 2


def test_with_credentials_every_request_must_authenticate_and_no_page_shows_them(broker, tmp_path: Path, quarantined):
    token, password = "tok-sekret-41f0-9b7c2e", "pw-sekret-9a2c"
    creds = Credentials(token=token, user="ops", password=password)
    with client(broker, tmp_path, host="10.1.2.3", credentials=creds) as c:
        anonymous = c.get("/", headers={"Host": "10.1.2.3:8480"})
        bad = c.get("/", headers={"Host": "10.1.2.3:8480", "Authorization": "Bearer nope"})
        bearer = c.get("/", headers={"Host": "10.1.2.3:8480", "Authorization": f"Bearer {token}"})
        basic = base64.b64encode(f"ops:{password}".encode()).decode()
        auth = {"Host": "10.1.2.3:8480", "Authorization": f"Basic {basic}"}
        pages = [c.get(path, headers=auth, params=params) for path, params in (
            ("/", {}), ("/quarantine", {"queue": "work.quarantine"}), ("/audit", {}),
            ("/message", {"queue": "work.quarantine", "id": "m-1"}),
        )]  # fmt: skip
        parked = c.post("/actions/park", headers={**auth, "X-CSRF-Token": CSRF},
                        data={"queue": "work.quarantine", "scope": "selected", "job_id": "m-1"})  # fmt: skip
        assert parked.status_code == 303, parked.text
        progress = wait_done(c, parked.headers["location"].replace(BASE, ""), auth)
        audit_page = c.get("/audit", headers=auth)
    assert anonymous.status_code == bad.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic")
    assert bearer.status_code == 200
    assert all(p.status_code == 200 for p in pages)
    assert progress.get("state") == "done", progress
    entry = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[-1])
    assert (entry["who"], entry["action"], entry["result"]) == ("ops", "park", "ok")
    shown = "".join(p.text for p in [*pages, audit_page]) + (tmp_path / "audit.jsonl").read_text()
    for secret in (token, password, "guest:guest", basic):
        assert secret not in shown


def test_a_script_in_payload_and_error_is_text_on_every_page(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        listing = c.get("/quarantine", params={"queue": "work.quarantine"}).text
        message = c.get("/message", params={"queue": "work.quarantine", "id": "m-1"}).text
    for text in (listing, message):
        assert "<script>alert" not in text
        assert "<img src=x" not in text
        assert "&lt;script&gt;alert(" in text
    assert "&lt;img src=x onerror=alert(2)&gt;" in message  # in the payload, the error and the traceback
    assert message.count("<script") == 1  # the console's own, from /static
    assert '<script src="/static/console.js" defer></script>' in message


def test_the_message_page_shows_evidence_traceback_payload_and_headers(broker, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        page = c.get("/message", params={"queue": "work.quarantine", "id": "m-2"})
        missing = c.get("/message", params={"queue": "work.quarantine", "id": "m-99"})
    assert page.status_code == 200
    assert '<strong id="reason">exhausted</strong>' in page.text
    assert "ValueError: bad address for mail 2" in page.text
    assert re.search(r'<pre class="traceback" id="traceback">Traceback \(most recent call last\):.*in send', page.text,
                     re.S)  # fmt: skip
    assert (
        '<pre class="payload" id="payload">{\n  &#34;n&#34;: 2,\n  &#34;note&#34;: &#34;ok&#34;\n}</pre>' in page.text
    )
    assert "<th>amqpjobs-original-queue</th><td>work</td>" in page.text
    assert "<th>message_id</th><td>m-2</td>" in page.text
    assert re.search(r"<th>timestamp</th><td>20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\d+\)</td>", page.text)
    assert '<p id="history">Never replayed.</p>' in page.text
    assert missing.status_code == 404
    assert "no message of job" in missing.text


def test_purge_needs_the_queue_name_typed_out(broker: BrokerSettings, tmp_path: Path, quarantined):
    form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "reason": "exhausted"}
    with client(broker, tmp_path) as c:
        refused = c.post("/actions/purge", data={**form, "confirm": "work"})
        assert asyncio.run(depth(broker, "work.quarantine")) == 6
        done = c.post("/actions/purge", data={**form, "confirm": "work.quarantine", "job": "mail",
                                               "error_type": "KeyError"})  # fmt: skip
        progress = wait_done(c, done.headers["location"].replace(BASE, ""))
    assert refused.status_code == 400
    assert "type the queue&#39;s name" in refused.text
    assert (progress["state"], progress["moved"]) == ("done", 3), progress
    assert asyncio.run(depth(broker, "work.quarantine")) == 3


def test_an_action_meets_the_clis_mover_lock(broker: BrokerSettings, tmp_path: Path, quarantined):
    async def held() -> dict[str, Any]:
        async with session(broker) as connection, mover_lock(connection, broker, "work.quarantine", "replay"):
            with client(broker, tmp_path) as c:
                started = await asyncio.to_thread(
                    c.post, "/actions/park", data={"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF}
                )
                return await asyncio.to_thread(wait_done, c, started.headers["location"].replace(BASE, ""))

    progress = asyncio.run(held())
    assert progress["state"] == "failed"
    assert re.search(r"replay .*pid", progress["summary"]), progress["summary"]
    assert asyncio.run(depth(broker, "work.quarantine")) == 6
    entry = json.loads((tmp_path / "audit.jsonl").read_text())
    assert (entry["action"], entry["result"]) == ("park", "error")


async def test_replay_with_a_canary_from_the_page_then_park_the_rest(broker: BrokerSettings, tmp_path: Path):
    handler = Handler()
    app = await failing_app(broker, tmp_path, handler)
    await quarantine_jobs(broker, app, 6)
    handler.broken = False  # the fix is deployed
    with client(broker, tmp_path) as c:
        async with running_worker(app, broker):
            page = await asyncio.to_thread(c.get, "/quarantine", params={"queue": "work.quarantine"})
            value_group = re.search(r'data-group="(\w+)">(?:(?!</tr>).)*ValueError @', page.text, re.S)
            assert value_group is not None
            form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "group": value_group.group(1),
                    "rate": "20", "canary": "1", "canary_timeout": "20s"}  # fmt: skip
            started = await asyncio.to_thread(c.post, "/actions/replay", data=form)
            assert started.status_code == 303
            run = started.headers["location"].replace(BASE, "")
            progress = await asyncio.to_thread(wait_done, c, run)
            rest = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF}
            parked = await asyncio.to_thread(c.post, "/actions/park", data=rest)
            park_progress = await asyncio.to_thread(wait_done, c, parked.headers["location"].replace(BASE, ""))
            audit = await asyncio.to_thread(c.get, "/audit")
            lookup = await asyncio.to_thread(c.get, "/job", params={"id": "m-3"})
    await app.close()
    assert progress["state"] == "done", progress
    assert (progress["moved"], progress["phase"], progress["canary_moved"]) == (3, "rest", 1)
    assert progress["summary"].startswith("replayed 3, skipped 3, left 3 in work.quarantine (")
    assert sorted(handler.succeeded) == ["m-0", "m-2", "m-4"]
    assert (park_progress["state"], park_progress["moved"], park_progress["target"]) == ("done", 3, "work.parked")
    assert await depth(broker, "work.quarantine") == 0
    assert await depth(broker, "work.parked") == 3
    entries = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["action"], e["result"]) for e in entries] == [("replay", "ok"), ("park", "ok")]
    assert sorted(entries[0]["job_ids"]) == ["m-0", "m-2", "m-4"]
    assert entries[0]["params"]["canary"] == 1
    assert entries[0]["params"]["rate"] == 20.0
    assert audit.text.count('<tr class="entry result-ok">') == 2
    assert (
        '<ul id="found-in"><li><a href="/message?queue=work.parked&amp;id=m-3">work.parked</a></li></ul>' in lookup.text
    )


async def test_with_app_the_overview_lists_its_job_queues_and_lookup_reads_the_results_store(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    handler = Handler()
    app = await failing_app(broker, tmp_path, handler)
    app.results = SqliteResults(tmp_path / "results.db")
    await quarantine_jobs(broker, app, 2)
    await app.close()
    ref = app_module(tmp_path, f"sqlite:{tmp_path / 'results.db'}", monkeypatch,
                     "@app.job('mail', queue='work')\ndef mail(payload: dict, ctx: object) -> None: ...\n")  # fmt: skip
    with client(broker, tmp_path, app_ref=ref) as c:
        overview = await asyncio.to_thread(c.get, "/")
        before = await asyncio.to_thread(c.get, "/job", params={"id": "m-1"})
        parked = await asyncio.to_thread(
            c.post, "/actions/park", data={"queue": "work", "scope": "selected", "job_id": "m-1", "csrf_token": CSRF}
        )
        progress = await asyncio.to_thread(wait_done, c, parked.headers["location"])
        after = await asyncio.to_thread(c.get, "/job", params={"id": "m-1"})
        unknown = await asyncio.to_thread(c.get, "/job", params={"id": "nobody"})
        bad = await asyncio.to_thread(c.get, "/job", params={"id": "x" * 300})
    assert re.findall(r'data-job-queue="([^"]+)"', overview.text) == ["work"]  # the job queues of the app's topology
    assert "job m-1: quarantined" in before.text
    assert '<a href="/message?queue=work.quarantine&amp;id=m-1">work.quarantine</a>' in before.text
    assert (progress["state"], progress["moved"], progress["target"]) == ("done", 1, "work.parked")
    assert "job m-1: parked" in after.text  # the park was recorded in the app's results store
    assert '<span id="where">work.parked (found by browsing)</span>' in after.text  # job show's line
    assert "not in any quarantine or parked queue" in unknown.text
    assert bad.status_code == 400


def test_an_audit_log_that_cannot_be_written_is_exit_2_before_serving(broker: BrokerSettings, tmp_path: Path):
    (tmp_path / "a-file").write_text("")
    result = cli(broker, "console", "--port", "0", "--audit-log", str(tmp_path / "a-file" / "audit.jsonl"))
    assert result.exit_code == 2, result.output
    assert "a-file/audit.jsonl' can't be written" in result.output
    assert "--audit-log PATH" in result.output


def test_a_broker_down_is_a_503_naming_it_without_credentials(tmp_path: Path):
    """Every page that reads the broker answers 503 within the console's connect wait, not a worker's 30 s."""
    port = free_port()  # nothing listens there
    down = broker_settings(f"amqp://ops:pw-sekret@127.0.0.1:{port}/", f"http://ops:pw-sekret@127.0.0.1:{port}")
    assert down.connect_timeout == 30.0
    took: dict[str, float] = {}
    pages: dict[str, Any] = {}
    with client(down, tmp_path) as c:
        asked = {"/": {}, "/fragments/overview": {}, "/quarantine": {"queue": "work.quarantine"},
                 "/message": {"queue": "work.quarantine", "id": "m-1"}, "/job": {"id": "m-1"}}  # fmt: skip
        for path, params in asked.items():
            started = time.monotonic()
            pages[path] = c.get(path, params=params)
            took[path] = time.monotonic() - started
    assert {path: page.status_code for path, page in pages.items()} == dict.fromkeys(pages, 503)
    assert [path for path, seconds in took.items() if seconds > 10] == [], took  # CONNECT_WAIT is 2 s
    for path in ("/", "/quarantine", "/message", "/job"):
        assert f"127.0.0.1:{port}" in pages[path].text, path
    assert "pw-sekret" not in "".join(page.text for page in pages.values())


def test_the_unknown_option_is_selected_only_when_chosen(broker: BrokerSettings, tmp_path: Path, quarantined):
    async def a_message_naming_no_job() -> None:
        async with raw_channel(broker) as channel:
            await channel.default_exchange.publish(aio_pika.Message(b"{}", message_id="stray-1"), "work.quarantine")

    asyncio.run(a_message_naming_no_job())
    with client(broker, tmp_path) as c:
        unfiltered = c.get("/quarantine", params={"queue": "work.quarantine"})
        unknown = c.get("/quarantine", params={"queue": "work.quarantine", "job": "(unknown)"})
        mail = c.get("/quarantine", params={"queue": "work.quarantine", "job": "mail"})

    def chosen(page: str) -> list[str]:
        return re.findall(r'<option value="([^"]*)" selected>', page)

    assert '<option value="(unknown)">(unknown)</option>' in unfiltered.text
    assert chosen(unfiltered.text) == []  # no filter: "any" everywhere, nothing else selected
    assert '<span id="matched">7</span>' in unfiltered.text
    assert chosen(unknown.text) == ["(unknown)"]
    assert '<span id="matched">1</span>' in unknown.text
    assert re.findall(r'class="message-link"[^>]*>([^<]*)<', unknown.text) == ["stray-1"]
    assert chosen(mail.text) == ["mail"]
    assert '<span id="matched">6</span>' in mail.text


@pytest.mark.parametrize("root", ["", "/jobs"])
def test_every_url_is_root_relative_honoring_root_path(broker: BrokerSettings, tmp_path: Path, quarantined, root: str):
    """Behind a TLS proxy (and under a path prefix, ``--root-path``) no link names a scheme or host."""
    config = ConsoleConfig(broker, audit_path=tmp_path / "audit.jsonl")
    with TestClient(create_app(config, csrf_token=CSRF), base_url=BASE, root_path=root, follow_redirects=False) as c:
        pages = [c.get(path, params=params).text for path, params in (
            ("/", {}), ("/fragments/overview", {}), ("/quarantine", {"queue": "work.quarantine"}), ("/audit", {}),
            ("/message", {"queue": "work.quarantine", "id": "m-1"}), ("/job", {"id": "m-1"}),
        )]  # fmt: skip
        started = c.post("/actions/park", data={"queue": "work.quarantine", "scope": "selected", "job_id": "m-1",
                                                "csrf_token": CSRF})  # fmt: skip
        location = started.headers["location"]
        pages.append(c.get(location).text)
        script = c.get(f"{root}/static/console.js")
    assert re.fullmatch(rf"{root}/action/\w+", location), location
    assert script.status_code == 200
    assert f'<link rel="stylesheet" href="{root}/static/console.css">' in pages[0]
    assert f'<script src="{root}/static/console.js" defer></script>' in pages[0]
    assert f'<body data-root="{root}">' in pages[0]  # the script's fetches and event stream start there
    for page in pages:
        assert "http://" not in page
        assert "https://" not in page
        urls = re.findall(r'(?:href|src|action|formaction|data-refresh|data-poll)="([^"]*)"', page)
        assert urls
        assert [u for u in urls if not u.startswith((f"{root}/", "data:"))] == [], urls


async def test_a_failed_canary_is_reported_as_canary_failed_not_stopped(broker: BrokerSettings, tmp_path: Path):
    handler = Handler()  # still broken: the canary fails again
    app = await failing_app(broker, tmp_path, handler)
    await quarantine_jobs(broker, app, 2)
    with client(broker, tmp_path) as c:
        async with running_worker(app, broker):
            form = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF, "rate": "20", "canary": "1",
                    "canary_timeout": "20s"}  # fmt: skip
            started = await asyncio.to_thread(c.post, "/actions/replay", data=form)
            assert started.status_code == 303
            run = started.headers["location"].replace(BASE, "")
            progress = await asyncio.to_thread(wait_done, c, run)
            page = await asyncio.to_thread(c.get, run)
    await app.close()
    assert progress["state"] == "canary failed", progress
    assert progress["details"][0].startswith("canary failed: 1 of 1 did not succeed"), progress
    assert '<strong id="state" class="state-canary-failed">canary failed</strong>' in page.text
    entries = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["action"], e["result"]) for e in entries] == [("replay", "canary failed")]
    assert await depth(broker, "work.quarantine") == 2


def test_a_message_page_without_an_id_is_a_400_naming_it(broker: BrokerSettings, tmp_path: Path):
    with client(broker, tmp_path) as c:
        answer = c.get("/message", params={"queue": "work.quarantine"})
    assert answer.status_code == 400, answer.text
    assert "id: give the job id" in answer.text


def test_a_wrong_action_url_or_queue_field_is_a_404_or_400_naming_it(broker: BrokerSettings, tmp_path: Path):
    """A URL typed or kept by hand (an action that does not exist, one forgotten) and a post without its queue."""
    with client(broker, tmp_path) as c:
        kind = c.post("/actions/launch", data={"queue": "work.quarantine", "csrf_token": CSRF})
        page = c.get("/action/no-such-run")
        progress = c.get("/action/no-such-run.json")
        stop = c.post("/action/no-such-run/stop", data={"csrf_token": CSRF})
        empty = c.post("/actions/purge", data={"queue": "", "scope": "all", "csrf_token": CSRF})
        control = c.post("/actions/park", data={"queue": "work\x1b[2J", "scope": "all", "csrf_token": CSRF})
        lookup = c.get("/job")
    assert (kind.status_code, page.status_code, progress.status_code, stop.status_code) == (404, 404, 404, 404)
    assert "launch" in kind.text
    assert "replay, park, unpark or purge" in kind.text
    assert "no such action (the console keeps the last 200; see the audit log)" in page.text
    assert "no such action (the console keeps the last 200; see the audit log)" in stop.text
    assert progress.json() == {"error": "no such action"}
    assert (empty.status_code, control.status_code) == (400, 400)
    assert "give a quarantine or parked queue name" in empty.text
    assert "has control characters; queue names are printable text" in control.text
    assert lookup.status_code == 200
    assert 'name="id"' in lookup.text
    assert not (tmp_path / "audit.jsonl").exists() or (tmp_path / "audit.jsonl").read_text() == ""
