"""Broker URLs a fresh user gets wrong (issue 23 review): run-together lists, IPv6, encodings, TLS options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trustme

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.cluster import process_order
from amqpjobs.wire.settings import broker_settings
from amqpjobs.wire.tls import ssl_context
from amqpjobs.wire.urls import node_address, redact, redact_text

PW = "Pw9secret"
OFF = " (0 turns heartbeats off)"


@pytest.mark.parametrize("sep", [" ", ";", "\t", "; ", " ;"])
def test_a_list_separated_by_blanks_or_semicolons_is_refused_without_its_password(sep: str):
    url = f"amqp://u:{PW}@h1:5672/v{sep}amqp://u:{PW}@h2:5672/v"
    with pytest.raises(ConfigurationError) as err:
        broker_settings(url)
    assert "separate the nodes of a cluster with commas" in str(err.value)
    assert PW not in str(err.value)
    assert PW not in redact(url)
    assert "Pw9" not in redact(url)


def test_a_url_holding_another_url_in_its_path_is_refused():
    with pytest.raises(ConfigurationError, match="separate the nodes of a cluster with commas"):
        broker_settings(f"amqp://u:{PW}@h1:5672/vamqp://u:{PW}@h2:5672/v")
    assert broker_settings("amqp://u:p@h/a%20b").vhost == "a b"  # an encoded blank is a vhost's own


def test_redact_text_redacts_every_userinfo_anywhere_in_a_message():
    text = f"x amqp://u:{PW}@h1/v y amqps://u:p#{PW}@h2:1/v; http://a:{PW}@m z,amqp://u:{PW}@h3/v"
    out = redact_text(text)
    assert PW not in out
    assert out == "x amqp://u:***@h1/v y amqps://u:***@h2:1/v; http://a:***@m z,amqp://u:***@h3/v"
    assert redact(f"amqp://u:{PW}@h1/v,amqp://u:{PW}@h2/v") == "amqp://u:***@h1/v,amqp://u:***@h2/v"


def test_ipv6_hosts_are_bracketed_in_every_url_built():
    s = broker_settings("amqp://u:p@[::1]:5682/v,amqp://u:p@[fe80::2]/v")
    assert s.management_urls == ("http://[::1]:15682", "http://[fe80::2]:15672")
    assert s.safe_url == "amqp://u:***@[::1]:5682/v,amqp://u:***@[fe80::2]/v"
    assert [node_address(n) for n in s.nodes] == ["[::1]:5682", "[fe80::2]:5672"]
    assert s.with_vhost("w").nodes == ("amqp://u:p@[::1]:5682/w", "amqp://u:p@[fe80::2]/w")


@pytest.mark.parametrize("char", ["#", "/", "?"])
def test_an_unencoded_reserved_character_in_a_single_url_shows_no_piece_of_the_password(char: str):
    for password in (f"SEC{char}ret", f"123{char}ret"):  # "123" would even pass as a port
        with pytest.raises(ConfigurationError) as err:
            broker_settings(f"amqp://u:{password}@h:5672/v")
        message = str(err.value)
        assert not [piece for piece in ("SEC", "123", "ret") if piece in message]
        assert [code for code in ("%23", "%2F", "%3F", "%2C") if code in message] == ["%23", "%2F", "%3F", "%2C"]


def test_nodes_of_a_list_have_one_verification_policy_and_known_query_options_only():
    with pytest.raises(ConfigurationError, match="one certificate verification policy"):
        broker_settings("amqps://u:p@h1/v,amqps://u:p@h2/v?verify=verify_none")
    with pytest.raises(ConfigurationError) as err:
        broker_settings("amqps://u:p@h1/v?cacertfle=/ca.pem")
    assert "unknown query option 'cacertfle'" in str(err.value)
    assert "known ones: cacertfile, certfile, keyfile, verify, server_name_indication, heartbeat" in str(err.value)
    both = broker_settings("amqps://u:p@h1/v?heartbeat=5&cacertfile=/a.pem,amqps://u:p@h2/v?cacertfile=/b.pem")
    assert len(both.nodes) == 2  # per-node CA files and other options stay allowed


def test_a_node_given_twice_is_refused():
    with pytest.raises(ConfigurationError, match=r"broker URL 2 .* names the same node as broker URL 1"):
        broker_settings("amqp://u:p@H1:5672/v,amqp://u:p@h1:5672/v")


def test_one_shuffled_order_per_process_and_list():
    addresses = tuple(f"h{i}:5672" for i in range(8))
    first = process_order(addresses)
    assert sorted(first) == list(range(8))
    assert all(process_order(addresses) == first for _ in range(5))


def test_keyfile_problems_name_the_keyfile_and_what_is_wrong(tmp_path: Path):
    ca = trustme.CA()
    one, other = ca.issue_cert("a"), ca.issue_cert("b")
    cert, key, wrong, junk = (tmp_path / n for n in ("c.pem", "k.pem", "w.pem", "j.pem"))
    one.cert_chain_pems[0].write_to_path(str(cert))
    one.private_key_pem.write_to_path(str(key))
    other.private_key_pem.write_to_path(str(wrong))
    junk.write_text("not pem\n")
    cases = {
        f"keyfile='{tmp_path / 'none.pem'}' can't be read": {
            "certfile": str(cert),
            "keyfile": str(tmp_path / "none.pem"),
        },
        f"keyfile='{wrong}' does not match certfile='{cert}'": {"certfile": str(cert), "keyfile": str(wrong)},
        f"keyfile='{junk}' holds no PEM private key": {"certfile": str(cert), "keyfile": str(junk)},
        f"certfile='{cert}' holds no private key: give keyfile=": {"certfile": str(cert)},
        f"certfile='{junk}' holds no PEM certificate": {"certfile": str(junk), "keyfile": str(key)},
    }
    for message, options in cases.items():
        with pytest.raises(ConfigurationError) as err:
            ssl_context(options)
        assert message in str(err.value)
    ssl_context({"certfile": str(cert), "keyfile": str(key)})


def test_settings_copied_with_another_url_or_management_url_never_keep_the_old_nodes() -> None:
    # a relay in front of the broker (tests/amqp_frames.FrameTap) copies the settings with its own URL:
    # the copy kept the old nodes, so connections went around the relay
    from dataclasses import replace

    from amqpjobs.wire.settings import broker_settings

    two = broker_settings("amqp://u:p@127.0.0.1:5682/v,amqp://u:p@127.0.0.2:5682/v")
    relayed = replace(two, url="amqp://u:p@127.0.0.1:4000/v")
    assert relayed.nodes == ("amqp://u:p@127.0.0.1:4000/v",)
    assert relayed.node_management == ()
    other_api = replace(two, management_url="http://127.0.0.9:15999")
    assert other_api.management_urls == ("http://127.0.0.9:15999",)
    assert two.with_vhost("w").nodes == ("amqp://u:p@127.0.0.1:5682/w", "amqp://u:p@127.0.0.2:5682/w")


@pytest.mark.parametrize(
    ("query", "words"),
    [
        # aiormq reads a heartbeat it can't parse as 0: heartbeats off, silently
        ("heartbeat=abc", "heartbeat='abc' is not a whole number of seconds 0-65534 (0 turns heartbeats off)"),
        ("heartbeat=1.5", "heartbeat='1.5' is not a whole number of seconds 0-65534" + OFF),
        ("heartbeat=65535", "heartbeat='65535' is not a whole number of seconds 0-65534" + OFF),
        ("heartbeat=-1", "heartbeat='-1' is not a whole number of seconds 0-65534" + OFF),
        ("timeout=soon", "timeout='soon' is not a whole number of seconds of at least 1"),
        ("timeout=0", "timeout='0' is not a whole number of seconds of at least 1"),
        ("timeout=2.5", "timeout='2.5' is not a whole number of seconds of at least 1"),
        # aiormq knows PLAIN and EXTERNAL; another was refused by the broker's handshake, retried for 30 s
        ("auth=foo", "auth='foo' is not a mechanism amqpjobs speaks: use auth=plain (the default) or auth=external"),
        ("reconnect_interval=x", "reconnect_interval='x' is not a number of seconds of at least 0"),
        ("reconnect_interval=-2", "reconnect_interval='-2' is not a number of seconds of at least 0"),
        ("fail_fast=maybe", "fail_fast='maybe' is not true or false (1/0, yes/no, on/off)"),
        ("reconnect_interval=inf", "reconnect_interval='inf' is not a number of seconds of at least 0"),
        ("reconnect_interval=nan", "reconnect_interval='nan' is not a number of seconds of at least 0"),
        # review 21: aiormq reads the first of a repeated option (heartbeat=x&heartbeat=5 was heartbeats off)
        ("heartbeat=x&heartbeat=5", "option 'heartbeat' is given twice; give it once"),
        ("name=a&name=b", "option 'name' is given twice; give it once"),
        # the connection's name in the management UI and in the broker's log: a line feed forged a line there
        (
            "name=web%0Aforged",
            "name='web\\nforged' is not a connection name of 1-255 bytes without control or invisible characters",
        ),
        # helper-227: a zero-width space (the rule App() names now refuse) made a look-alike connection name
        (
            "name=web%E2%80%8Bshop",
            "name='web\\u200bshop' is not a connection name of 1-255 bytes without control or invisible characters",
        ),
        (
            "name=" + "n" * 256,
            f"name='{'n' * 256}' is not a connection name of 1-255 bytes without control or invisible characters",
        ),
        # aio-pika's fail_fast=false waits forever for a connect the broker refuses (bad credentials)
        (
            "fail_fast=0",
            "fail_fast=0 would make a refused connect wait forever; amqpjobs retries a connect itself "
            "(up to its connect wait): leave fail_fast out",
        ),
        (
            "auth=external",
            "auth=external is a TLS client certificate login: it needs amqps:// with certfile and "
            "keyfile (and the broker's rabbitmq_auth_mechanism_ssl plugin)",
        ),
        ("cacertfile=/ca.pem", "cacertfile is a TLS option and this URL is amqp:// (no TLS): use amqps://"),
        ("verify=verify_none", "verify is a TLS option and this URL is amqp:// (no TLS): use amqps://"),
    ],
)
def test_a_url_option_value_aiormq_would_misread_is_refused(query: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        broker_settings(f"amqp://u:secret@h1/v?{query}")
    assert str(err.value) == f"bad broker URL amqp://u:***@h1/v?{query}: {words}"
    with pytest.raises(ConfigurationError, match=r"broker URL 2 of 2 .*: " + re.escape(words.split(" ", 1)[0])):
        broker_settings(f"amqp://u:secret@h1/v,amqp://u:secret@h2/v?{query}")


def test_url_option_values_aiormq_reads_as_given_are_taken() -> None:
    ok = "heartbeat=0&timeout=3&auth=PLAIN&reconnect_interval=0.5&fail_fast=true&name=web%201"
    assert len(broker_settings(f"amqp://u:p@h1/v?{ok}").nodes) == 1
    assert (
        len(broker_settings("amqps://u:p@h1/v?auth=external&certfile=/c.pem&heartbeat=65534&fail_fast=YES").nodes) == 1
    )
    with pytest.raises(ConfigurationError, match="auth=external is a TLS client certificate login: it needs amqps://"):
        broker_settings("amqps://u:p@h1/v?auth=external")  # no certfile
