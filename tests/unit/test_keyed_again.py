"""Which idempotent deliveries are keyed by their payload (amqpjobs.jobs.message_key.keyed_again)."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.message_key import GENERATED_PREFIX, generated_job_id, keyed_again

pytestmark = pytest.mark.version_independent


def key(payload: object) -> str:
    return "k"


@pytest.mark.parametrize(
    ("message_id", "with_key", "expected"),
    [
        (None, False, True),  # no id: keyed by the hash of headers and body
        ("", True, True),
        (None, True, True),
        ("order-17", True, False),  # an id of the publisher's: the job id
        ("generated-3fc2", True, True),  # a copy made before the run: keyed by the function again
        ("generated-3fc2", False, False),  # no function: the copy carries the hash already, or the id is kept
    ],
)
def test_keyed_again(message_id: str | None, with_key: bool, expected: bool) -> None:
    assert keyed_again(message_id, key if with_key else None) is expected


def test_generated_ids_start_with_the_prefix_and_differ() -> None:
    first, second = generated_job_id(), generated_job_id()
    assert first.startswith(GENERATED_PREFIX)
    assert second.startswith(GENERATED_PREFIX)
    assert first != second
    assert len(first) == len(GENERATED_PREFIX) + 36
