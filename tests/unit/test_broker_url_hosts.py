"""Host names a connect could never use are refused when the URL is read, naming the host and the fix.

A host (or ``server_name_indication``) that Python's socket and ssl modules can't encode
(an empty or over-long label, a character IDNA refuses, a NUL) used to pass the URL check
and fail only at connect: a traceback out of every CLI command, and ``App.enqueue`` waiting
forever (aio-pika's robust connection retries an unexpected error without end).
"""

from __future__ import annotations

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.settings import broker_settings

SECRET = "S3cretPw"
LONG_LABEL = "a" * 64


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"amqp://u:{SECRET}@a..b:5672/", "host 'a..b' is not a host name: label empty or too long"),
        (
            f"amqp://u:{SECRET}@{LONG_LABEL}.com:5672/",
            f"host '{LONG_LABEL}.com' is not a host name: label empty or too long",
        ),
        (f"amqp://u:{SECRET}@.b:5672/", "host '.b' is not a host name"),
        (f"amqp://u:{SECRET}@a\u202eb:5672/", "host 'a\\u202eb' is not a host name"),
        (f"amqp://u:{SECRET}@[::1]x:5672/", "'[::1]x:5672' is not an IPv6 address in brackets with an optional port"),
        (f"amqp://u:{SECRET}@[::1]:5672x/", "port '5672x' is not a number"),
        (
            f"amqps://u:{SECRET}@h:5671/?server_name_indication=a%00b",
            "server_name_indication 'a\\x00b' is not a host name",
        ),
        (
            f"amqps://u:{SECRET}@h:5671/?server_name_indication=a..b",
            "server_name_indication 'a..b' is not a host name: label empty or too long",
        ),
        (
            f"amqps://u:{SECRET}@h:5671/?server_name_indication=%E2%80%AE",
            "server_name_indication '\\u202e' is not a host name",
        ),
        (
            f"amqps://u:{SECRET}@h:5671/?server_name_indication=",
            "server_name_indication is empty: give the host name the certificate names, or disable",
        ),
    ],
)
def test_a_host_no_connect_could_use_is_refused_when_the_url_is_read(url: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        broker_settings(url)
    assert words in str(err.value)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    "management_url",
    ["http://a..b:15672", f"http://{LONG_LABEL}.com:15672", f"http://u:{SECRET}@a..b:15672", "http://[::1]x:15672"],
)
def test_a_management_url_whose_host_no_request_could_use_is_refused(management_url: str) -> None:
    with pytest.raises(ConfigurationError, match="management URL") as err:
        broker_settings("amqp://u:p@h:5672/", management_url)
    assert "is not a host name" in str(err.value) or "IPv6 address in brackets" in str(err.value)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:p@rabbit-1.internal:5672/",
        "amqp://u:p@bücher.example:5672/",  # IDNA: sent as xn--bcher-kva.example
        "amqp://u:p@host.example.:5672/",  # a fully qualified name's trailing dot
        "amqp://u:p@10.0.0.5:5672/",
        "amqp://u:p@[::1]:5672/",
        "amqp://u:p@[::1]/",
        "amqp://u:p@my_host:5672/",  # an underscore: not a DNS name, but /etc/hosts may have it
        "amqps://u:p@10.0.0.5:5671/?server_name_indication=rmq1.internal",
        "amqps://u:p@10.0.0.5:5671/?server_name_indication=disable",
    ],
)
def test_the_hosts_a_connect_can_use_are_taken(url: str) -> None:
    broker_settings(url)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:p@h1/,amqp://u:p@h1:5672/",  # no port: the scheme's, 5672
        "amqps://u:p@h1:5671/,amqps://u:p@h1/",  # amqps: 5671
        "amqp://u:p@[::1]:5672/,amqp://u:p@[0:0::1]:5672/",  # one IPv6 address written two ways
        "amqp://u:p@[::ffff:7f00:1]:5672/,amqp://u:p@[::FFFF:127.0.0.1]:5672/",
    ],
)
def test_a_node_named_twice_in_other_words_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="names the same node as broker URL 1: give each node once"):
        broker_settings(url)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"amqp://u:{SECRET}@h:5672/%FF", "the vhost (the path) holds a %-escape that is no UTF-8"),
        (f"amqp://u%FF:{SECRET}@h:5672/", "the user holds a %-escape that is no UTF-8"),
        (f"amqp://u:{SECRET}%E9@h:5672/", "the password holds a %-escape that is no UTF-8"),
    ],
)
def test_a_percent_escape_that_is_no_utf8_is_refused_not_read_two_ways(url: str, words: str) -> None:
    # aiormq logs in with the text as written ("u%FF"), the management API was asked with "u\ufffd"
    with pytest.raises(ConfigurationError) as err:
        broker_settings(url)
    assert words in str(err.value)
    assert "%-encode each byte of its UTF-8" in str(err.value)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"amqp://u:{SECRET}%ZZ@h:5672/", "the password holds a '%' starting no %-escape: write % as %25"),
        (f"amqp://u:{SECRET}%@h:5672/", "the password holds a '%' starting no %-escape"),
        (f"amqp://u%4:{SECRET}@h:5672/", "the user holds a '%' starting no %-escape"),
        (f"amqp://u:{SECRET}@h:5672/v%2", "the vhost (the path) holds a '%' starting no %-escape"),
        # helper-227: said "no UTF-8": the bare % is what breaks the %C3 before it
        (f"amqp://gu%C3%ZZest:{SECRET}@h:5672/", "the user holds a '%' starting no %-escape: write % as %25"),
    ],
)
def test_a_percent_that_starts_no_escape_is_refused_not_sent_as_written(url: str, words: str) -> None:
    # helper-226: a password with "%ZZ" was sent literally and failed as a login, unexplained
    with pytest.raises(ConfigurationError) as err:
        broker_settings(url)
    assert words in str(err.value)
    assert SECRET not in str(err.value)


def test_a_percent_written_as_25_is_a_percent() -> None:
    assert broker_settings("amqp://u:p%25w@h:5672/").password == "p%w"
