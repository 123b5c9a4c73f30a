"""held_now: the exact ready count, plus the API's unacked only when its snapshot agrees on ready."""

from __future__ import annotations

import pytest

from amqpjobs.runtime.held_count import held_now


@pytest.mark.parametrize(
    ("ready", "api", "expected"),
    [
        (0, {"messages_ready": 0, "messages_unacknowledged": 3}, (3, 3)),  # all held by a consumer
        (2, {"messages_ready": 2, "messages_unacknowledged": 1}, (3, 1)),
        (0, {"messages_ready": 3, "messages_unacknowledged": 0}, (0, 0)),  # just emptied: the snapshot lags
        (3, {"messages_ready": 0, "messages_unacknowledged": 3}, (3, 0)),  # a browse just ended: not twice
        (4, {}, (4, 0)),  # no figures from the API
        (0, {"messages_ready": None, "messages_unacknowledged": None}, (0, 0)),
    ],
)
def test_held_now(ready: int, api: dict[str, int | None], expected: tuple[int, int]) -> None:
    assert held_now(ready, api) == expected
