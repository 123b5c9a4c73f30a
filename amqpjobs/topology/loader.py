"""Load topology files (TOML) into a validated :class:`~amqpjobs.topology.models.Topology`.

Validation happens entirely before anything touches the broker. Every problem names the
file, the key path inside it and the fix; all problems of all files are reported at once
in one :class:`~amqpjobs.errors.TopologyValidationError`.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from amqpjobs.errors import Problem, TopologyValidationError
from amqpjobs.printable import as_toml, printable
from amqpjobs.topology.declarations import AMQP_INT_MAX
from amqpjobs.topology.derived_names import (
    declared_for,
    derived_name_limit,
    derived_names,
    derived_names_too_long,
    job_queue_name_fix,
)
from amqpjobs.topology.file_text import read_toml
from amqpjobs.topology.models import (
    Topology,
    TopologyFile,
)
from amqpjobs.topology.naming import (
    ADDRESSABLE_NAME,
    BREAKER_INFIX,
    BREAKER_PROBE_INFIX,
    EVENTS_EXCHANGE,
    JOB_MARKERS,
    MAX_CLIENT_NAME,
    TOPOLOGY_NAME_CHARS,
    NameKind,
    parse_queue_name,
    paused_flag_name,
    unaddressable_problem,
)
from amqpjobs.topology.partial import SECTIONS, PartialFile, key_path, partial_file
from amqpjobs.topology.rules import PRIORITY_WARN_ABOVE, queue_rules, routing_checks
from amqpjobs.topology.versions import exchange_type_refusal

__all__ = ["PRIORITY_WARN_ABOVE", "LoadedTopology", "load_topology", "topology_files"]


_FIXES = {
    "extra_forbidden": "remove the key or correct its spelling; see README 'Topology files'",
    "missing": "add the key",
    "literal_error": "use one of the values listed",
    "int_type": "give a whole number",
    "int_parsing": "give a whole number",
    "bool_type": "give true or false",
    "string_type": "give a string",
    "tuple_type": "give a list; write entries as [[exchange]] / [[job_queue]] / [[binding]] tables",
    "greater_than_equal": "raise the value to the minimum shown",
    "less_than_equal": "lower the value to the maximum shown",
    "string_too_short": "give a non-empty name",
    "string_too_long": "use at most 255 characters",
    "string_pattern_mismatch": f"take {TOPOLOGY_NAME_CHARS} only",  # Name's one pattern: no whitespace
    "value_error": "use a duration such as '500ms', '5s', '1m' or a number of seconds",
}

#: The fix of a value that is not a whole number, by the type the TOML file gave.
_INT_FIXES: dict[type, str] = {
    str: "give a whole number, without quotes",
    float: "give a whole number, without a decimal point",
    bool: "give a whole number such as 5, not true or false",
}


@dataclass(frozen=True)
class LoadedTopology:
    """A validated topology and the warnings found while loading it.

    Attributes:
        topology: The merged, validated topology.
        warnings: Human-readable warnings (e.g. ``x-max-priority`` above 10).
        files: The files read, in the order read.

    """

    topology: Topology
    warnings: tuple[str, ...] = ()
    files: tuple[Path, ...] = field(default=())


def topology_files(path: str | Path) -> list[Path]:
    """Return the topology files at ``path``: the file itself, or a folder's ``*.toml`` sorted.

    Raises:
        TopologyValidationError: the path does not exist, is no regular file or folder, or
            holds no ``.toml`` file, or one of its ``*.toml`` entries is no regular file.

    """
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.toml"))
        if odd := [f for f in files if not f.is_file()]:
            fix = "remove it from the folder, or make it a topology file"
            raise TopologyValidationError([Problem(str(f), "-", f"not a regular file: {_what(f)}", fix) for f in odd])
        if not files:
            raise TopologyValidationError([Problem(str(p), "-", "folder holds no *.toml topology file", "add one")])
        return files
    if not p.is_file():
        why = f"not a regular file or folder: {_what(p)}" if p.exists() or p.is_symlink() else "no such file or folder"
        raise TopologyValidationError([Problem(str(p), "-", why, "give a topology file or folder")])
    return [p]


def _what(path: Path) -> str:
    """What ``path``, no regular file, is: a folder, a FIFO, a device, a socket, or a link to nothing."""
    try:
        mode = path.stat().st_mode
    except OSError:  # a link to nothing, or a loop of links
        return "a link to nothing (or a loop of links)"
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a file")


def load_topology(
    path: str | Path, broker_version: tuple[int, ...] | None = None, exchange_types: AbstractSet[str] | None = None
) -> LoadedTopology:
    """Read and validate the topology at ``path`` (a ``.toml`` file or a folder of them).

    Args:
        path: A topology file, or a folder whose ``*.toml`` files are merged.
        broker_version: The connected broker's version (e.g. ``(3, 10, 8)``), to check
            version-dependent rules; None checks what holds on every supported version.
        exchange_types: The exchange types the connected broker offers (its management API's
            ``exchange_types``: ``x-consistent-hash`` only with its plugin enabled); None: not checked.

    Returns:
        The validated topology with its warnings.

    Raises:
        TopologyValidationError: any problem in any file: TOML syntax, unknown keys,
            bad types or durations, priorities outside 1–255, quorum queues given
            classic-only settings, duplicate names (after expansion), references to
            undeclared exchanges or queues, retry tiers not strictly increasing.

    """
    files = topology_files(path)
    problems: list[Problem] = []
    parsed: list[tuple[str, TopologyFile]] = []
    partials: dict[str, PartialFile] = {}  # files with type errors: what they still declare
    for file in files:
        name = str(file)
        raw = read_toml(name, file.read_bytes())
        if isinstance(raw, Problem):
            problems.append(raw)
            continue
        try:
            parsed.append((name, TopologyFile.model_validate(raw)))
        except ValidationError as exc:
            problems.extend(_pydantic_problems(name, exc, raw))
            partials[name] = partial_file(name, raw, exc)
            parsed.append((name, partials[name].topology_file))
    if not problems and not any(tf.exchange or tf.job_queue or tf.binding for _, tf in parsed):
        raise TopologyValidationError(
            [Problem(str(path), "-", "the topology declares nothing", "add [[exchange]] and [[job_queue]] entries")]
        )
    warnings: list[str] = []
    unsure = {name for part in partials.values() for name in part.unsure_job_queues}
    untyped = {name for part in partials.values() for name in part.untyped_exchanges}

    def in_file(file: str, path: str) -> str:
        return partials[file].in_file(path) if file in partials else path

    for partial in partials.values():  # a list of retry tiers with refused ones: each other one on its own
        problems.extend(partial.tier_problems())
    for problem in _cross_checks(parsed, (broker_version, exchange_types), warnings, unsure, untyped, in_file):
        part = partials.get(problem.file)
        if part is None:
            problems.append(problem)
        elif part.reports(placed := part.placed(problem)):
            problems.append(placed)
    if problems:
        raise TopologyValidationError(problems)
    topology = Topology(
        exchanges=tuple(e for _, f in parsed for e in f.exchange),
        job_queues=tuple(q for _, f in parsed for q in f.job_queue),
        bindings=tuple(b for _, f in parsed for b in f.binding),
    )
    return LoadedTopology(topology=topology, warnings=tuple(warnings), files=tuple(files))


def _pydantic_problems(file: str, exc: ValidationError, raw: dict[str, Any]) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        kind = err["type"]
        message = err["msg"]
        if kind == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}"
            allowed = _allowed_keys(loc)
            fix = f"remove it or correct its spelling; allowed keys here: {', '.join(allowed)}"
        else:
            fix = _FIXES.get(kind, "correct the value")
            if kind == "string_too_long":
                fix = job_queue_name_fix(raw, loc) or fix
            message = message.removeprefix("Value error, ")
            if kind == "int_type":
                fix = _INT_FIXES.get(type(err.get("input")), fix)
            if kind == "string_pattern_mismatch":  # pydantic would show the regex
                message = "a name can't hold whitespace (a space, tab or line break)"
            if kind == "less_than_equal" and err.get("ctx", {}).get("le") == AMQP_INT_MAX:
                message += " (the largest integer an AMQP argument carries)"
            if "input" in err and kind not in ("missing",):
                message = f"{message} (got {as_toml(err['input'])})"
        problems.append(Problem(file, key_path(loc), message, fix))
    return problems


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = TopologyFile
    if len(loc) > 1 and isinstance(loc[0], str) and loc[0] in SECTIONS:
        model = SECTIONS[loc[0]]
    return sorted(model.model_fields)


def _reserved(file: str, path: str, name: str) -> list[Problem]:
    """The problem with ``name`` when it starts ``amq.`` (reserved by RabbitMQ), else none."""
    if not name.startswith("amq."):
        return []
    return [Problem(file, path, f"{name!r}: names starting 'amq.' are reserved by RabbitMQ", "choose another name")]


def _job_marker(file: str, path: str, name: str) -> list[Problem]:
    """The problem with job queue ``name`` when it holds a job's own queues' marker (:data:`.naming.JOB_MARKERS`)."""
    found = [m for m in JOB_MARKERS if m in name]
    if not found:
        return []
    kind = "circuit breaker" if found[0] in (BREAKER_INFIX, BREAKER_PROBE_INFIX) else "rate-limited job"
    return [Problem(file, path, f"{name!r} holds {found[0]!r}, which marks a {kind}'s queues (README "
                    "\"Flow control\")", f"choose a name without {found[0]!r}")]  # fmt: skip


def _unaddressable(file: str, path: str, name: str, kind: str, limit: int | None = None) -> list[Problem]:
    """The problem with ``name`` when the AMQP client can't send it (:func:`.naming.unaddressable_problem`).

    ``limit``: the most characters the name as written may have (a job queue's: its derived names' limit).
    """
    if issue := unaddressable_problem(name, cast(NameKind, kind)):
        most = MAX_CLIENT_NAME[cast(NameKind, kind)] if limit is None else limit
        if not ADDRESSABLE_NAME.fullmatch(name):  # its list offers a space, which a topology name can't take
            issue = f"{kind} name {printable(repr(name))} has characters the AMQP client refuses"
        return [Problem(file, path, issue, f"rename it within {TOPOLOGY_NAME_CHARS}, at most {most} characters")]
    return []


def _undeclared_exchange(file: str, path: str, name: str) -> Problem:
    return Problem(
        file, path, f"exchange {name!r} is not declared", "declare it in an [[exchange]] entry or correct the name"
    )


def _cross_checks(
    parsed: list[tuple[str, TopologyFile]],
    broker: tuple[tuple[int, ...] | None, AbstractSet[str] | None],
    warnings: list[str],
    unsure: AbstractSet[str],
    untyped: AbstractSet[str],
    in_file: Callable[[str, str], str],
) -> list[Problem]:
    """Checks across entries and files.

    ``unsure``: job queues whose queues' names are not known for sure (a key left out of a
    file with type errors); ``untyped``: exchanges of no known type (their ``type`` left out);
    ``in_file(file, key path)``: where an entry of ``parsed`` is in its file (for "also from");
    ``broker``: the connected broker's version and exchange types (None: not known).
    """
    broker_version, exchange_types = broker
    problems: list[Problem] = []
    exchange_names: dict[str, str] = {}
    queue_names: dict[str, str] = {}
    job_queue_names: dict[str, str] = {}

    def claim(table: dict[str, str], name: str, file: str, path: str, what: str) -> None:
        where = f"{file}: {in_file(file, path)}"
        if name in table:
            problems.append(
                Problem(
                    file,
                    path,
                    f"duplicate {what} name {name!r} (also from {table[name]})",
                    "give each exchange / job queue a unique name",
                )
            )
        else:
            table[name] = where

    for file, tf in parsed:
        for i, ex in enumerate(tf.exchange):
            path = f"exchange[{i}].name"
            problems.extend(_reserved(file, path, ex.name))
            problems.extend(_unaddressable(file, path, ex.name, "exchange"))
            if exchange_types is not None and ex.name not in untyped and ex.type not in exchange_types:
                problems.append(exchange_type_refusal(file, f"exchange[{i}].type", ex.type, exchange_types))
            claim(exchange_names, ex.name, file, path, "exchange")
    events_claimed = False
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            base = f"job_queue[{i}]"
            problems.extend(_reserved(file, f"{base}.name", jq.name))
            problems.extend(_job_marker(file, f"{base}.name", jq.name))
            problems.extend(queue_rules(file, base, jq, broker_version, warnings))
            decls = declared_for(jq)
            derived = derived_names(jq, decls)
            limit = derived_name_limit(jq.name, derived)
            if too_long := derived_names_too_long(jq.name, derived):
                problems.append(
                    Problem(file, f"{base}.name",
                            f"job queue name {jq.name[:40]!r}... is {len(jq.name)} characters, too long for the names "
                            f"derived from it: {'; '.join(too_long)}",
                            f"use at most {limit} characters (tiers, quarantine and pause add to the name)")
                )  # fmt: skip
            elif refused := [p for kind, n in [("queue", jq.name), *derived] if kind != "routing key"
                             for p in _unaddressable(file, f"{base}.name", n, kind, limit)]:  # fmt: skip
                problems.append(refused[0])
            if len(set(jq.keys)) != len(jq.keys):
                problems.append(
                    Problem(file, f"{base}.routing_keys", "a routing key is listed twice", "list each key once")
                )
            if jq.name in job_queue_names:  # one problem, not one per name it expands to
                problems.append(
                    Problem(
                        file,
                        f"{base}.name",
                        f"duplicate job queue name {jq.name!r} (also from {job_queue_names[jq.name]})",
                        "give each exchange / job queue a unique name",
                    )
                )
                continue
            job_queue_names[jq.name] = f"{file}: {in_file(file, f'{base}.name')}"
            for q in decls.queues:
                claim(queue_names, q.name, file, f"{base}.name", f"queue (expanded from job queue {jq.name!r})")
            # its pause flag, declared by `amqpjobs pause` only, must not be another job queue's queue
            claim(queue_names, paused_flag_name(jq.name), file, f"{base}.name", f"pause flag of job queue {jq.name!r}")
            for ex_decl in decls.exchanges:
                if ex_decl.name == EVENTS_EXCHANGE and events_claimed:
                    continue  # one events exchange for all job queues
                events_claimed = events_claimed or ex_decl.name == EVENTS_EXCHANGE
                claim(
                    exchange_names,
                    ex_decl.name,
                    file,
                    f"{base}.name",
                    f"exchange (expanded from job queue {jq.name!r})",
                )
    # the routing checks read each job queue's keys: one listing none is refused on its own (queue_rules)
    typed = [(f, tf.model_copy(update={"exchange": tuple(e for e in tf.exchange if e.name not in untyped),
                                       "job_queue": tuple(jq for jq in tf.job_queue if jq.keys)}))
             for f, tf in parsed]  # fmt: skip
    problems.extend(routing_checks(typed))
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            if jq.exchange not in exchange_names:
                problems.append(_undeclared_exchange(file, f"job_queue[{i}].exchange", jq.exchange))
        for i, b in enumerate(tf.binding):
            if b.source not in exchange_names:
                problems.append(_undeclared_exchange(file, f"binding[{i}].source", b.source))
            targets = queue_names if b.destination_type == "queue" else exchange_names
            if (
                parse_queue_name(b.source).kind == "quarantine"
                and b.destination in queue_names
                and parse_queue_name(b.destination).kind != "quarantine"
            ):
                problems.append(
                    Problem(file, f"binding[{i}].destination",
                            f"binding quarantine exchange {b.source!r} to {b.destination!r} sends failed jobs "
                            "straight back to work: a loop", "remove the binding; use `amqpjobs replay` instead")
                )  # fmt: skip
            if b.destination not in targets and parse_queue_name(b.destination).job_queue not in unsure:
                problems.append(
                    Problem(
                        file,
                        f"binding[{i}].destination",
                        f"{b.destination_type} {b.destination!r} is not declared",
                        f"declare the {b.destination_type} or correct the name",
                    )
                )
    return problems
