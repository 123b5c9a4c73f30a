"""What the console's pages show, read through the library (no HTML here)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import evidence
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.fingerprint import FailureGroup, failure_groups
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.runtime.app import App
from amqpjobs.runtime.quarantine import QuarantinedMessage, browse, quarantine_queues
from amqpjobs.runtime.status import JobQueueStatus, collect
from amqpjobs.runtime.whereabouts import where_now
from amqpjobs.text import encodable
from amqpjobs.topology.naming import QUARANTINE_SUFFIX, parked_queue_name
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.settings import BrokerSettings

#: Messages listed on a quarantine page (the groups count them all).
LISTED = 200
#: Headers of a message shown first, as its evidence (the rest follow under "all headers").
EVIDENCE_FIRST = (
    evidence.REASON, evidence.ERROR_TYPE, evidence.ERROR_MESSAGE, evidence.ATTEMPTS, evidence.FIRST_FAILURE_AT,
    evidence.LAST_FAILURE_AT, evidence.ORIGINAL_QUEUE, evidence.WORKER_HOST, evidence.WORKER_PID,
    evidence.APP_VERSION, evidence.VERSION,
)  # fmt: skip
#: Bytes of a payload shown on its page (the rest is counted, not sent to the browser).
PAYLOAD_SHOWN = 64 * 1024
#: ``delivery_mode`` values (AMQP 0-9-1 class ``basic``: 1 non-persistent, 2 persistent).
DELIVERY_MODES = {1: "1 (transient)", 2: "2 (persistent)"}
#: Headers that make a message's replay history.
HISTORY = (q.REPLAY_COUNT, q.REPLAY_ID, q.PREVIOUS_REASON, q.PREVIOUS_ERROR_TYPE, q.PREVIOUS_ERROR_MESSAGE,
           q.PREVIOUS_FAILURE_AT, q.PARKED_AT)  # fmt: skip


async def job_queue_names(broker: BrokerSettings, app: App | None) -> list[str]:
    """The job queues shown: the app's (``--app``), else one per ``*.quarantine`` queue of the vhost."""
    if app is not None:
        return [lay.name for lay in app.topology().layouts()]
    names = await asyncio.to_thread(quarantine_queues, broker)
    return [n.removesuffix(QUARANTINE_SUFFIX) for n in names]


async def overview(broker: BrokerSettings, app: App | None) -> list[JobQueueStatus]:
    """The ``status`` figures of every job queue shown (parked included)."""
    if app is not None:
        return await collect(broker, list(app.topology().layouts()))
    names = await job_queue_names(broker, None)
    return await collect(broker, None, names) if names else []


@dataclass
class QuarantinePage:
    """A quarantine (or parked) queue: its failure groups and the messages matching the filters."""

    queue: str
    depth: int
    matched: int
    groups: list[FailureGroup]
    messages: list[QuarantinedMessage]
    present: dict[str, list[str]] = field(default_factory=dict)


async def quarantine_page(broker: BrokerSettings, queue: str, chosen: Selection) -> QuarantinePage:
    """Browse ``queue`` (its messages return to it) and group what matches ``chosen``.

    Raises:
        ConfigurationError: no such quarantine or parked queue.

    """
    census = Census()
    name, found = await browse(broker, queue, None, chosen, census, keep_bodies=0)  # the page shows no payload
    present = {
        "jobs": sorted(census.jobs),
        "reasons": sorted(census.reasons),
        "error_types": sorted(t for t in census.error_types if t),
    }
    return QuarantinePage(name, census.depth, len(found), failure_groups(m.item for m in found), found[:LISTED],
                          present)  # fmt: skip


def message_doc(message: QuarantinedMessage) -> dict[str, Any]:
    """A message as its page shows it: evidence, traceback, payload, every property, headers, history.

    Text is given as it is: the page's template escapes HTML, and its ``finalize``
    (:func:`~amqpjobs.printable.printable_lines`) every control character but line feeds.
    """
    doc = message.to_json()
    headers: dict[str, Any] = doc["headers"]
    kind, payload, note = payload_view(message.delivery.body)
    return {
        "item": message.item,
        "queue": doc["queue"],
        "evidence": [(k, _shown(headers[k])) for k in EVIDENCE_FIRST if k in headers],
        "traceback": q.header_text(headers.get(evidence.TRACEBACK, "")),  # no text: its AMQP type
        "payload": payload,
        "payload_kind": kind,
        "payload_note": note,
        "properties": properties_shown(message.delivery),
        "headers": sorted(
            ((k, _shown(v)) for k, v in doc.get("header_entries") or headers.items()), key=lambda kv: kv[0]
        ),
        "history": [(k, _shown(headers[k])) for k in HISTORY if k in headers],
    }


def _shown(value: Any) -> str:
    """A header's JSON value (``to_json``) on the page: text as it is, anything else as JSON, never Python's repr."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def properties_shown(delivery: Delivery) -> list[tuple[str, str]]:
    """Every AMQP property of ``delivery`` (:meth:`~amqpjobs.wire.delivery.Delivery.properties`), then its origin.

    ``-`` for a property not set (or empty); ``timestamp`` in ISO-8601 UTC with its seconds, ``delivery_mode``
    and ``expiration`` with their meaning, ``headers`` counted (they are listed under their own heading).
    """
    shown = []
    for name, value in delivery.properties().items():
        if name == "headers":
            text = f"{len(value or {})} header(s), below"
        elif value is None or value == "":  # pamqp reads some unset properties as ""
            text = "-"
        elif name == "timestamp":
            text = f"{iso_utc(value)} ({value:.0f})"
        elif name == "delivery_mode":
            text = DELIVERY_MODES.get(value, str(value))
        elif name == "expiration":
            text = f"{value} ms"
        else:
            text = str(value)
        shown.append((name, text))
    return [*shown, ("exchange", delivery.exchange or "(default)"), ("routing_key", delivery.routing_key),
            ("redelivered", str(delivery.redelivered))]  # fmt: skip


def payload_view(body: bytes) -> tuple[str, str, str]:
    """(what it is, the text shown, a note when cut) of a message body.

    Pretty JSON when the body is JSON, the text when it is other UTF-8, else a hex dump (16
    bytes a line, offset, hex, ASCII); at most :data:`PAYLOAD_SHOWN` bytes of it, the note
    then saying ``truncated: N bytes in all, the first 65,536 shown``.
    """
    size = len(body)
    note = f"truncated: {size:,} bytes in all, the first {PAYLOAD_SHOWN:,} shown"
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        return (
            f"binary (not UTF-8): {size:,} bytes, as a hex dump",
            hex_dump(body[:PAYLOAD_SHOWN]),
            (note if size > PAYLOAD_SHOWN else ""),
        )
    try:
        text, kind = json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True), "JSON"
        text = encodable(text)  # a lone surrogate (a "\ud800" escape) as "?": the page is UTF-8
    except (ValueError, RecursionError):
        kind = "text (UTF-8, not JSON)"
    data = text.encode("utf-8")
    if len(data) <= PAYLOAD_SHOWN:
        return f"{kind}: {size:,} bytes", text, ""
    return f"{kind}: {size:,} bytes", data[:PAYLOAD_SHOWN].decode("utf-8", "ignore"), note


def hex_dump(data: bytes) -> str:
    """``data`` as ``hexdump -C`` prints it: ``00000000  7b 22 6e 22 ...  |{"n"...|`` (no trailing offset line)."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = data[at : at + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        ascii_ = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{at:08x}  {hexes:<48}  |{ascii_}|")
    return "\n".join(lines)


async def find_message(broker: BrokerSettings, queue: str, job_id: str) -> QuarantinedMessage | None:
    """The message of job ``job_id`` (or key, a content hash) in ``queue``, None when not there (browsed, it stays)."""
    _, found = await browse(broker, queue, 1, Selection(job_ids=frozenset({job_id})))
    return found[0] if found else None


@dataclass
class Lookup:
    """What a job lookup found: the results store's lines (with ``--app``) and the queues holding it."""

    job_id: str
    lines: list[str]
    where: str
    found_in: list[str]


async def lookup(broker: BrokerSettings, app: App | None, job_id: str) -> Lookup:
    """Job ``job_id``: its record and where it is (``job show``), else browse every quarantine and parked queue."""
    lines: list[str] = []
    where = ""
    if app is not None and app.results is not None:
        status = await app.job_status(job_id)
        lines, where = status.report(), await where_now(broker, app, status)
    found_in = []
    for job_queue in await job_queue_names(broker, app):
        for queue in (job_queue + QUARANTINE_SUFFIX, parked_queue_name(job_queue)):
            try:
                if await find_message(broker, queue, job_id) is not None:
                    found_in.append(queue)
            except ConfigurationError:  # no parked queue yet
                continue
    return Lookup(job_id, lines, where, found_in)
