"""Topology TOML shared by tests: the exchange ``jobs`` and its job queues, for unit and integration tests alike."""

from __future__ import annotations


def work_topology(*tiered: str, flat: tuple[str, ...] = ()) -> str:
    """TOML: exchange ``jobs``; job queue ``work`` and each of ``tiered`` with one retry tier of 1 s; each of ``flat``
    with no retry tiers (so no retries). Every queue is bound to ``jobs`` by its own name."""
    parts = ['[[exchange]]\nname = "jobs"\n']
    parts += [
        f'[[job_queue]]\nname = "{name}"\nexchange = "jobs"\nretry_tiers = ["1s"]\n' for name in ("work", *tiered)
    ]
    parts += [f'[[job_queue]]\nname = "{name}"\nexchange = "jobs"\n' for name in flat]
    return "\n" + "\n".join(parts)
