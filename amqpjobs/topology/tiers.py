"""Retry tiers as a topology file gives them: which ones can be a delay queue's ``x-message-ttl``.

``x-message-ttl`` counts whole milliseconds, 1 ms to 2**32-1 ms (~49 days): RabbitMQ
"Time-To-Live and Expiration". A tier outside that, a fraction of a millisecond (never
rounded: ``1.5ms``), or a delay given twice is one problem each, named as people write
durations (``50d``, ``1.5ms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from amqpjobs.durations import format_duration
from amqpjobs.errors import Problem


def tier_in_range(seconds: float) -> bool:
    """True when a retry tier of ``seconds`` fits ``x-message-ttl``: 1 ms to 2**32-1 ms (~49 days)."""
    return seconds >= 0.001 and seconds * 1000 <= 2**32 - 1


def _whole_ms(seconds: float) -> bool:
    """Whether ``seconds`` is a whole number of milliseconds (``x-message-ttl`` counts them)."""
    return abs(seconds * 1000 - round(seconds * 1000)) <= 1e-6


def usable_tiers(tiers: Sequence[float]) -> tuple[float, ...]:
    """The tiers whose queues can be named: in range, whole milliseconds, each delay once.

    The others are refused on their own (:func:`queue_rules`); their queue names would only repeat it.
    """
    kept: list[float] = []
    for t in tiers:
        if tier_in_range(t) and _whole_ms(t) and all(round(t * 1000) != round(k * 1000) for k in kept):
            kept.append(t)
    return tuple(kept)


def _tier_text(seconds: float) -> str:
    """A tier as people write it: ``50d``, ``250ms``, ``1.5ms``."""
    return format_duration(seconds) if _whole_ms(seconds) and seconds >= 0.001 else f"{seconds * 1000:g}ms"


def tier_problems(file: str, base: str, tiers: Sequence[float]) -> list[Problem]:
    """The problems of a job queue's ``retry_tiers`` (seconds) at key path ``base`` of ``file``, one per bad tier."""
    problems: list[Problem] = []
    for j in range(1, len(tiers)):
        if not all(tier_in_range(t) and _whole_ms(t) for t in (tiers[j], tiers[j - 1])):
            continue  # refused below, on its own
        if round(tiers[j] * 1000) <= round(tiers[j - 1] * 1000):
            problems.append(
                Problem(
                    file,
                    f"{base}.retry_tiers[{j}]",
                    f"retry tiers must strictly increase ({_tier_text(tiers[j - 1])} then {_tier_text(tiers[j])})",
                    "list tiers from shortest to longest, each once",
                )
            )
    for j, t in enumerate(tiers):
        problems.extend(tier_value_problems(file, f"{base}.retry_tiers[{j}]", t))
    return problems


def tier_value_problems(file: str, path: str, t: float) -> list[Problem]:
    """The problems of one retry tier of ``t`` seconds at key ``path`` on its own (its order aside)."""
    if tier_in_range(t) and abs(t * 1000 - round(t * 1000)) > 1e-6:  # 1.5ms: no TTL of it (never rounded)
        ms = t * 1000
        return [Problem(file, path, f"{ms:g}ms: x-message-ttl counts whole milliseconds",
                        f"write {math.floor(ms)}ms or {math.ceil(ms)}ms")]  # fmt: skip
    if not tier_in_range(t):
        why = "sub-millisecond tiers are refused" if t < 0.001 else "longer than x-message-ttl takes"
        return [Problem(file, path, f"{_tier_text(t)}: {why} (x-message-ttl counts whole milliseconds, 1 ms to ~49 "
                        "days)", "use a delay between 1ms and 49d")]  # fmt: skip
    return []
