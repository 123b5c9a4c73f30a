"""The one password rule (:func:`amqpjobs.redaction.redact_text`) and the log formatters that apply it to every line."""

from __future__ import annotations

import logging
import sys

from amqpjobs.jobs.failure import describe
from amqpjobs.redaction import redact_text
from amqpjobs.runtime.logs import JsonFormatter, TextFormatter

SECRET = "s3cret"
URL = f"postgres://app:{SECRET}@db/orders"


def test_every_url_password_in_a_text_is_redacted_and_nothing_else_changes() -> None:
    text = f"a {URL}, then redis://:tok@cache:6379/0; amqp://guest@h/ and https://h/p?q=1 stay"
    assert redact_text(text) == (
        "a postgres://app:***@db/orders, then redis://:***@cache:6379/0; amqp://guest@h/ and https://h/p?q=1 stay"
    )
    assert redact_text("no url: user:pass@host") == "no url: user:pass@host"
    # helper-228: RFC 3986 lets a password hold "," and ";" unencoded: all of it is redacted, a list keeps its hosts
    assert redact_text("postgres://app:a,b@db/x and mysql://u:a;b@h/") == "postgres://app:***@db/x and mysql://u:***@h/"
    assert redact_text("amqp://u:p@h1,amqp://u:q@h2/") == "amqp://u:***@h1,amqp://u:***@h2/"
    # helper-228: a libpq keyword/value connection string's password was kept
    assert redact_text("host=db user=app password=s3cret dbname=x") == "host=db user=app password=*** dbname=x"
    assert redact_text("host=db Password = 'a b\\'c' port=5") == "host=db Password = *** port=5"
    assert redact_text("password_hint=x job=mail id=1") == "password_hint=x job=mail id=1"


def test_describe_redacts_the_message_and_the_traceback() -> None:
    try:
        raise ConnectionError(f"could not connect to {URL}")
    except ConnectionError as exc:
        kind, message, tb = describe(exc)
    assert (kind, message) == ("ConnectionError", "could not connect to postgres://app:***@db/orders")
    assert tb.endswith("ConnectionError: could not connect to postgres://app:***@db/orders\n")
    assert SECRET not in tb


def test_the_formatters_redact_a_password_in_any_message_and_traceback() -> None:
    try:
        raise ConnectionError(f"could not connect to {URL}")
    except ConnectionError:
        record = logging.LogRecord("app", logging.ERROR, __file__, 1, "sync failed: %s", (URL,), None)
        record.exc_info = sys.exc_info()
    for formatter in (TextFormatter(), JsonFormatter()):
        line = formatter.format(record)
        assert SECRET not in line
        assert line.count("postgres://app:***@db/orders") == 2  # the message, and the traceback's last line
        record.exc_text = None


def test_a_token_in_a_web_urls_user_part_is_redacted_a_brokers_user_name_is_kept() -> None:
    # helper-228: https://TOKEN@github.com (GitHub, GitLab oauth2:TOKEN@) was written as it came
    assert (
        redact_text("clone of https://ghp_abc123@github.com/o/r failed") == "clone of https://***@github.com/o/r failed"
    )
    assert redact_text("git+https://tok@h/r wss://t0k@h/s") == "git+https://***@h/r wss://***@h/s"
    assert redact_text("HTTPS://oauth2:glpat-x@gitlab.com/") == "HTTPS://oauth2:***@gitlab.com/"
    # a broker's or database's user name is no secret: kept
    assert (
        redact_text("amqp://guest@h/ amqps://app@h/ postgres://app@db/x")
        == "amqp://guest@h/ amqps://app@h/ postgres://app@db/x"
    )
    assert redact_text("https://h/p?q=1 https://h/a@b") == "https://h/p?q=1 https://h/a@b"


def test_a_credential_in_a_dict_json_query_string_or_auth_header_is_redacted() -> None:
    # helper-228: only libpq's password=... was redacted; an app's exception often prints a dict or a URL's query
    assert redact_text("bad config {'user': 'app', 'password': 's3cret', 'port': 5}") == (
        "bad config {'user': 'app', 'password': '***', 'port': 5}"
    )
    assert redact_text('{"db_password": "a\\"b", "api_key": "k-1", "refresh_token": null}') == (
        '{"db_password": "***", "api_key": "***", "refresh_token": ***}'
    )
    assert redact_text("Max retries exceeded with url: /v1/items?api_key=SECRET&page=2 (Caused by x)") == (
        "Max retries exceeded with url: /v1/items?api_key=***&page=2 (Caused by x)"
    )
    assert redact_text("GET /cb?access_token=abc.def&state=1") == "GET /cb?access_token=***&state=1"
    assert redact_text("headers: {'Authorization': 'Bearer eyJ.x.y'}") == "headers: {'Authorization': 'Bearer ***'}"
    assert redact_text("Authorization: Basic dXNlcjpwYXNz") == "Authorization: Basic ***"
    # a word that only ends like a key, and prose, are kept
    assert redact_text("token_count=5 tokens=3 secretary='Ann' the password is wrong") == (
        "token_count=5 tokens=3 secretary='Ann' the password is wrong"
    )
    # unchanged: a libpq pair as before
    assert redact_text("host=db user=app password=s3cret dbname=x") == "host=db user=app password=*** dbname=x"
    # a line of code in a traceback assigning such a name is kept (PEP 8 blanks around "="); libpq's password too
    assert redact_text("    token = waiter.result()") == "    token = waiter.result()"
    assert redact_text("host=db password = s3cret") == "host=db password = ***"
