"""How many messages a queue holds now: the exact ready count plus those a consumer holds unacked.

A passive declare counts ready messages only, exactly and now. The management API also counts
those a consumer holds unacked (a browse, a script, a stuck console), but from a statistics
snapshot about 5 s old (RabbitMQ "Management Plugin" → "Statistics Interval"): just after a park
or a replay emptied a quarantine it still shows what left, and just after a browse ended it shows
as unacked what is ready again. So its unacked figure is added only when its ready figure agrees
with the exact one (the snapshot is not behind what the declare saw).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def held_now(ready: int, api_queue: Mapping[str, Any]) -> tuple[int, int]:
    """(messages in the queue now, of them held unacked by a consumer) for ``ready`` exact ready messages.

    ``api_queue``: the management API's ``GET /api/queues/<vhost>/<name>`` answer ({} when none):
    ``messages_ready`` and ``messages_unacknowledged`` are read. Its unacked figure counts only when
    its ``messages_ready`` equals ``ready``; else ``(ready, 0)``.
    """
    if int(api_queue.get("messages_ready") or 0) != ready:
        return ready, 0
    held = int(api_queue.get("messages_unacknowledged") or 0)
    return ready + held, held
