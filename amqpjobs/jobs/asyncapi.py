"""An AsyncAPI 3.0 document of an app's jobs: what a publisher in any language needs (no I/O).

``amqpjobs asyncapi MODULE:APP`` writes it. The document describes the publishing side of
the wire format (README "Wire format"):

* one **channel** per work queue a publisher addresses: the job queue itself, or each of
  its shards (``<job queue>.shard-<i>``). Its ``address`` is the routing key, its AMQP
  channel binding (0.3.0) names the exchange (``is: routingKey``), and for a shard an
  ``x-amqpjobs-shard`` extension gives the shard rule; a job queue with ``shard_routing =
  "modulus-hash"`` (RabbitMQ 4.3+) has one channel instead: its ``x-modulus-hash`` exchange
  ``<job queue>.shards``, address ``{shardKey}`` (the tenant, else the message id);
* one **operation** per channel (``action: send``), with the AMQP operation binding:
  ``deliveryMode: 2``, ``mandatory: true``, ``timestamp: true``;
* the **outcome events** workers publish (README "Wire format" → "Outcome events"): one
  channel on the topic exchange ``amqpjobs.events``, address ``{jobQueue}.{outcome}``, with a
  ``receive`` operation and the events message (:func:`amqpjobs.jobs.events.message_schema`);
* one **message** per job: ``payload`` is the JSON Schema of the job's pydantic model
  (``{"type": "object"}`` for a job without one), ``headers`` the JSON Schema of our
  headers, the AMQP message binding's ``messageType`` the job name, and an
  ``x-amqp-properties`` extension the JSON Schema of the AMQP basic properties to set.

Pydantic's ``$defs`` are hoisted into ``components/schemas`` (a ``$ref`` in an AsyncAPI
document resolves against the document, not against the payload schema). That namespace is
the app's alone: our headers' schema is inline in each message, so an app model of any name
(``AmqpjobsHeaders`` included) can't replace it or be replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.events import OUTCOMES, message_schema
from amqpjobs.jobs.evidence import WORKER_HEADROOM
from amqpjobs.jobs.header_values import COUNT_MAX
from amqpjobs.jobs.registry import JobDef
from amqpjobs.topology.models import JobQueueLayout, Topology
from amqpjobs.topology.naming import EVENTS_EXCHANGE

ASYNCAPI_VERSION: Final = "3.0.0"
AMQP_BINDING_VERSION: Final = "0.3.0"
_KEY_UNSAFE = re.compile(r"[^\w.\-]")


def headers_schema() -> dict[str, Any]:
    """JSON Schema of the headers a publisher sets (README "Wire format"; all optional)."""
    return {
        "type": "object",
        "description": (
            "Headers of a job message. Names starting 'x-' belong to the broker and other 'amqpjobs-' "
            "names to the worker: a publisher sets none of them. Other headers are passed to the "
            "handler (ctx.headers) and kept on every copy."
        ),
        "properties": {
            envelope.ATTEMPT: {
                "type": "integer", "minimum": 1, "maximum": COUNT_MAX, "default": 1,
                "description": "The attempt this delivery is: 1 for a new job (missing = 1). Also read, alike in "
                "every AMQP encoding: integral floats and decimals, ASCII digit strings and byte arrays "
                "(whitespace around them ignored, no sign). A whole number above 2**63 - 1 reads as 2**63 - 1. "
                "Anything else (negative, a fraction, another type) counts as 1; above the job's max_attempts "
                "the job is quarantined 'exhausted' without running.",
            },
            envelope.TENANT: {
                "type": "string",
                "description": "Tenant key, optional; picks the shard of a sharded job queue. "
                "'' (or blank) means no tenant. No length limit of ours (an AMQP long string: the "
                "whole header table must fit in one frame, frame_max, 128 KiB by default, less "
                f"{WORKER_HEADROOM // 1024} KiB for the headers a worker adds to its copies: "
                f"{128 * 1024 - WORKER_HEADROOM} bytes of properties and headers in all).",
            },
            envelope.ENQUEUED_AT: {
                "type": "string", "format": "date-time", "examples": ["2026-11-29T09:00:00.000Z"],
                "description": "First enqueue time, ISO-8601 UTC (no zone is read as UTC). Also read: an "
                "AMQP timestamp, a non-negative integer, float or decimal of seconds (milliseconds above "
                "2**32 - 1), or that number as text (digits, at most one '.'). "
                "Optional: the timestamp property is used without it (or for anything else). Every copy "
                "carries it (from the timestamp property when it was missing).",
            },
            envelope.JOB: {
                "type": "string",
                "description": "The job name, read only when the 'type' property is absent.",
            },
            envelope.PAYLOAD_REF: {
                "type": "string", "pattern": "^[a-z][a-z0-9-]{0,62}:[A-Za-z0-9][A-Za-z0-9._-]{0,199}$",
                "examples": ["s3:9f1c2e0b5a7d4c3e8b6a1f0e2d4c6b8a"],
                "description": "'<store>:<key>': the payload is kept in the app's payload store under <key> and the "
                "body is empty (README 'Large payloads'); set by enqueue for a payload over the store's threshold. "
                "A publisher in another language may set it after writing the payload (UTF-8 JSON) to the same "
                "store. Kept on every copy; a malformed value, another store's name or a missing payload "
                "quarantines the job (payload-ref-invalid, payload-store-unknown, payload-missing).",
            },
            envelope.TRACEPARENT: {
                "type": "string", "examples": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
                "description": "W3C Trace Context traceparent of the publisher's span, optional (README "
                "'Tracing'). A worker with tracing on runs the job in a span whose parent and link is this "
                "context; a malformed value starts a new trace and never fails the job. Kept on every copy.",
            },
            envelope.TRACESTATE: {
                "type": "string",
                "description": "W3C Trace Context tracestate, optional; read with traceparent, kept on every copy.",
            },
            envelope.BAGGAGE: {
                "type": "string",
                "description": "W3C Baggage, optional; read with traceparent, kept on every copy.",
            },
        },
    }  # fmt: skip


def _properties_schema(job: JobDef, layout: JobQueueLayout) -> dict[str, Any]:
    """JSON Schema of the AMQP basic properties of a job message (``x-amqp-properties``)."""
    props: dict[str, Any] = {
        "content_type": {"const": envelope.CONTENT_TYPE},
        "message_id": {
            "type": "string", "minLength": 1, "maxLength": envelope.SHORTSTR_MAX_BYTES,
            "description": f"The job id: 1-{envelope.SHORTSTR_MAX_BYTES} UTF-8 bytes (an AMQP short string; "
            "maxLength counts characters, so it is only an upper bound: 128 'é' are 256 bytes, too long).",
        },
        "type": {"const": job.name, "description": "The job name."},
        "timestamp": {
            "type": "integer", "minimum": 0,
            "description": "Enqueue time in integer seconds since the epoch (Math.floor(Date.now() / 1000)); "
            "a value above 2**32 - 1 is read as milliseconds. On the worker's copies: when the copy becomes "
            "ready in the work queue (a retry copy: its publish + its tier's delay; a replayed one: its "
            "publish); the first enqueue time is then in amqpjobs-enqueued-at.",
        },
        "delivery_mode": {"const": 2, "description": "Persistent."},
        "app_id": {
            "type": "string", "maxLength": envelope.SHORTSTR_MAX_BYTES,
            "description": f"Optional: names the publisher; never read. At most {envelope.SHORTSTR_MAX_BYTES} UTF-8 "
            "bytes, as every AMQP short-string property: a longer one (only the management API's HTTP publish "
            "takes it) makes a message RabbitMQ cannot deliver (README 'Wire format').",
        },
    }  # fmt: skip
    # a quorum queue counts a message without priority as 4 on RabbitMQ 4.3 (release notes 4.3.0):
    # ours always carry one (0 by default), so a foreign job without one goes ahead of ours
    quorum_default = (
        " Send one always (0 by default, as amqpjobs does): RabbitMQ 4.3 counts a message without"
        " priority as 4 on a quorum queue, ahead of jobs sent with 0."
    )
    if layout.max_priority is not None:  # enqueue's rule: 0..max_priority
        props["priority"] = {
            "type": "integer", "minimum": 0, "maximum": layout.max_priority,
            "description": (
                "Strict priorities 0-31 (RabbitMQ 4.3+)." + quorum_default
                if layout.queue_type == "quorum"
                else "Optional; a classic queue delivers a higher one as the maximum."
            ),
        }  # fmt: skip
    elif layout.queue_type == "quorum":
        props["priority"] = {
            "type": "integer", "minimum": 0, "maximum": 255,
            "description": "Quorum queues: 4.0-4.2 two levels (0-4 normal, above 4 high), 4.3 0-31; before 4.0"
            " none (the broker ignores it; amqpjobs' enqueue refuses one)." + quorum_default,
        }  # fmt: skip
    return {
        "type": "object",
        "required": ["content_type", "message_id", "type", "timestamp", "delivery_mode"],
        "properties": props,
    }


def _key(text: str, taken: set[str]) -> str:
    """A component key (word characters, dots and dashes) for ``text``, unique among ``taken``."""
    base = _KEY_UNSAFE.sub("_", text) or "_"
    key, n = base, 2
    while key in taken:
        key, n = f"{base}_{n}", n + 1
    taken.add(key)
    return key


def _payload_schemas(jobs: list[JobDef]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each model's JSON Schema (by job name) and the shared definitions, refs into components/schemas."""
    models: dict[type[BaseModel], None] = {job.payload_model: None for job in jobs if job.payload_model}
    if not models:
        return {}, {}
    by_model, top = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    defs: dict[str, Any] = top.get("$defs", {})
    out = {}
    for job in jobs:
        if job.payload_model is not None:
            out[job.name] = by_model[(job.payload_model, "validation")]
    return out, defs


def _add_outcome_events(
    channels: dict[str, Any],
    operations: dict[str, Any],
    messages: dict[str, Any],
    channel_keys: set[str],
    message_keys: set[str],
) -> None:
    """Add the outcome events channel, its ``receive`` operation and its message."""
    channel, message = _key(EVENTS_EXCHANGE, channel_keys), _key("amqpjobs.outcome-event", message_keys)
    messages[message] = {
        "name": "outcome-event",
        "title": "outcome event",
        "summary": "Delivery outcomes of one job queue and outcome (a JSON array, in the order recorded, "
        "replayed jobs' first), published by a worker without publisher confirms (may be lost).",
        "contentType": envelope.CONTENT_TYPE,
        "payload": message_schema(),
    }
    channels[channel] = {
        "address": "{jobQueue}.{outcome}",
        "title": f"outcome events ({EVENTS_EXCHANGE})",
        "description": f"Bind an exclusive, auto-delete queue of your own to topic exchange {EVENTS_EXCHANGE!r} "
        "(e.g. '<job queue>.*', '*.quarantined', '#'); events published before the binding exists are gone.",
        "parameters": {
            "jobQueue": {"description": "The job queue the delivery came from."},
            "outcome": {"enum": list(OUTCOMES), "description": "What happened to the delivery."},
        },
        "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        "bindings": {"amqp": {
            "is": "routingKey",
            "exchange": {"name": EVENTS_EXCHANGE, "type": "topic", "durable": True, "autoDelete": False},
            "bindingVersion": AMQP_BINDING_VERSION,
        }},
    }  # fmt: skip
    operations[f"receive.{channel}"] = {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{channel}"},
        "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
        "bindings": {"amqp": {"ack": False, "bindingVersion": AMQP_BINDING_VERSION}},
    }


def asyncapi_document(app_name: str, app_version: str, jobs: Iterable[JobDef], topology: Topology) -> dict[str, Any]:
    """Build the AsyncAPI 3.0 document of ``jobs`` over ``topology``.

    Args:
        app_name: The app's name (``info.title``).
        app_version: The app's version (``info.version``; ``"unversioned"`` when empty).
        jobs: The registered jobs; each names a job queue of ``topology``.
        topology: The topology the jobs are published into.

    Returns:
        The document as JSON-ready data.

    Raises:
        ConfigurationError: a job's queue is not in the topology.

    """
    jobs = sorted(jobs, key=lambda j: j.name)
    exchange_types = {e.name: e.type for e in topology.exchanges}
    payloads, schemas = _payload_schemas(jobs)
    message_keys: set[str] = set()
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    by_queue: dict[str, list[tuple[JobDef, str]]] = {}
    known = {spec.name for spec in topology.job_queues}
    for job in jobs:
        if job.queue not in known:
            raise ConfigurationError(f"job {job.name!r}: job queue {job.queue!r} is not in the topology")
        layout = topology.layout(job.queue)
        key = _key(job.name, message_keys)
        by_queue.setdefault(job.queue, []).append((job, key))
        messages[key] = {
            "name": job.name,
            "title": f"job {job.name}",
            "summary": f"Enqueue job {job.name!r} (job queue {job.queue!r}).",
            "contentType": envelope.CONTENT_TYPE,
            # inline, not in components/schemas: that namespace is the app's pydantic models', and an
            # app model may have any name there
            "headers": headers_schema(),
            "payload": payloads.get(job.name, {"type": "object", "description": "Any JSON object."}),
            "bindings": {"amqp": {"messageType": job.name, "bindingVersion": AMQP_BINDING_VERSION}},
            "x-amqp-properties": _properties_schema(job, layout),
        }
    channel_keys: set[str] = set()
    for queue, members in by_queue.items():
        layout = topology.layout(queue)
        shards = () if layout.shards_exchange else layout.shard_routing_keys
        targets = list(zip(layout.work_queues, shards, strict=True)) if shards else [(queue, layout.routing_key)]
        exchange = layout.shards_exchange or layout.exchange
        for index, (work_queue, routing_key) in enumerate(targets):
            channel = _key(work_queue, channel_keys)
            binding: dict[str, Any] = {
                "is": "routingKey",
                "exchange": {
                    "name": exchange, "type": exchange_types.get(exchange, "direct"),
                    "durable": True, "autoDelete": False,
                },
                "bindingVersion": AMQP_BINDING_VERSION,
            }  # fmt: skip
            channels[channel] = {
                "address": routing_key,
                "title": f"work queue {work_queue}",
                "description": f"Publish to exchange {layout.exchange!r} with routing key {routing_key!r}; "
                f"the broker routes it to work queue {work_queue!r}.",
                "messages": {key: {"$ref": f"#/components/messages/{key}"} for _, key in members},
                "bindings": {"amqp": binding},
            }
            if layout.shards_exchange:  # RabbitMQ 4.3+: the broker picks the shard (hash of the routing key mod N)
                del binding["exchange"]["type"]  # the AMQP binding's enum has no x-modulus-hash: said below instead
                channels[channel] |= {
                    "x-amqp-exchange-type": "x-modulus-hash",
                    "address": "{shardKey}",
                    "title": f"job queue {queue} ({len(layout.work_queues)} shards, picked by the broker)",
                    "description": f"Publish to the x-modulus-hash exchange {exchange!r} (RabbitMQ 4.3+) with the "
                    "shard key as routing key: the tenant header's value, else the message_id. The broker "
                    f"routes it to one of the shards {', '.join(layout.work_queues)}; no client-side hash.",
                    "parameters": {"shardKey": {"description": "the amqpjobs-tenant header's value, else message_id"}},
                }
            if shards:
                channels[channel]["x-amqpjobs-shard"] = {
                    "index": index, "of": len(shards),
                    "rule": "zlib CRC-32 of the UTF-8 bytes of the tenant header (else of message_id), modulo 'of'",
                }  # fmt: skip
            operations[f"send.{channel}"] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{channel}"},
                "messages": [{"$ref": f"#/channels/{channel}/messages/{key}"} for _, key in members],
                "bindings": {"amqp": {
                    "deliveryMode": 2, "mandatory": True, "timestamp": True, "bindingVersion": AMQP_BINDING_VERSION,
                }},
            }  # fmt: skip
    if channels:
        _add_outcome_events(channels, operations, messages, channel_keys, message_keys)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": app_name,
            "version": app_version or "unversioned",
            "description": "Jobs of this amqpjobs app, as publishers send them (README 'Wire format'). "
            "Publish with publisher confirms and mandatory set; a returned message was not enqueued.",
        },
        "defaultContentType": envelope.CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }
