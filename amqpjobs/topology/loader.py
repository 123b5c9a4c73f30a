"""Load topology files (TOML) into a validated :class:`~amqpjobs.topology.models.Topology`.

Validation happens entirely before anything touches the broker. Every problem names the
file, the key path inside it and the fix; all problems of all files are reported at once
in one :class:`~amqpjobs.errors.TopologyValidationError`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from amqpjobs.errors import Problem, TopologyValidationError
from amqpjobs.topology.models import (
    BindingSpec,
    ExchangeSpec,
    JobQueueSpec,
    Topology,
    TopologyFile,
)
from amqpjobs.topology.naming import QUARANTINE_SUFFIX
from amqpjobs.topology.versions import QUORUM_MAX_PRIORITY, quorum_priority_refusal

#: ``x-max-priority`` above this still works but costs broker CPU and memory
#: (RabbitMQ "Classic Queues Support Priorities" → "How many priorities should I use?").
PRIORITY_WARN_ABOVE = 10

_FIXES = {
    "extra_forbidden": "remove the key or correct its spelling; see README 'Topology files'",
    "missing": "add the key",
    "literal_error": "use one of the values listed",
    "int_type": "give a whole number, without quotes",
    "int_parsing": "give a whole number",
    "bool_type": "give true or false",
    "string_type": "give a string",
    "tuple_type": "give a list; write entries as [[exchange]] / [[job_queue]] / [[binding]] tables",
    "greater_than_equal": "raise the value to the minimum shown",
    "less_than_equal": "lower the value to the maximum shown",
    "string_too_short": "give a non-empty name",
    "string_too_long": "use at most 255 characters",
    "string_pattern_mismatch": "names may not contain whitespace",
    "value_error": "use a duration such as '500ms', '5s', '1m' or a number of seconds",
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
        TopologyValidationError: the path does not exist or holds no ``.toml`` file.

    """
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.toml"))
        if not files:
            raise TopologyValidationError([Problem(str(p), "-", "folder holds no *.toml topology file", "add one")])
        return files
    if not p.is_file():
        raise TopologyValidationError(
            [Problem(str(p), "-", "no such file or folder", "give a topology file or folder")]
        )
    return [p]


def load_topology(path: str | Path, broker_version: tuple[int, ...] | None = None) -> LoadedTopology:
    """Read and validate the topology at ``path`` (a ``.toml`` file or a folder of them).

    Args:
        path: A topology file, or a folder whose ``*.toml`` files are merged.
        broker_version: The connected broker's version (e.g. ``(3, 10, 8)``), to check
            version-dependent rules; None checks what holds on every supported version.

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
    for file in files:
        name = str(file)
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            problems.append(Problem(name, "-", f"not valid TOML: {exc}", "fix the file's syntax"))
            continue
        try:
            parsed.append((name, TopologyFile.model_validate(raw)))
        except ValidationError as exc:
            problems.extend(_pydantic_problems(name, exc, raw))
    if problems:
        raise TopologyValidationError(problems)
    if not any(tf.exchange or tf.job_queue or tf.binding for _, tf in parsed):
        raise TopologyValidationError(
            [Problem(str(path), "-", "the topology declares nothing", "add [[exchange]] and [[job_queue]] entries")]
        )
    warnings: list[str] = []
    problems.extend(_cross_checks(parsed, broker_version, warnings))
    if problems:
        raise TopologyValidationError(problems)
    topology = Topology(
        exchanges=tuple(e for _, f in parsed for e in f.exchange),
        job_queues=tuple(q for _, f in parsed for q in f.job_queue),
        bindings=tuple(b for _, f in parsed for b in f.binding),
    )
    return LoadedTopology(topology=topology, warnings=tuple(warnings), files=tuple(files))


def _key_path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "-"


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
            message = message.removeprefix("Value error, ")
            if "input" in err and kind not in ("missing",):
                message = f"{message} (got {str(err['input'])[:100]!r})"
        problems.append(Problem(file, _key_path(loc), message, fix))
    return problems


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = TopologyFile
    sections: dict[str, type[BaseModel]] = {
        "exchange": ExchangeSpec,
        "job_queue": JobQueueSpec,
        "binding": BindingSpec,
    }
    if len(loc) > 1 and isinstance(loc[0], str) and loc[0] in sections:
        model = sections[loc[0]]
    return sorted(model.model_fields)


def _cross_checks(
    parsed: list[tuple[str, TopologyFile]],
    broker_version: tuple[int, ...] | None,
    warnings: list[str],
) -> list[Problem]:
    problems: list[Problem] = []
    exchange_names: dict[str, str] = {}
    queue_names: dict[str, str] = {}

    def claim(table: dict[str, str], name: str, file: str, path: str, what: str) -> None:
        where = f"{file}: {path}"
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
            if ex.name.startswith("amq."):
                problems.append(
                    Problem(
                        file,
                        path,
                        f"{ex.name!r}: names starting 'amq.' are reserved by RabbitMQ",
                        "choose another name",
                    )
                )
            claim(exchange_names, ex.name, file, path, "exchange")
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            base = f"job_queue[{i}]"
            if jq.name.startswith("amq."):
                problems.append(
                    Problem(
                        file,
                        f"{base}.name",
                        f"{jq.name!r}: names starting 'amq.' are reserved by RabbitMQ",
                        "choose another name",
                    )
                )
            problems.extend(_queue_rules(file, base, jq, broker_version, warnings))
            decls = Topology(job_queues=(jq,)).declarations()
            too_long = [n for n in (*(q.name for q in decls.queues), *(e.name for e in decls.exchanges))
                        if len(n.encode("utf-8")) > 255]  # fmt: skip
            if too_long:
                problems.append(
                    Problem(file, f"{base}.name",
                            f"expanded name {too_long[0][:40]!r}... is {len(too_long[0].encode('utf-8'))} bytes; "
                            "RabbitMQ allows 255", "shorten the job queue name (tiers and quarantine add suffixes)")
                )  # fmt: skip
            if len(set(jq.keys)) != len(jq.keys):
                problems.append(
                    Problem(file, f"{base}.routing_keys", "a routing key is listed twice", "list each key once")
                )
            for q in decls.queues:
                claim(queue_names, q.name, file, f"{base}.name", f"queue (expanded from job queue {jq.name!r})")
            for ex_decl in decls.exchanges:
                claim(
                    exchange_names,
                    ex_decl.name,
                    file,
                    f"{base}.name",
                    f"exchange (expanded from job queue {jq.name!r})",
                )
    problems.extend(_routing_checks(parsed))
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            if jq.exchange not in exchange_names:
                problems.append(
                    Problem(
                        file,
                        f"job_queue[{i}].exchange",
                        f"exchange {jq.exchange!r} is not declared",
                        "declare it in an [[exchange]] entry or correct the name",
                    )
                )
        for i, b in enumerate(tf.binding):
            if b.source not in exchange_names:
                problems.append(
                    Problem(
                        file,
                        f"binding[{i}].source",
                        f"exchange {b.source!r} is not declared",
                        "declare it in an [[exchange]] entry or correct the name",
                    )
                )
            targets = queue_names if b.destination_type == "queue" else exchange_names
            if (
                b.source.endswith(QUARANTINE_SUFFIX)
                and b.destination in queue_names
                and not b.destination.endswith(QUARANTINE_SUFFIX)
            ):
                problems.append(
                    Problem(file, f"binding[{i}].destination",
                            f"binding quarantine exchange {b.source!r} to {b.destination!r} sends failed jobs "
                            "straight back to work: a loop", "remove the binding; use `amqpjobs replay` instead")
                )  # fmt: skip
            if b.destination not in targets:
                problems.append(
                    Problem(
                        file,
                        f"binding[{i}].destination",
                        f"{b.destination_type} {b.destination!r} is not declared",
                        f"declare the {b.destination_type} or correct the name",
                    )
                )
    return problems


def _routing_checks(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """Routing keys that would make a job run twice, or that an exchange type can't take."""
    problems: list[Problem] = []
    types = {e.name: e.type for _, tf in parsed for e in tf.exchange}
    owner: dict[tuple[str, str], str] = {}
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            kind = types.get(jq.exchange)
            if kind == "x-consistent-hash" and not all(k.isdigit() for k in jq.keys):
                problems.append(
                    Problem(file, f"job_queue[{i}].routing_keys",
                            "an x-consistent-hash exchange binds queues with integer weights",
                            'set routing_keys to weights such as ["1"]')
                )  # fmt: skip
            if kind in ("direct", "topic"):
                for key in dict.fromkeys(jq.keys):
                    other = owner.setdefault((jq.exchange, key), jq.name)
                    if other != jq.name:
                        problems.append(
                            Problem(file, f"job_queue[{i}].routing_keys",
                                    f"routing key {key!r} of exchange {jq.exchange!r} also routes to job queue "
                                    f"{other!r}: every such job would run twice",
                                    "give each job queue its own routing keys")
                        )  # fmt: skip
    return problems


def _quorum_priority_rules(
    file: str, base: str, max_priority: int, broker_version: tuple[int, ...] | None, warnings: list[str]
) -> list[Problem]:
    """``max_priority`` on a quorum job queue: 1..31 on RabbitMQ 4.3+, refused before.

    RabbitMQ 4.3 release notes: quorum queues have strict priorities 0-31 (a message without
    one counts as 4) and ignore ``x-max-priority``; 4.0-4.2 have two levels (0-4 normal,
    5-255 high), 3.x none. The bound is ours: enqueue refuses a priority above it, and no
    ``x-max-priority`` is sent (:func:`amqpjobs.wire.arguments.queue_arguments`).
    """
    key = f"{base}.max_priority"
    if max_priority > QUORUM_MAX_PRIORITY:
        return [
            Problem(file, key, f"quorum queues have priorities 0-{QUORUM_MAX_PRIORITY} (RabbitMQ 4.3+)",
                    f'lower max_priority to at most {QUORUM_MAX_PRIORITY}, or use type = "classic"')
        ]  # fmt: skip
    if broker_version is None:
        warnings.append(
            f"{file}: {key}: quorum-queue priorities need RabbitMQ 4.3+; `topology apply` and the worker "
            "refuse it on an older broker"
        )
        return []
    refusal = quorum_priority_refusal(broker_version)
    return [] if refusal is None else [Problem(file, key, *refusal)]


def _queue_rules(
    file: str,
    base: str,
    jq: JobQueueSpec,
    broker_version: tuple[int, ...] | None,
    warnings: list[str],
) -> list[Problem]:
    problems: list[Problem] = []
    if jq.type == "quorum":
        if jq.max_priority is not None:
            problems.extend(_quorum_priority_rules(file, base, jq.max_priority, broker_version, warnings))
        if jq.overflow == "drop-head":
            problems.append(
                Problem(
                    file,
                    f"{base}.overflow",
                    "quorum job queues dead-letter at-least-once, which needs overflow reject-publish",
                    'remove overflow or set it to "reject-publish"',
                )
            )
    elif jq.delivery_limit is not None:
        problems.append(
            Problem(
                file,
                f"{base}.delivery_limit",
                "delivery_limit applies to quorum queues only",
                'remove it, or use type = "quorum"',
            )
        )
    if jq.max_priority is not None and jq.max_priority > PRIORITY_WARN_ABOVE:
        warnings.append(
            f"{file}: {base}.max_priority: {jq.max_priority} priorities cost broker CPU "
            f"and memory; RabbitMQ recommends at most {PRIORITY_WARN_ABOVE}"
        )
    if jq.type == "classic" and jq.max_length is not None and jq.overflow == "reject-publish" and jq.retry_tiers:
        problems.append(
            Problem(
                file,
                f"{base}.max_length",
                "a retried job that its delay tier dead-letters back into a full classic work queue is dropped "
                "by the broker (classic queues dead-letter at-most-once, and reject-publish refuses it)",
                'set overflow = "drop-head" (the oldest job goes to quarantine, reason maxlen), use '
                'type = "quorum" (at-least-once dead-lettering keeps it waiting in its tier), or remove max_length',
            )
        )
    if jq.overflow == "drop-head" and jq.max_length is None:
        problems.append(
            Problem(
                file,
                f"{base}.overflow",
                "overflow has no effect without max_length",
                "add max_length or remove overflow",
            )
        )
    tiers = jq.retry_tiers
    for j in range(1, len(tiers)):
        if round(tiers[j] * 1000) <= round(tiers[j - 1] * 1000):
            problems.append(
                Problem(
                    file,
                    f"{base}.retry_tiers[{j}]",
                    f"retry tiers must strictly increase ({tiers[j - 1]:g}s then {tiers[j]:g}s)",
                    "list tiers from shortest to longest, each once",
                )
            )
    for j, t in enumerate(tiers):
        if t < 0.001 or t * 1000 > 2**32 - 1:
            problems.append(
                Problem(
                    file,
                    f"{base}.retry_tiers[{j}]",
                    f"{t:g}s is outside what x-message-ttl takes (1 ms to ~49 days)",
                    "use a delay between 1ms and 49d",
                )
            )
    if jq.routing_keys is not None and not jq.routing_keys:
        problems.append(
            Problem(
                file,
                f"{base}.routing_keys",
                "an empty list binds nothing",
                "remove routing_keys (defaults to the job queue name) or list keys",
            )
        )
    return problems
