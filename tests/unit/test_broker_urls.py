"""Several broker URLs (the nodes of one cluster): parsing, redaction and refusal (issue 23)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from aio_pika import RobustConnection

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.settings import broker_settings
from amqpjobs.wire.tls import split_tls_options, ssl_context
from amqpjobs.wire.urls import redact

TWO = "amqp://guest:s3cret@h1:5701/jobs, amqp://guest:s3cret@h2:5702/jobs"


def test_a_list_is_the_nodes_of_one_vhost_with_a_management_api_each():
    s = broker_settings(TWO)
    assert s.nodes == ("amqp://guest:s3cret@h1:5701/jobs", "amqp://guest:s3cret@h2:5702/jobs")
    assert s.vhost == "jobs"
    assert (s.username, s.password) == ("guest", "s3cret")
    assert s.management_urls == ("http://h1:15701", "http://h2:15702")
    assert s.management_url == "http://h1:15701"
    assert broker_settings(TWO, "http://m:9999/").management_urls == ("http://m:9999",)
    moved = s.with_vhost("a b")
    assert moved.nodes == ("amqp://guest:s3cret@h1:5701/a%20b", "amqp://guest:s3cret@h2:5702/a%20b")
    assert moved.vhost == "a b"
    assert broker_settings(moved.url).nodes == moved.nodes  # what a worker process is handed back


def test_every_url_of_a_list_is_redacted():
    s = broker_settings(TWO)
    assert s.safe_url == "amqp://guest:***@h1:5701/jobs,amqp://guest:***@h2:5702/jobs"
    assert "s3cret" not in s.safe_url
    assert redact("amqp://a:one@h1/,amqp://b:two@h2/") == "amqp://a:***@h1/,amqp://b:***@h2/"
    # a comma inside a password cuts the URL: neither half of the password is shown
    assert redact("amqp://u:pa,ss@h/") == "amqp://<unparseable URL>,<not a URL>"
    assert redact("amqp://u:pa,x://y@h/") == "amqp://<unparseable URL>,<not a URL>"  # even one that looks like a URL


def test_a_url_of_another_scheme_is_shown_redacted_so_its_error_names_what_was_given():
    assert redact("ftp://u:s3cret@h:15672/") == "ftp://u:***@h:15672/"  # helper-226: was '<not a URL>'
    with pytest.raises(ConfigurationError) as caught:
        broker_settings("amqp://guest:guest@127.0.0.1:5999/", "ftp://u:s3cret@h:15672/")
    assert str(caught.value).startswith("management URL 'ftp://u:***@h:15672/' is not an http(s) URL: give http://")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "amqp://u:Pw1@h1/a,amqp://u:Pw1@h2/b",
            r"broker URL 2 \(amqp://u:\*\*\*@h2/b\) names vhost 'b' but broker URL 1 names 'a'",
        ),
        (
            "amqp://u:Pw1@h1/a,amqp://v:Pw1@h2/a",
            r"broker URL 2 \(amqp://v:\*\*\*@h2/a\) has user 'v' but broker URL 1 has 'u'",
        ),
        (
            "amqp://u:Pw1@h1/a,amqp://u:Pw2@h2/a",
            r"broker URL 2 \(amqp://u:\*\*\*@h2/a\) has another password than broker URL 1",
        ),
        (
            "amqps://u:Pw1@h1/a,amqp://u:Pw1@h2/a",
            r"broker URL 2 \(amqp://u:\*\*\*@h2/a\) is amqp:// but broker URL 1 is amqps://",
        ),
        (
            "amqp://u:Pw1@h1/a,amqp://u:Pw,Tail@h2/a",
            r"bad broker URL 2 of 3 .*a comma inside a password must be %-encoded as %2C",
        ),
        ("amqp://u:Pw,Tail@h1/a", r"bad broker URL 1 of 2 .*a comma inside a password must be %-encoded as %2C"),
    ],
)
def test_a_list_of_different_vhosts_credentials_or_schemes_is_refused(url: str, message: str):
    with pytest.raises(ConfigurationError, match=message) as caught:
        broker_settings(url)
    for secret in ("Pw", "Tail"):
        assert secret not in str(caught.value)


def test_an_encoded_comma_in_a_password_is_one_url():
    s = broker_settings("amqp://u:pa%2Css@h1/a,amqp://u:pa%2Css@h2/a")
    assert s.password == "pa,ss"
    assert len(s.nodes) == 2
    assert s.safe_url == "amqp://u:***@h1/a,amqp://u:***@h2/a"


def test_tls_options_are_taken_out_of_the_url_and_checked(tmp_path: Path):
    plain, options = split_tls_options("amqps://u:p@h:5671/v?heartbeat=5&cacertfile=/ca.pem&verify=verify_peer")
    assert plain == "amqps://u:p@h:5671/v?heartbeat=5"
    assert options == {"cacertfile": "/ca.pem", "verify": "verify_peer"}
    with pytest.raises(
        ConfigurationError, match="verify='verify_maybe' is not a TLS option; use verify_peer or verify_none"
    ):
        ssl_context({"verify": "verify_maybe"})
    with pytest.raises(ConfigurationError, match="keyfile is given without certfile"):
        ssl_context({"keyfile": "/k.pem"})
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigurationError, match=f"cacertfile='{missing}' can't be used"):
        ssl_context({"cacertfile": str(missing)})
    verified = ssl_context({})
    assert (verified.verify_mode, verified.check_hostname) == (ssl.CERT_REQUIRED, True)
    unverified = ssl_context({"verify": "verify_none"})
    assert (unverified.verify_mode, unverified.check_hostname) == (ssl.CERT_NONE, False)


def test_aio_pika_still_makes_each_connect_attempt_where_the_cluster_connection_hooks_in():
    # ClusterConnection moves to the next node when an attempt fails by overriding this
    # name-mangled method of aio-pika's RobustConnection; an aio-pika that renames it must fail here.
    assert callable(getattr(RobustConnection, "_RobustConnection__connect_transport", None))
    name = "_RobustConnection__connect_transport"
    assert getattr(ClusterConnection, name) is not getattr(RobustConnection, name)
