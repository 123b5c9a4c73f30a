"""The next command an operator runs, printed by each step of the drill (README "The 3 am drill").

alert -> ``status`` -> ``quarantine list`` -> ``quarantine show`` -> ``replay --canary`` of one
kind -> ``quarantine park`` the rest -> ``status`` healthy: each step's output names the next.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from amqpjobs.jobs.quarantine import Group
from amqpjobs.printable import printable


def filter_args(job: str | None, error_type: str | None, reason: str | None, since: str | None) -> list[str]:
    """The filter options given, as command-line arguments (to repeat them in a next command)."""
    pairs = (("--job", job), ("--error-type", error_type), ("--reason", reason), ("--since", since))
    return [part for flag, value in pairs if value for part in (flag, value)]


def command(*args: str) -> str:
    """An ``amqpjobs`` command line, quoted for a POSIX shell, control characters escaped (one line always)."""
    return printable(shlex.join(["amqpjobs", *args]))


def after_list(queue: str, groups: Sequence[Group]) -> str | None:
    """What ``quarantine list`` suggests: look at the biggest group's messages."""
    if not groups:
        return None
    top = groups[0]
    kind = filter_args(top.job or None, top.error_type or None, None if top.error_type else top.reason, None)
    return f"next: {command('quarantine', 'show', queue, *kind)} (the biggest group's messages)"


def after_show(queue: str, filters: list[str]) -> str:
    """What ``quarantine show`` suggests: replay one of these as a canary, or park them."""
    return (
        f"next: fixed? {command('replay', queue, *filters, '--canary', '1')}; "
        f"a lost cause? {command('quarantine', 'park', queue, *filters)}"
    )
