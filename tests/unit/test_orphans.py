"""Which live queues are orphans of ours: parsed by the naming scheme, and marked by the arguments we declare."""

from __future__ import annotations

from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.orphans import declared_by_us, orphan_fixes, orphan_queues, removed_job_queues
from amqpjobs.wire.arguments import queue_arguments

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "NAME"
exchange = "jobs"
retry_tiers = ["5s"]
"""


def live_arguments(tmp_path, name: str) -> dict[str, dict[str, object]]:
    """Every queue job queue ``name`` declares, with the arguments amqpjobs sends for it."""
    path = tmp_path / f"{name}.toml"
    path.write_text(TOPOLOGY.replace("NAME", name))
    return {q.name: queue_arguments(q) for q in load_topology(path).topology.declarations().queues}


def test_every_queue_of_a_job_queue_the_topology_no_longer_names_is_an_orphan(tmp_path):
    live = live_arguments(tmp_path, "batch") | live_arguments(tmp_path, "keep")
    live |= {"other": {}, "plain": {"x-dead-letter-exchange": "dlx"}, "other.quarantine": {}}
    layouts = load_topology(_write(tmp_path, "keep")).topology.layouts()
    assert removed_job_queues({"keep"}, live) == ["batch"]
    assert orphan_queues(layouts, live, live) == [
        "batch", "batch.parked", "batch.quarantine", "batch.retry.5s", "batch.suspects",
    ]  # fmt: skip
    assert orphan_queues(layouts, live) == []  # names alone never say a whole job queue is ours
    assert orphan_queues(layouts, live, live, known={"batch"}) == []  # narrowed: batch is in the topology
    fixes = dict(zip(["batch", "batch.quarantine", "batch.retry.5s"], orphan_fixes(
        layouts, [("batch", 1), ("batch.quarantine", 2), ("batch.retry.5s", 1)]), strict=True))  # fmt: skip
    assert "put job queue batch back in the topology so workers read it again" in fixes["batch"]
    assert "amqpjobs replay batch.quarantine --to QUEUE" in fixes["batch.quarantine"]
    assert fixes["batch.retry.5s"].startswith("its messages go back to batch when their delay ends; it belongs to")


def test_a_queue_is_ours_only_with_the_arguments_we_declare():
    assert declared_by_us("batch", {"x-dead-letter-exchange": "batch.quarantine", "x-queue-type": "classic"})
    assert declared_by_us("batch.shard-2", {"x-dead-letter-exchange": "batch.quarantine"})
    assert not declared_by_us("batch", {"x-dead-letter-exchange": "other.quarantine"})
    assert not declared_by_us("batch", {})
    tier = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "batch", "x-message-ttl": 5000}
    assert declared_by_us("batch.retry.5s", tier)
    assert not declared_by_us("batch.retry.5s", {**tier, "x-dead-letter-routing-key": "elsewhere"})
    assert not declared_by_us("batch.quarantine", {})  # counted by its job queue, never on its own


def test_the_work_queue_left_by_raising_shards_from_one_is_an_orphan_when_ours(tmp_path):
    live = live_arguments(tmp_path, "batch")
    path = tmp_path / "sharded.toml"
    path.write_text(TOPOLOGY.replace("NAME", "batch").replace('["5s"]', '["5s"]\nshards = 2'))
    layouts = load_topology(path).topology.layouts()
    assert orphan_queues(layouts, live, live) == ["batch", "batch.retry.5s"]
    assert orphan_queues(layouts, ["batch"], {"batch": {}}) == []  # a queue of that name we did not declare
    assert "or raise shards back to 1 so workers read it again" in orphan_fixes(layouts, [("batch", 3)])[0]


def _write(tmp_path, name: str):
    path = tmp_path / f"only-{name}.toml"
    path.write_text(TOPOLOGY.replace("NAME", name))
    return path
