"""``amqpjobs asyncapi``: a valid AsyncAPI 3.0 document of the app, checked against the official schema.

The schema is AsyncAPI's own (npm ``@asyncapi/specs`` 6.11.1, ``schemas/3.0.0.json``, Apache
2.0), vendored in ``tests/data/asyncapi``; it includes the AMQP 0.3.0 binding schemas.
"""

from __future__ import annotations

import copy
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from amqpjobs import App, JobContext
from amqpjobs.cli import main
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.asyncapi import asyncapi_document
from amqpjobs.jobs.events import OutcomeEvent, event_messages
from amqpjobs.topology.loader import load_topology

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "asyncapi" / "asyncapi-3.0.0.schema.json"
TOPOLOGY = """
[[exchange]]
name = "jobs"

[[exchange]]
name = "events"
type = "topic"

[[job_queue]]
name = "urgent"
exchange = "jobs"
max_priority = 5
retry_tiers = ["1s"]

[[job_queue]]
name = "tenants"
exchange = "events"
routing_keys = ["work.tenants"]
shards = 3
"""


class Address(BaseModel):
    city: str


class Confirm(BaseModel):
    order_id: int = Field(ge=1)
    to: str
    ship_to: Address | None = None


class Sync(BaseModel):
    tenant_id: str


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


def make_app(tmp_path: Path) -> App:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    app = App("shop", topology=load_topology(tmp_path / "t.toml").topology, app_version="1.4.2")

    async def handler(payload: Any, ctx: JobContext) -> None: ...

    app.job("orders.confirm", queue="urgent", payload=Confirm)(handler)
    app.job("orders/raw job", queue="urgent")(handler)  # no model; a name that is no component key
    app.job("tenants.sync", queue="tenants", payload=Sync)(handler)
    return app


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_document_is_valid_asyncapi_3(tmp_path: Path, validator: jsonschema.Draft7Validator) -> None:
    doc = asyncapi_document("shop", "1.4.2", make_app(tmp_path), make_app(tmp_path).topology())
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert all(resolve(doc, ref) is not None for ref in refs(doc))  # every $ref points into the document
    # the schema does check the AMQP bindings: a wrong delivery mode is refused
    broken = copy.deepcopy(doc)
    broken["operations"]["send.urgent"]["bindings"]["amqp"]["deliveryMode"] = 3
    assert [e.validator for e in validator.iter_errors(broken)] != []


def test_channels_messages_and_bindings(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    assert doc["info"] == {**doc["info"], "title": "shop", "version": "1.4.2"}
    channels = doc["channels"]
    assert list(channels) == ["urgent", "tenants.shard-0", "tenants.shard-1", "tenants.shard-2", "amqpjobs.events"]
    assert [c["address"] for c in channels.values()] == [
        "urgent", "work.tenants.shard-0", "work.tenants.shard-1", "work.tenants.shard-2", "{jobQueue}.{outcome}",
    ]  # fmt: skip
    assert channels["urgent"]["bindings"]["amqp"]["exchange"] == {
        "name": "jobs", "type": "direct", "durable": True, "autoDelete": False,
    }  # fmt: skip
    assert channels["tenants.shard-1"]["bindings"]["amqp"]["exchange"]["type"] == "topic"
    assert channels["tenants.shard-2"]["x-amqpjobs-shard"]["index"] == 2
    assert sorted(channels["urgent"]["messages"]) == ["orders.confirm", "orders_raw_job"]
    assert doc["operations"]["send.urgent"]["bindings"]["amqp"] == {
        "deliveryMode": 2, "mandatory": True, "timestamp": True, "bindingVersion": "0.3.0",
    }  # fmt: skip

    messages = doc["components"]["messages"]
    confirm = messages["orders.confirm"]
    assert confirm["bindings"]["amqp"]["messageType"] == "orders.confirm"
    assert confirm["x-amqp-properties"]["properties"]["priority"]["maximum"] == 5
    assert "priority" not in messages["tenants.sync"]["x-amqp-properties"]["properties"]  # classic, no priorities
    assert messages["orders_raw_job"]["payload"] == {"type": "object", "description": "Any JSON object."}
    headers = confirm["headers"]  # inline: components/schemas is the app models' namespace
    assert sorted(headers["properties"]) == sorted([envelope.ATTEMPT, envelope.TENANT, envelope.ENQUEUED_AT,
                                                    envelope.JOB, envelope.PAYLOAD_REF,
                                                    *envelope.TRACE_HEADERS])  # fmt: skip
    ref = headers["properties"]["amqpjobs-payload-ref"]
    assert re.fullmatch(ref["pattern"], "s3:9f1c2e0b5a7d4c3e8b6a1f0e2d4c6b8a")
    assert not re.fullmatch(ref["pattern"], "s3:../etc")
    assert not re.fullmatch(ref["pattern"], "nocolon")
    assert list(envelope.TRACE_HEADERS) == ["traceparent", "tracestate", "baggage"]
    assert headers["properties"]["traceparent"]["type"] == "string"

    # the payload schema is the model's, its $defs hoisted into components/schemas
    payload = {**confirm["payload"], "components": doc["components"]}
    jsonschema.validate({"order_id": 17, "to": "a@b", "ship_to": {"city": "Graz"}}, payload)
    for bad in ({"order_id": 0, "to": "a@b"}, {"order_id": 1}, {"order_id": 1, "to": "a", "ship_to": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, payload)


def test_outcome_events_are_a_receive_channel_on_the_topic_exchange(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    channel = doc["channels"]["amqpjobs.events"]
    assert channel["bindings"]["amqp"]["exchange"] == {
        "name": "amqpjobs.events", "type": "topic", "durable": True, "autoDelete": False,
    }  # fmt: skip
    assert doc["operations"]["receive.amqpjobs.events"]["action"] == "receive"
    schema = doc["components"]["messages"]["amqpjobs.outcome-event"]["payload"]
    event = OutcomeEvent("mail", "j-1", 2, "quarantined", "exhausted", "E: x", "mail", "", "2026-11-30T03:00:00.000Z")
    _, body = event_messages([("mail.quarantined", event.encode()), ("mail.quarantined", event.encode())])[0]
    jsonschema.validate(json.loads(body), schema)
    for wrong in ([], [{**json.loads(event.encode()), "outcome": "exploded"}], json.loads(event.encode())):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_shard_rule_in_the_document_is_the_enqueue_rule(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    layout = app.layout_of("tenants.sync")
    for tenant in ("acme", "globex", "ключ"):
        index = zlib.crc32(tenant.encode("utf-8")) % 3
        assert doc["channels"][f"tenants.shard-{index}"]["address"] == layout.shard_routing_keys[index]


def test_a_job_queue_missing_from_the_topology_is_a_configuration_error(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    async def handler(payload: Any, ctx: JobContext) -> None: ...

    app.job("lost", queue="nowhere")(handler)
    with pytest.raises(ConfigurationError, match="job queue 'nowhere' is not in the topology"):
        asyncapi_document(app.name, app.app_version, app, app.topology())


def test_cli_writes_the_document(tmp_path: Path, validator: jsonschema.Draft7Validator) -> None:
    out = tmp_path / "asyncapi.json"
    result = CliRunner().invoke(main, ["asyncapi", "examples.shop:app", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert list(doc["channels"]) == ["urgent", "billing", "batch", "amqpjobs.events"]
    assert sorted(doc["components"]["messages"]) == [
        "amqpjobs.outcome-event", "orders.confirm", "orders.sync_crm", "payments.capture", "reports.daily",
    ]  # fmt: skip
    stdout = CliRunner().invoke(main, ["asyncapi", "examples.shop:app"])
    assert json.loads(stdout.stdout) == doc


def test_amqp_short_strings_state_their_limit_in_utf8_bytes(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    message_id = doc["components"]["messages"]["orders.confirm"]["x-amqp-properties"]["properties"]["message_id"]
    assert "255 UTF-8 bytes" in message_id["description"]
    assert message_id["maxLength"] == 255  # characters: an upper bound only (JSON Schema can't count bytes)
    # every free-text short string a publisher may set has the same bound: a longer one, which the management
    # API's HTTP publish lets in, is a message RabbitMQ cannot deliver (README "Wire format")
    for name, job in doc["components"]["messages"].items():
        for prop, schema in job.get("x-amqp-properties", {}).get("properties", {}).items():
            if schema.get("type") == "string":
                assert schema.get("maxLength") == 255, (name, prop)
                assert "255 UTF-8 bytes" in schema["description"], (name, prop)


def test_the_tenant_schema_has_the_limit_enqueue_has(tmp_path: Path) -> None:
    """None: enqueue takes a tenant of any length, and so does the worker; the schema must not say 255."""
    app = make_app(tmp_path)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    tenant = doc["components"]["messages"]["orders.confirm"]["headers"]["properties"][envelope.TENANT]
    assert "maxLength" not in tenant
    assert "No length limit of ours" in tenant["description"]


def test_a_user_model_named_like_our_headers_schema_collides_with_nothing(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text(TOPOLOGY)
    app = App("shop", topology=load_topology(tmp_path / "t.toml").topology)
    user_model = type("AmqpjobsHeaders", (BaseModel,), {"__annotations__": {"sku": str}})
    nested = type("Order", (BaseModel,), {"__annotations__": {"headers": user_model}})

    async def handler(payload: Any, ctx: JobContext) -> None: ...

    app.job("plain", queue="urgent", payload=user_model)(handler)
    app.job("nested", queue="urgent", payload=nested)(handler)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    messages = doc["components"]["messages"]
    for name in ("plain", "nested"):
        headers = messages[name]["headers"]
        headers = resolve(doc, headers["$ref"]) if "$ref" in headers else headers
        assert sorted(headers["properties"]) == sorted(
            [
                envelope.ATTEMPT,
                envelope.TENANT,
                envelope.ENQUEUED_AT,
                envelope.JOB,
                envelope.PAYLOAD_REF,
                *envelope.TRACE_HEADERS,
            ]
        ), name
    user_schema = {**messages["plain"]["payload"], "components": doc["components"]}
    user_schema = resolve(user_schema, user_schema["$ref"]) if "$ref" in user_schema else user_schema
    assert list(user_schema["properties"]) == ["sku"]
    nested_payload = {**messages["nested"]["payload"], "components": doc["components"]}
    jsonschema.validate({"headers": {"sku": "x"}}, nested_payload)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"headers": {"amqpjobs-attempt": "x"}}, nested_payload)


def test_modulus_hash_shards_are_one_channel_on_the_broker_side_exchange(
    tmp_path: Path, validator: jsonschema.Draft7Validator
) -> None:
    """``shard_routing = "modulus-hash"`` (RabbitMQ 4.3+): publishers send to ``tenants.shards`` with the key itself."""
    (tmp_path / "t.toml").write_text(TOPOLOGY.replace("shards = 3", 'shards = 3\nshard_routing = "modulus-hash"'))
    app = App("shop", topology=load_topology(tmp_path / "t.toml").topology, app_version="1.4.2")

    async def handler(payload: Any, ctx: JobContext) -> None: ...

    app.job("tenants.sync", queue="tenants", payload=Sync)(handler)
    doc = asyncapi_document(app.name, app.app_version, app, app.topology())
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert [c for c in doc["channels"] if c.startswith("tenants")] == ["tenants"]
    channel = doc["channels"]["tenants"]
    assert channel["address"] == "{shardKey}"
    assert channel["bindings"]["amqp"]["exchange"]["name"] == "tenants.shards"
    assert channel["x-amqp-exchange-type"] == "x-modulus-hash"  # the AMQP binding's type enum lacks it
    assert "x-amqpjobs-shard" not in channel
    assert app.layout_of("tenants.sync").publish_target("acme") == ("tenants.shards", "acme")
