"""A name as one path segment of a management API URL (no broker: the encoding rule alone).

The broker side (a vhost and queues with dots in their names, read through the API) is
tested in tests/integration/test_management_paths.py.
"""

from __future__ import annotations

import httpx
import pytest

from amqpjobs.wire.management import _q

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize(
    ("name", "segment"),
    [(".", "%2E"), ("..", "%2E%2E"), ("work.quarantine", "work%2Equarantine"), ("a/b c#?", "a%2Fb%20c%23%3F")],
)
def test_a_name_is_one_segment_and_no_dot_segment(name: str, segment: str) -> None:
    assert _q(name) == segment
    url = httpx.URL(f"http://127.0.0.1:15672/api/vhosts/{_q(name)}")
    assert url.raw_path.decode() == f"/api/vhosts/{segment}"  # not removed as a dot segment (was "/api")
