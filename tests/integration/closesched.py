"""schedapp, whose replica's connection the broker force-closes before it joins the election (once per process).

See :mod:`tests.integration.closeapp`: the close goes through the management API, then the
replica's declarations meet the closed connection.
"""

from __future__ import annotations

from amqpjobs.runtime.scheduler import Scheduler
from tests.integration.closeapp import closing_first
from tests.integration.schedapp import app

__all__ = ["app"]

Scheduler._join = closing_first(Scheduler._join, {f"{app.name}-scheduler"})  # type: ignore[method-assign]
