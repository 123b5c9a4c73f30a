"""The next command an operator runs, printed by each step of the drill (README "The 3 am drill").

alert -> ``status`` -> ``quarantine list`` -> ``quarantine show`` -> ``replay --canary`` of one
kind -> ``quarantine park`` the rest -> ``status`` healthy: each step's output names the next
(a parked queue's ``show`` names ``quarantine unpark``: park refuses a parked queue).
"""

from __future__ import annotations

from collections.abc import Sequence

from amqpjobs.jobs.census import filter_flags
from amqpjobs.jobs.quarantine import Group, Selection
from amqpjobs.printable import printable, shell_quote
from amqpjobs.topology.naming import parse_queue_name


def filter_args(chosen: Selection) -> list[str]:
    """``chosen`` as command-line arguments, to repeat it in a next command (``--since`` as an ISO time).

    The flags are :func:`amqpjobs.jobs.census.filter_flags`'s (one rule for both).
    """
    return [part for pair in filter_flags(chosen) for part in pair]


def command(*args: str) -> str:
    """An ``amqpjobs`` command line to paste into a shell: each argument by :func:`amqpjobs.printable.shell_quote`.

    One line always; an argument with control characters is bash ``$'...'``-quoted, so it
    pastes back to the very same value.
    """
    return " ".join(shell_quote(arg) for arg in ["amqpjobs", *args])


def after_list(queue: str, groups: Sequence[Group]) -> str | None:
    """What ``quarantine list`` suggests: look at the biggest group's messages."""
    if not groups:
        return None
    top = groups[0]
    kind = filter_args(
        Selection(job=top.job or None, error_type=top.error_type or None, reason=None if top.error_type else top.reason)
    )
    return f"next: {command('quarantine', 'show', queue, *kind)} (the biggest group's messages)"


def after_show(queue: str, chosen: Selection) -> str:
    """What ``quarantine show`` suggests: replay one of these as a canary, or park them (unpark: a parked queue's)."""
    filters = filter_args(chosen)
    other = (
        f"parked by mistake? {command('quarantine', 'unpark', queue, *filters)}"
        if parse_queue_name(queue).kind == "parked"
        else f"a lost cause? {command('quarantine', 'park', queue, *filters)}"
    )
    if chosen.reason == "payload-missing":  # the store lost them: a replay reads the same missing payloads
        return (
            f"next: payloads restored to the store? {command('replay', queue, *filters, '--canary', '1')}; else "
            f"enqueue these jobs again with their payloads, then {command('quarantine', 'purge', queue, *filters)}"
        )
    return f"next: fixed? {command('replay', queue, *filters, '--canary', '1')}; {other}"


def after_replay(queue: str, left: int) -> str:
    """What a finished replay of ``queue`` suggests: what is still there, or ``status`` when nothing is.

    The words name the queue actually replayed: a quarantine, or a parked queue (whose
    emptiness says nothing about the quarantine).
    """
    if left:
        return f"next: {command('quarantine', 'list', queue)} ({left} still there)"
    if parse_queue_name(queue).kind == "parked":
        return (
            f"next: {command('status')} (parked queue {printable(queue)} is empty; "
            "a replayed job that fails again goes to quarantine)"
        )
    return f"next: {command('status')} (the quarantine is empty)"
