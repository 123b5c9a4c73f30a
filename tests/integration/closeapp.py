"""procapp, whose worker's connections the broker force-closes at one chosen moment of its start.

``CLOSEAPP_AT`` names the start step before which the worker's connections are closed through
the management API (``DELETE /api/connections/<name>``, a broker-side close: 320
CONNECTION_FORCED), once per process: ``pauses`` (before it reads the pause flags) or
``consumer`` (before it opens its consumer's channel). The step then meets the closed
connection, as it would when the broker closes it at that moment. ``CLOSEAPP_TIMES``: how
many starts get the close (default 1); under ``--processes``, child 1's only.
:mod:`tests.integration.closesched` does the same to a scheduler replica.
"""

from __future__ import annotations

import os
import time
from functools import wraps
from typing import Any
from urllib.parse import quote

from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.worker import Worker
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings
from tests.integration.procapp import app

__all__ = ["app"]

_AT = os.environ.get("CLOSEAPP_AT", "")
# under --processes, child 1 closes (the connections of both children: they have the same names)
_left = [int(os.environ.get("CLOSEAPP_TIMES", "1")) if os.environ.get("AMQPJOBS_CHILD", "1") == "1" else 0]


def close_connections(names: set[str]) -> None:
    """Close the connections named ``names`` (waits until the management API lists them all), saying each."""
    settings = broker_settings()
    deadline = time.monotonic() + 20
    with ManagementClient(settings) as mgmt:
        while True:
            found = mgmt.request("GET", f"/vhosts/{quote(settings.vhost, safe='')}/connections") or []
            mine = [c for c in found if (c.get("client_properties") or {}).get("connection_name") in names]
            if {(c.get("client_properties") or {}).get("connection_name") for c in mine} == names or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.1)
        for c in mine:
            mgmt.request("DELETE", f"/connections/{quote(c['name'], safe='')}", allow_404=True)
            print(f"closeapp: closed {c['client_properties']['connection_name']}", flush=True)


def closing_first(step: Any, names: set[str]) -> Any:
    """``step``, whose first ``CLOSEAPP_TIMES`` calls close the connections ``names`` first."""

    @wraps(step)
    async def closing(*args: Any, **kwargs: Any) -> Any:
        if _left[0] > 0:
            _left[0] -= 1
            close_connections(names)
        return await step(*args, **kwargs)

    return closing


_WORKER = {f"{app.name}-worker", f"{app.name}-worker-publisher"}
if _AT == "pauses":
    OperatorPauses.start = closing_first(OperatorPauses.start, _WORKER)  # type: ignore[method-assign]
elif _AT == "consumer":
    Worker._start_consumer = closing_first(Worker._start_consumer, _WORKER)  # type: ignore[method-assign]
