"""Which idempotent deliveries are keyed by their payload (amqpjobs.jobs.message_key.keyed_again)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.message_key import (
    GENERATED_PREFIX,
    PAYLOAD_KEY,
    generated_job_id,
    keyed_again,
    message_key,
    ours,
    payload_key,
    with_payload_key,
)

pytestmark = pytest.mark.version_independent


def key(payload: object) -> str:
    return "k"


OLD_COPY = "generated-3fc2a1b0-8f0e-4c1d-9a2b-5e6f7a8b9c0d"  # a copy's id before PAYLOAD_KEY: uuid4, no header
MARKED = {PAYLOAD_KEY: "sha256:718961338e162d60"}  # a copy of ours (the id a worker gave, the key as it came)


@pytest.mark.parametrize(
    ("message_id", "headers", "with_key", "expected"),
    [
        (None, {}, False, True),  # no id: keyed by the hash of headers and body
        ("", {}, True, True),
        (None, {}, True, True),
        ("order-17", {}, True, False),  # an id of the publisher's: the job id
        ("generated-3fc2", {}, True, False),  # the publisher's own, though it starts generated- (before: True)
        (OLD_COPY, {}, True, True),  # a copy made by the previous version (still in a queue): keyed by the function
        (OLD_COPY, {}, False, False),  # ... without a function: its id, as then
        (OLD_COPY.upper(), {}, True, False),  # not as generated_job_id writes it: the publisher's
        ("generated-x", MARKED, True, True),  # ours: by the function
        ("generated-x", MARKED, False, True),  # ours: by the key as it came (payload_key)
        ("sha256:718961338e162d60", MARKED, False, True),  # ours: the key itself
        ("order-17", MARKED, True, False),  # a publisher's id beside a copied header: the publisher's
        (OLD_COPY, {PAYLOAD_KEY: 1}, True, False),  # a header no key: not ours
    ],
)
def test_keyed_again(message_id: str | None, headers: dict[str, object], with_key: bool, expected: bool) -> None:
    assert keyed_again(message_id, headers, key if with_key else None) is expected


def test_the_payload_key_is_the_one_the_message_came_with() -> None:
    """A copy's headers differ (attempt, evidence): its key is the header's. Broker headers don't count."""
    headers = {"amqpjobs-job": "charge"}
    first = payload_key(headers, b"{}")
    assert first == message_key("", headers, b"{}")
    kept = with_payload_key(headers, b"{}")
    assert kept == {**headers, PAYLOAD_KEY: first}
    assert payload_key({**kept, "amqpjobs-attempt": 2, "amqpjobs-reason": "rejected"}, b"{}") == first
    assert payload_key({**headers, "x-delivery-count": 1, "x-death": [{"count": 1}]}, b"{}") == first
    assert payload_key(headers, b"{ }") != first
    assert ours(generated_job_id(), with_payload_key({}, b""))


def test_generated_ids_start_with_the_prefix_and_differ() -> None:
    first, second = generated_job_id(), generated_job_id()
    assert first.startswith(GENERATED_PREFIX)
    assert second.startswith(GENERATED_PREFIX)
    assert first != second
    assert len(first) == len(GENERATED_PREFIX) + 36
