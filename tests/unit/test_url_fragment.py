"""A '#' in an AMQP URL is refused: the vhost it cuts short is another vhost, used without a word.

Before, on the real 3.10 node: with vhosts ``a`` and ``a#b``, ``AMQPJOBS_URL=amqp://guest:guest@127.0.0.1:5798/a#b
amqpjobs topology apply`` created its 9 objects in vhost ``a`` and printed ``applied to
amqp://guest:***@127.0.0.1:5798/a#b``: Python's URL parser reads ``#b`` as a fragment and drops it.
A '#' in a password was refused already (the '@' after it leaves the host part).
"""

from __future__ import annotations

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.settings import broker_settings


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@127.0.0.1:5672/a#b",
        "amqp://guest:guest@127.0.0.1:5672/a#",
        "amqp://guest:guest@127.0.0.1:5672/#",
        "amqp://guest:guest@127.0.0.1:5672#/a",
        "amqp://guest:guest@127.0.0.1:5672/a?heartbeat=5#x",
        "amqp://guest:guest@127.0.0.1:5672/a,amqp://guest:guest@127.0.0.2:5672/a#b",
    ],
)
def test_a_hash_in_an_amqp_url_is_refused_with_the_fix(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        broker_settings(url)
    said = str(refused.value)
    assert "'#'" in said, said
    assert "%23" in said, said
    assert "guest:guest" not in said, said


def test_an_encoded_hash_is_the_vhost() -> None:
    assert broker_settings("amqp://guest:guest@127.0.0.1:5672/a%23b").vhost == "a#b"


def test_a_hash_in_a_password_is_still_said_as_before() -> None:
    with pytest.raises(ConfigurationError, match="# as %23"):
        broker_settings("amqp://guest:pa#ss@127.0.0.1:5672/a")
