"""How many worker processes ``consume --processes`` runs (:mod:`amqpjobs.runtime.supervisor` runs them)."""

from __future__ import annotations

import os

from amqpjobs.errors import ConfigurationError
from amqpjobs.text import ascii_digits

#: The most children per CPU ``--processes`` accepts (:func:`process_count`).
PROCESSES_PER_CPU = 4
#: What one child costs in resident memory, MB, as measured (53 MB for the tests' app), for the refusal's message.
CHILD_MEMORY_MB = 50


def usable_cpus() -> int:
    """The CPUs this process may run on, ``--processes auto``'s count.

    ``len(os.sched_getaffinity(0))`` (honours taskset and cgroup cpusets); ``os.cpu_count()``
    where that call is missing.
    """
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def process_count(value: str, cpus: int) -> int:
    """The number of worker processes ``--processes`` asks for: a positive integer, or ``auto`` (``cpus``).

    At most :data:`PROCESSES_PER_CPU` per CPU: each child is a whole worker (about
    :data:`CHILD_MEMORY_MB` MB of memory and 2-3 broker connections), and more children
    than cores only add memory and connections, not throughput; 999 children on 2 cores
    exhausted the memory of the machine (and the OOM killer took its RabbitMQ node).

    Args:
        value: The option's text.
        cpus: The CPUs this process may run on (:func:`usable_cpus`).

    Raises:
        ConfigurationError: neither ``auto`` nor a positive integer, or more than
            ``PROCESSES_PER_CPU * cpus``.
    """
    if value.strip().lower() == "auto":
        return cpus
    count = int(value) if ascii_digits(value.strip()) else 0  # int() also reads other scripts' digits
    if count < 1:
        raise ConfigurationError(f"--processes {value!r}: give a positive number of processes, or auto (one per CPU)")
    limit = PROCESSES_PER_CPU * cpus
    if count > limit:
        raise ConfigurationError(
            f"--processes {count}: at most {limit} here ({PROCESSES_PER_CPU} per CPU; this process may use "
            f"{cpus} CPU(s), os.sched_getaffinity). Each child is a whole worker: about {CHILD_MEMORY_MB} MB "
            f"of memory and 2-3 broker connections. Use fewer processes (auto: one per CPU), "
            "or run workers on more hosts"
        )
    return count
