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
