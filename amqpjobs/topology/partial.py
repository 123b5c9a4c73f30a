"""What a topology file that failed validation still declares, so one type error can't hide the other checks.

A file whose ``[[exchange]]``, ``[[job_queue]]`` or ``[[binding]]`` entry has a key of the
wrong type is reported key by key (pydantic's errors); its entries then still take part in
the checks across entries and files (names declared twice, bindings and job queues naming
an exchange or queue declared nowhere, routing keys, a job queue's own rules), read as
plainly as they can be:

* a refused key whose value is plainly a whole number (``5.0``, ``"5"``) is read as one;
* a job queue's refused ``exchange`` (``"a b"``) is read as :data:`REFUSED_NAME`, so its other keys
  are still checked (what rests on its exchange is not reported);
* an unknown key, and any other refused key, is left out (the entry takes its default);
* an entry still invalid without them (a name missing or not a string) is left out whole.

A check that would rest on a key left out is not reported: a job queue's own rule that reads
it (:data:`RESTS_ON`: with ``max_priority = 0`` left out, its retry tiers are still checked; with
``type`` left out, nothing that depends on the type), its routing, nor
whether a binding's destination is among that job queue's queues (``shards``, ``retry_tiers``
name them); the routing of job queues on an exchange whose ``type`` was left out (declared,
of no known type); a binding whose ``destination_type`` was left out. Nor is a problem at a
key already refused (reported once, by pydantic).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from amqpjobs.durations import parse_duration
from amqpjobs.errors import Problem
from amqpjobs.text import ascii_digits
from amqpjobs.topology.models import BindingSpec, ExchangeSpec, JobQueueSpec, TopologyFile
from amqpjobs.topology.tiers import tier_value_problems

#: The keys of a job queue each of its own rules reads, by the key its problem is reported at
#: (:func:`amqpjobs.topology.rules.queue_rules`, :func:`~amqpjobs.topology.tiers.tier_problems`, the routing
#: checks): with none of them left out, the rule's problem is reported. A key not listed rests on every key.
RESTS_ON: dict[str, frozenset[str]] = {
    "retry_tiers": frozenset({"retry_tiers"}),
    "max_priority": frozenset({"type", "max_priority"}),
    "delivery_limit": frozenset({"type", "delivery_limit"}),
    "overflow": frozenset({"type", "overflow", "max_length"}),
    "max_age": frozenset({"type", "max_age"}),
    "max_length": frozenset({"type", "max_length", "overflow", "retry_tiers"}),
    "shard_routing": frozenset({"shards", "shard_routing", "max_depth", "max_age"}),
}

#: What stands in for a refused name an entry needs, so the entry is still read (its problems there are refused).
REFUSED_NAME = "(refused)"
#: The keys of an entry that name another entry, where :data:`REFUSED_NAME` may stand in.
_REFERENCES: dict[type[BaseModel], tuple[str, ...]] = {JobQueueSpec: ("exchange",)}

SECTIONS: dict[str, type[BaseModel]] = {"exchange": ExchangeSpec, "job_queue": JobQueueSpec, "binding": BindingSpec}
_ENTRY = re.compile(r"^(exchange|job_queue|binding)\[(\d+)\]")


def int_like(value: Any) -> int | None:
    """The whole number ``value`` plainly means (``5.0``, ``"5"``), or None (``true``, ``5.5``, ``"five"``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and ascii_digits(value.strip()):
        return int(value)
    return None


@dataclass
class PartialFile:
    """The entries of one file that failed validation, read as plainly as they can be.

    Attributes:
        file: The file's name.
        topology_file: Its entries that could be read (in order; indices differ where some were left out).
        positions: For each section, the index in the file of each entry kept.
        refused: Key paths pydantic refused (already reported).
        unchecked: Entries (``job_queue[2]``) with keys left out, and those keys: a problem of the entry whose rule
            reads one of them (:data:`RESTS_ON`) is not reported.
        unsure_job_queues: The names of those job queues (their queues' names rest on it too).
        untyped_exchanges: Exchanges whose ``type`` was left out: declared, of no known type.

    """

    file: str
    topology_file: TopologyFile
    positions: dict[str, list[int]]
    refused: frozenset[str]
    unchecked: dict[str, frozenset[str]]
    unsure_job_queues: frozenset[str] = field(default=frozenset())
    untyped_exchanges: frozenset[str] = field(default=frozenset())
    tiers_kept: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def tier_problems(self) -> list[Problem]:
        """The problems of each retry tier pydantic took in a list it refused some of (its order not judged)."""
        return [
            problem
            for entry, kept in self.tiers_kept.items()
            for j, seconds in kept
            for problem in tier_value_problems(self.file, f"{entry}.retry_tiers[{j}]", seconds)
        ]

    def in_file(self, path: str) -> str:
        """Key ``path`` of :attr:`topology_file` (``binding[1].source``) at its entry's index in the file."""
        match = _ENTRY.match(path)
        if match is None:
            return path
        section, index = match.group(1), int(match.group(2))
        return f"{section}[{self.positions[section][index]}]" + path[match.end() :]

    def placed(self, problem: Problem) -> Problem:
        """``problem`` (found on :attr:`topology_file`) with its key path at its entry's index in the file."""
        if problem.file != self.file:
            return problem
        return Problem(problem.file, self.in_file(problem.key_path), problem.message, problem.fix)

    def reports(self, problem: Problem) -> bool:
        """Whether ``problem`` (at its place in the file) is news: not at a refused key, nor resting on one."""
        if problem.key_path in self.refused:
            return False
        match = _ENTRY.match(problem.key_path)
        if match is None or match.group(0) not in self.unchecked:
            return True
        rest = problem.key_path[match.end() :]
        if rest in (".name", ".exchange"):  # a job queue's names hold without the rest
            return True
        reads = RESTS_ON.get(re.split(r"[.\[]", rest[1:], maxsplit=1)[0])
        return reads is not None and not reads & self.unchecked[match.group(0)]


def partial_file(file: str, raw: dict[str, Any], exc: ValidationError) -> PartialFile:
    """What ``raw`` (file ``file``, refused with ``exc``) still declares (see the module docstring)."""
    refused: set[str] = set()
    changes: dict[tuple[str, int], dict[str, tuple[int | None, bool]]] = {}  # entry -> key -> (plain value, unknown)
    dropped_sections: set[str] = set()
    dropped_entries: set[tuple[str, int]] = set()
    tiers_refused: dict[int, set[int]] = {}  # job queue -> its retry tiers pydantic refused
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        refused.add(key_path(loc))
        if loc[0] == "job_queue" and len(loc) == 4 and loc[2] == "retry_tiers" and isinstance(loc[3], int):
            tiers_refused.setdefault(int(loc[1]), set()).add(loc[3])
        if len(loc) == 1:  # a section that is not a list of tables (an unknown one is left out anyway)
            dropped_sections.add(str(loc[0]))
        elif len(loc) == 2 and isinstance(loc[1], int):
            dropped_entries.add((str(loc[0]), loc[1]))
        elif len(loc) >= 3 and isinstance(loc[1], int):
            plain = int_like(err.get("input")) if len(loc) == 3 else None
            unknown = err["type"] == "extra_forbidden"
            changes.setdefault((str(loc[0]), loc[1]), {})[str(loc[2])] = (plain, unknown)
    sections: dict[str, list[Any]] = {}
    positions: dict[str, list[int]] = {}
    unchecked: dict[str, frozenset[str]] = {}
    unsure: set[str] = set()
    untyped: set[str] = set()
    for section, model in SECTIONS.items():
        entries = raw.get(section, [])
        sections[section], positions[section] = [], []
        if section in dropped_sections or not isinstance(entries, list):
            continue
        for i, entry in enumerate(entries):
            if (section, i) in dropped_entries or not isinstance(entry, dict):
                continue
            keys = changes.get((section, i), {})
            read = _read(model, entry, keys) or _read(model, entry, {k: (None, u) for k, (_, u) in keys.items()})
            if read is None:
                continue  # a name missing or of the wrong type: nothing to check it by
            spec, left_out = read
            if section == "binding" and "destination_type" in left_out:
                continue
            if isinstance(spec, JobQueueSpec) and left_out:
                unchecked[f"job_queue[{i}]"] = frozenset(left_out)
                unsure.add(spec.name)
            if isinstance(spec, ExchangeSpec) and "type" in left_out:
                untyped.add(spec.name)
            sections[section].append(spec)
            positions[section].append(i)
    kept = TopologyFile.model_validate(sections)
    tiers_kept: dict[str, list[tuple[int, float]]] = {}
    for i, bad in tiers_refused.items():
        tiers = raw["job_queue"][i]["retry_tiers"]
        tiers_kept[f"job_queue[{i}]"] = [(j, parse_duration(t)) for j, t in enumerate(tiers) if j not in bad]
    return PartialFile(
        file, kept, positions, frozenset(refused), unchecked, frozenset(unsure), frozenset(untyped), tiers_kept
    )


def _read(
    model: type[BaseModel], entry: dict[str, Any], keys: dict[str, tuple[int | None, bool]]
) -> tuple[Any, set[str]] | None:
    """``entry`` with each refused key read as its plain whole number, or left out (None: still invalid).

    Returns the entry read and the keys left out that are not unknown ones (its rules may rest on them).
    """
    fixed = {k: v for k, v in entry.items() if k not in keys or keys[k][0] is not None}
    fixed |= {k: plain for k, (plain, _) in keys.items() if plain is not None}
    # a job queue's exchange refused (a name with a space): a stand-in, so its other keys are still checked
    fixed |= {k: REFUSED_NAME for k in _REFERENCES.get(model, ()) if k in keys and keys[k][0] is None}
    try:
        spec = model.model_validate(fixed)
    except ValidationError:
        return None
    return spec, {k for k, (plain, unknown) in keys.items() if plain is None and not unknown}


def key_path(loc: tuple[int | str, ...]) -> str:
    """Pydantic's location ``("job_queue", 0, "retry_tiers", 1)`` as a key path: ``job_queue[0].retry_tiers[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "-"
