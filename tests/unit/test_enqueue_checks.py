"""What ``enqueue`` refuses before it connects (README "Enqueueing"), and where the broker settings come from."""

from __future__ import annotations

from typing import Any

import pytest

from amqpjobs import App
from amqpjobs.errors import ConfigurationError
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import broker_settings
from amqpjobs.wire.urls import redact

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "plain"
exchange = "jobs"

[[job_queue]]
name = "ranked"
exchange = "jobs"
max_priority = 5

[[job_queue]]
name = "spread"
exchange = "jobs"
shards = 4
"""


def nested(depth: int, inner: Any, kind: type) -> Any:
    for _ in range(depth):
        inner = [inner] if kind is list else {"k": inner}
    return inner


NOWHERE = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens: a publish let through would fail to connect


@pytest.fixture
def app(tmp_path: Any) -> App:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    app = App("checks", topology=load_topology(tmp_path / "t.toml").topology, url=NOWHERE)
    app.job("p", queue="plain")(lambda p, c: None)
    app.job("r", queue="ranked")(lambda p, c: None)
    app.job("s", queue="spread")(lambda p, c: None)
    app.job("k", queue="plain", key=lambda p: p["k"])(lambda p, c: None)
    return app


@pytest.mark.parametrize(
    ("key", "words"),
    [  # review 29: named a job_id the caller never gave
        ("\u00e9" * 128, "job 'k': its key function returned '\u00e9\u00e9"),
        ("\u00e9" * 128, "which can't be a job id: job_id must be 1-255 UTF-8 bytes (got 256 bytes, 128 characters)"),
        ("\u00e9" * 128, "fix: return a shorter key (for a long one, a hash of it"),
        ("a\ud800", "its key function returned 'a\\ud800', which can't be a job id: job_id 'a\\ud800' is not UTF-8"),
        (
            "a\rb",
            "its key function returned 'a\\rb', which can't be a job id: job_id 'a\\rb' holds a control or "
            "invisible character",
        ),
        ("a\rb", "fix: return a key without them (or a hash of it"),
        ("order-42\n", "job_id 'order-42\\n' begins or ends with a blank"),
        ("order-42 ", "fix: return it stripped (key.strip())"),
        ("order\u200b42", "(\\u200b at 5)"),
    ],
)
async def test_a_key_functions_result_that_cant_be_a_job_id_is_named_as_its(app: App, key: str, words: str):
    with pytest.raises(ConfigurationError) as caught:
        await app.enqueue("k", {"k": key})
    assert words in str(caught.value)
    assert app._connection is None


@pytest.mark.parametrize(
    ("job", "kwargs", "words"),
    [
        ("p", {"priority": 1}, "job queue 'plain' has no priorities (max_priority in the topology)"),
        ("p", {"priority": 0}, "job queue 'plain' has no priorities"),
        ("r", {"priority": 6}, "priority 6 is above job queue 'ranked''s max_priority 5"),
        ("r", {"priority": True}, "priority must be an int (got True)"),
        ("p", {"headers": {"x-trace": "1"}}, "header 'x-trace': names starting 'x-' or 'amqpjobs-' are reserved"),
        ("p", {"headers": {"amqpjobs-attempt": 3}}, "header 'amqpjobs-attempt': names starting 'x-' or 'amqpjobs-'"),
        ("p", {"headers": {"AMQPJOBS-Tenant": "a"}}, "header 'AMQPJOBS-Tenant': names starting"),
        ("p", {"job_id": " "}, "job_id is empty or blank"),
        ("p", {"tenant": ""}, "tenant is empty"),
        # review18: a bare UnicodeEncodeError (sharded) or words about header types (not sharded)
        ("s", {"tenant": "a\ud800"}, "tenant 'a\\ud800' is not UTF-8 text (a lone surrogate at 1)"),
        ("p", {"tenant": "a\ud800"}, "tenant 'a\\ud800' is not UTF-8 text (a lone surrogate at 1)"),
        ("p", {"headers": {"h": "a\ud800"}}, "header 'h': value is not UTF-8 text (a lone surrogate at 1)"),
        # a tenant other than it looks: its own fairness slot and shard, apart from "acme" (helper-205)
        (
            "p",
            {"tenant": " acme "},
            "tenant ' acme ' has whitespace at its start or end: it would be a tenant "
            "apart from 'acme' (its own fairness slot and shard); fix: tenant='acme'",
        ),
        ("s", {"tenant": "acme\n"}, "tenant 'acme\\n' has whitespace at its start or end"),
        ("p", {"tenant": "\u3000acme"}, "fix: tenant='acme'"),
        ("p", {"tenant": "acme\u2028"}, "tenant 'acme\\u2028' has whitespace at its start or end"),
        ("p", {"tenant": "ac\x00me"}, "tenant 'ac\\x00me' holds a control or invisible character (\\x00 at 2)"),
        ("s", {"tenant": "ac\x1b[31mme"}, "(\\x1b at 2); a tenant is shown in logs"),
        ("p", {"tenant": "a\u202ecme"}, "holds a control or invisible character (\\u202e at 1)"),
        ("p", {"tenant": "acme\x85x"}, "(\\x85 at 4)"),
        ("p", {"tenant": "a\tb"}, "(\\t at 1)"),
        ("p", {"headers": {"h": {"k": [1, "\ud800"]}}}, "header 'h': value['k'][1] is not UTF-8 text"),
        # review18: a bare RecursionError 500 deep; a worker reads what is over 64 deep as None
        ("p", {"headers": {"deep": nested(65, 1, list)}}, "is nested more than 64 deep"),
        ("p", {"headers": {"deep": nested(500, 1, list)}}, "is nested more than 64 deep"),
        ("p", {"headers": {"deep": nested(500, 1, dict)}}, "is nested more than 64 deep"),
        ("p", {"job_id": 7}, "job_id must be a str (got int)"),
        # AMQP shortstr fields hold 255 bytes: 128 characters of 2 bytes each are 256
        ("p", {"job_id": "\u00e9" * 128}, "job_id must be 1-255 UTF-8 bytes (got 256 bytes, 128 characters)"),
        ("p", {"job_id": "i" * 256}, "job_id must be 1-255 UTF-8 bytes (got 256 bytes"),
        ("p", {"job_id": "i" * 256}, "fix: a shorter id (for a long key, a hash of it"),
        # a line feed or an escape in an id reads as another in logs and `job show` (helper-226)
        (
            "p",
            {"job_id": "order-42\nINFO forged"},
            "job_id 'order-42\\nINFO forged' holds a control or invisible character (\\n at 8)",
        ),
        ("s", {"job_id": "a\x1b[31mb"}, "(\\x1b at 1): a job id is shown in logs, status"),
        ("p", {"job_id": "a\u202eb"}, "(\\u202e at 1)"),
        ("p", {"job_id": "a\tb"}, "fix: leave such characters out"),
        # helper-229: a zero-width, blank-looking or end blank made an id apart that prints the same (its own
        # idempotency key: the side effect twice), and the words said such ids were refused
        (
            "p",
            {"job_id": "order-42\u200b"},
            "job_id 'order-42\\u200b' holds a control or invisible character (\\u200b at 8)",
        ),
        ("p", {"job_id": "\u200b"}, "(\\u200b at 0)"),
        ("p", {"job_id": "order\u3164"}, "(\\u3164 at 5)"),
        (
            "p",
            {"job_id": "order-42 "},
            "job_id 'order-42 ' begins or ends with a blank: a job apart from 'order-42' "
            "that prints the same (its own idempotency key); fix: job_id='order-42'",
        ),
        ("p", {"job_id": " lead"}, "begins or ends with a blank"),
        ("p", {"tenant": "ac\u200bme"}, "tenant 'ac\\u200bme' holds a control or invisible character (\\u200b at 2)"),
        ("p", {"headers": {"\u00e9" * 128: 1}}, "header name must be at most 128 UTF-8 bytes (got 256 bytes"),
    ],
)
async def test_enqueue_refuses_before_publishing(app: App, job: str, kwargs: dict[str, Any], words: str):
    with pytest.raises(ConfigurationError) as caught:
        await app.enqueue(job, {}, **kwargs)
    assert words in str(caught.value)
    assert app._connection is None  # never connected: nothing was sent


def test_management_url_is_derived_from_the_amqp_url(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AMQPJOBS_MANAGEMENT_URL", raising=False)
    monkeypatch.delenv("AMQPJOBS_URL", raising=False)
    s = broker_settings("amqp://ann:s%40cret@rabbit.internal:5673/prod%2Fa")
    assert (s.management_url, s.username, s.password, s.vhost) == (
        "http://rabbit.internal:15673", "ann", "s@cret", "prod/a",
    )  # fmt: skip
    assert broker_settings("amqp://h/").management_url == "http://h:15672"  # default port 5672
    assert broker_settings("amqps://h/").management_url == "https://h:15671"  # amqps: 5671, https
    assert broker_settings("amqp://h").vhost == "/"
    # credentials in a management URL are ignored: the AMQP URL's are used
    s = broker_settings("amqp://ann:pw@h:5672/", "https://root:other@mgmt.example:8443/rabbit/")
    assert (s.management_url, s.username, s.password) == ("https://mgmt.example:8443/rabbit", "ann", "pw")
    monkeypatch.setenv("AMQPJOBS_MANAGEMENT_URL", "http://elsewhere:9999")
    assert broker_settings("amqp://h/").management_url == "http://elsewhere:9999"
    monkeypatch.setenv("AMQPJOBS_URL", "amqp://env-user:pw@envhost:5682/v")
    assert broker_settings().url == "amqp://env-user:pw@envhost:5682/v"


def test_settings_refuse_bad_urls_and_never_print_passwords(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AMQPJOBS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="no broker URL: pass --url or set AMQPJOBS_URL"):
        broker_settings()
    with pytest.raises(ConfigurationError, match=r"bad broker URL http://guest:\*\*\*@h/: expected amqp://"):
        broker_settings("http://guest:secret@h/")
    with pytest.raises(ConfigurationError, match="bad broker URL"):
        broker_settings("amqp://h:notaport/")
    assert redact("amqp://guest:secret@h:5672/v") == "amqp://guest:***@h:5672/v"
    assert redact("amqp://guest@h/") == "amqp://guest@h/"
    assert redact("amqp://h/") == "amqp://h/"
    assert broker_settings("amqp://u:secret@h/").with_vhost("a b").safe_url == "amqp://u:***@h/a%20b"


def test_a_random_job_id_is_a_uuid4_in_its_usual_text():
    import uuid

    from amqpjobs.jobs.enqueue_args import random_job_id

    ids = {random_job_id() for _ in range(2_000)}
    assert len(ids) == 2_000
    for job_id in ids:
        parsed = uuid.UUID(job_id)
        assert str(parsed) == job_id  # lower-case hex, dashes 8-4-4-4-12
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
    # every other bit varies: 122 random bits, as uuid4's
    bits = [uuid.UUID(job_id).int for job_id in ids]
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert all(any(b >> i & 1 for b in bits) and not all(b >> i & 1 for b in bits)
               for i in range(128) if not fixed >> i & 1)  # fmt: skip


QUORUM_TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"

[[job_queue]]
name = "ranked-money"
exchange = "jobs"
type = "quorum"
max_priority = 10

[[job_queue]]
name = "ranked"
exchange = "jobs"
max_priority = 5
"""


@pytest.fixture
def quorum_app(tmp_path: Any) -> App:
    (tmp_path / "q.toml").write_text(QUORUM_TOPOLOGY)
    app = App("q", topology=load_topology(tmp_path / "q.toml").topology, url=NOWHERE)
    app.job("pay", queue="money")(lambda p, c: None)
    app.job("rush", queue="ranked-money")(lambda p, c: None)
    app.job("rank", queue="ranked")(lambda p, c: None)
    return app


#: (job, priority, broker version) -> the words of the refusal, None: taken. RabbitMQ 3.x quorum queues have
#: no priorities; 4.0 two levels (0-4 normal, 5+ high); 4.3 strict 0-31 with our max_priority (release notes).
BROKER_PRIORITY_CASES: list[tuple[str, int | None, tuple[int, ...], str | None]] = [
    ("pay", None, (3, 10, 8), None),  # no priority asked: nothing to ignore, on any version
    ("pay", 3, (3, 10, 8), "quorum queues have no priorities before RabbitMQ 4.0 (connected: 3.10.8)"),
    ("pay", 5, (3, 13, 7), "job 'pay': priority 5 can't be kept: job queue 'money' is a quorum queue"),
    ("pay", 0, (3, 10, 8), "nothing was sent"),  # explicit 0 too: as on a classic queue without max_priority
    ("pay", 9, (3, 10, 8), "leave priority out"),
    ("pay", 9, (3, 10, 8), 'or a classic job queue with max_priority (type = "classic", under a new name'),
    ("pay", 9, (3, 10, 8), "or upgrade the broker to RabbitMQ 4.0+"),
    ("pay", 0, (4, 0, 5), None),
    ("pay", 9, (4, 0, 5), None),  # 4.0-4.2: two levels, 9 is high
    ("pay", 255, (4, 2, 1), None),
    ("pay", 9, (4, 3, 6), None),  # 4.3 without max_priority: as before (README "RabbitMQ 3.10, 4.0 and 4.3")
    ("pay", 31, (4, 3, 6), None),
    ("pay", 32, (4, 3, 6), "quorum-queue priorities 0-31 (connected: 4.3.6), a higher one is delivered as 31"),
    ("pay", 255, (4, 3, 0), "Fix: a priority of 0-31 (a job without one counts as 4)"),
    ("rush", None, (3, 10, 8), None),
    ("rush", 3, (3, 10, 8), "quorum-queue priorities 0-31 need RabbitMQ 4.3+ (connected: 3.10.8)"),
    ("rush", 3, (4, 0, 5), "job 'rush': priority 3 can't be kept: job queue 'ranked-money' (quorum, max_priority"),
    ("rush", 3, (4, 2, 1), "4.0-4.2 quorum queues have two levels"),
    ("rush", 3, (4, 3, 0), None),
    ("rush", 10, (4, 3, 6), None),
    ("rank", 5, (3, 10, 8), None),  # classic: x-max-priority on every version
]


@pytest.mark.parametrize(("job", "priority", "version", "words"), BROKER_PRIORITY_CASES)
def test_a_priority_the_connected_broker_would_ignore_is_refused(
    quorum_app: App, job: str, priority: int | None, version: tuple[int, ...], words: str | None
):
    from amqpjobs.jobs.enqueue_args import check_broker_priority

    jobdef = quorum_app.resolve(job)
    layout = quorum_app.layout_of(jobdef)
    if words is None:
        check_broker_priority(jobdef, layout, priority, version)
        return
    with pytest.raises(ConfigurationError) as caught:
        check_broker_priority(jobdef, layout, priority, version)
    assert words in str(caught.value)


async def test_the_bounds_before_connecting_still_come_first(quorum_app: App):
    """A priority above max_priority is refused before any connect, whatever the broker (checked_job_id)."""
    with pytest.raises(ConfigurationError, match="priority 11 is above job queue 'ranked-money''s max_priority 10"):
        await quorum_app.enqueue("rush", {}, priority=11)
    assert quorum_app._connection is None


@pytest.mark.version_independent
@pytest.mark.parametrize("tenant", ["acme", "acme corp", "Zürich-7", "テナント", "🏢"])
def test_a_tenant_shown_as_it_is_passes_the_checks(app: App, tenant: str):
    """Inner spaces and any script pass (a tab anywhere is a control character: refused above)."""
    _, _, _, _, _, routing_key = app._addressed("s", {}, None, None, tenant)
    assert routing_key.startswith("spread")  # sharded by it, nothing refused


@pytest.mark.parametrize(
    "name",
    [
        "mail\nINFO forged", "mail\x1b[31m", "mail\u200b", "ma\u202eil", "mail\x00",
        # helper-228: blank-looking characters of other categories (Hangul fillers, Braille blank, CGJ, spaces)
        "mail\u3164", "mail\u115f", "mail\uffa0", "mail\u2800", "ma\u034fil", "mail\u17b4", "mail\u2000x",
        "mail\u3000x", "mail\u00a0x", "mail\ufe0f",
    ],
)  # fmt: skip
def test_a_job_name_with_a_control_or_invisible_character_is_refused_at_registration(name: str) -> None:
    app = App("names")
    with pytest.raises(ConfigurationError) as caught:
        app.job(name, queue="plain")(lambda p, c: None)
    assert "has a control or invisible character" in str(caught.value)
    assert "use printable characters" in str(caught.value)
    app.job("mail.send-é_1", queue="plain")(lambda p, c: None)  # printable: taken
    app.job("send mail", queue="plain")(lambda p, c: None)  # a space inside: taken


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("mail\ud800", "job name 'mail\\ud800' is not UTF-8 text (a lone surrogate at 4): no message can carry it"),
        ("mail ", "job name 'mail ' begins or ends with a blank: write it without"),
        (" mail", "job name ' mail' begins or ends with a blank: write it without"),
        (" ", "job name ' ' is empty or blank: give the job a name (@app.job('mail.send', ...))"),
        (123, "job name must be a str (got int 123)"),
        (None, "job name must be a str (got NoneType None)"),
        (b"mail", "job name must be a str (got bytes b'mail')"),
        # helper-228: a decomposed name (e + U+0301) and the composed one most keyboards write print the same
        ("cafe\u0301", "job name 'cafe\\u0301' is not in Unicode's composed form (NFC: 'caf\\xe9'): "
                        "a publisher writing it composed sends another job that prints the same; use "
                        "unicodedata.normalize('NFC', name)"),
    ],
)  # fmt: skip
def test_a_job_name_no_message_can_carry_or_that_prints_as_another_is_refused(name: object, words: str) -> None:
    app = App("names")
    with pytest.raises(ConfigurationError) as caught:
        app.job(name, queue="plain")(lambda p, c: None)  # type: ignore[arg-type]
    assert str(caught.value) == words


def test_an_app_name_not_in_nfc_is_refused_naming_its_composed_form() -> None:
    with pytest.raises(ConfigurationError) as caught:
        App("cafe\u0301")
    words = "App name 'cafe\\u0301' is not in Unicode's composed form (NFC: 'caf\\xe9'): another App"
    assert words in str(caught.value)
    assert App("caf\xe9").name == "caf\xe9"
