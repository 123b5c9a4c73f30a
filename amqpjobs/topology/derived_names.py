"""How long a job queue's name may be: the names derived from it must fit too.

A job queue ``N`` declares queues and exchanges named from it (``N.retry.5s``,
``N.quarantine``, ``N.suspects``, the ``N.quarantine`` exchange ...) and ``amqpjobs pause``
uses ``amqpjobs.pause.N``. Each must fit AMQP's short string (255 bytes of UTF-8; RabbitMQ
"Queues" -> "Names") and the AMQP client's own limits (:data:`.naming.MAX_CLIENT_NAME`:
127 characters for an exchange name), so ``N`` may be much shorter than 255.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from amqpjobs.topology.declarations import Declarations
from amqpjobs.topology.models import JobQueueSpec, Topology
from amqpjobs.topology.naming import MAX_CLIENT_NAME, MAX_NAME_BYTES, pause_signal_key, paused_flag_name
from amqpjobs.topology.tiers import usable_tiers


def derived_name_limit(name: str, derived: Iterable[tuple[str, str]]) -> int:
    """The most characters job queue ``name`` may have so that every name of ``derived`` fits.

    Args:
        name: The job queue's name as written.
        derived: ``(kind, derived name)`` pairs, kind ``"queue"``, ``"exchange"`` or
            ``"routing key"``; those that do not contain ``name`` (a shared exchange) are skipped.

    Returns:
        A length in characters (for an ASCII name, the only kind the AMQP client sends).
    """
    limit = min(MAX_NAME_BYTES, MAX_CLIENT_NAME["queue"])
    for kind, other in derived:
        if name not in other:
            continue
        extra = len(other) - len(name)  # the prefix and suffix added to it
        limit = min(limit, MAX_NAME_BYTES - extra, _client_limit(kind) - extra)
    return max(limit, 0)


def derived_names_too_long(name: str, derived: Iterable[tuple[str, str]]) -> list[str]:
    """Each name of ``derived`` that is too long, in words (empty when all fit).

    E.g. ``"amqpjobs.pause.aaaa…' is 259 bytes (RabbitMQ allows 255)"`` or ``"exchange
    'aaaa….quarantine' is 251 characters (the AMQP client takes at most 127)"``.
    """
    said: list[str] = []
    for kind, other in derived:
        size = len(other.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:
            said.append(f"{kind} {other[:40]!r}... is {size} bytes (RabbitMQ allows {MAX_NAME_BYTES})")
        elif len(other) > _client_limit(kind):
            said.append(f"{kind} {other[:40]!r}... is {len(other)} characters "
                        f"(the AMQP client takes at most {_client_limit(kind)})")  # fmt: skip
    return list(dict.fromkeys(said))


def _client_limit(kind: str) -> int:
    return MAX_CLIENT_NAME.get(kind, MAX_NAME_BYTES)


def declared_for(jq: JobQueueSpec) -> Declarations:
    """What job queue ``jq`` declares, as far as its names go.

    A tier refused on its own (``queue_rules``: out of range, a fraction of a ms, twice) names
    no queue, and an empty ``routing_keys`` (refused too) counts as the default.
    """
    in_range = jq.model_copy(update={"retry_tiers": usable_tiers(jq.retry_tiers),
                                     "routing_keys": jq.routing_keys or None})  # fmt: skip
    return Topology(job_queues=(in_range,)).declarations()


def derived_names(jq: JobQueueSpec, decls: Declarations) -> list[tuple[str, str]]:
    """``(kind, name)`` of every queue, exchange and routing key named after ``jq`` (``decls``: its declarations)."""
    derived: list[tuple[str, str]] = [("queue", q.name) for q in decls.queues]
    derived += [("exchange", e.name) for e in decls.exchanges]
    return [*derived, ("queue", paused_flag_name(jq.name)), ("routing key", pause_signal_key(jq.name))]


def job_queue_name_fix(raw: dict[str, Any], loc: tuple[int | str, ...]) -> str | None:
    """The fix of a job queue name over 255 characters: the most its derived names allow (None: unknown)."""
    if len(loc) != 3 or loc[0] != "job_queue" or loc[2] != "name" or not isinstance(loc[1], int):
        return None
    entries = raw.get("job_queue")
    if not isinstance(entries, list) or not loc[1] < len(entries) or not isinstance(entries[loc[1]], dict):
        return None
    stand_in = "amqpjobs-name-stand-in"  # in no name amqpjobs adds to it
    try:
        jq = JobQueueSpec.model_validate({**entries[loc[1]], "name": stand_in})
    except ValidationError:
        return None
    limit = derived_name_limit(stand_in, derived_names(jq, declared_for(jq)))
    return f"use at most {limit} characters (tiers, quarantine and pause add to the name)"
