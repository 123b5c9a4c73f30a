"""A quarantined message's key (issue 26 review, item 8): its job id, else a stable hash of headers and body."""

from __future__ import annotations

import datetime as dt

from amqpjobs.jobs.message_key import message_key
from amqpjobs.jobs.quarantine import Selection, describe

AT = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
DEATH = {"x-death": [{"reason": "expired", "queue": "work", "count": 1, "time": AT}]}


def test_the_job_id_is_the_key_when_there_is_one() -> None:
    assert message_key("m-1", DEATH, b"x") == "m-1"
    assert describe(DEATH, "m-1", None, b"x").key == "m-1"


def test_without_a_job_id_the_key_hashes_headers_and_body() -> None:
    key = message_key("", DEATH, b"body")
    assert key.startswith("sha256:")
    assert len(key) == len("sha256:") + 16
    assert message_key("", dict(DEATH), b"body") == key  # the same message browsed again
    assert message_key("", DEATH, b"body!") != key
    assert message_key("", {}, b"body") != key
    item = describe(DEATH, None, None, b"body")
    assert (item.job_id, item.key) == ("", key)
    assert Selection(job_ids=frozenset({key})).matches(item)
    assert not Selection(job_ids=frozenset({message_key("", {}, b"other")})).matches(item)
    assert describe(DEATH, None, None).key == ""  # described without its body: no key to give
