"""The monitoring examples refer only to metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from amqpjobs.runtime.metrics import WorkerMetrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
RABBITMQ_METRICS = {  # from the rabbitmq_prometheus plugin, /metrics/per-object
    "rabbitmq_detailed_queue_messages_ready",
    "rabbitmq_detailed_queue_messages_unacked",
    "rabbitmq_detailed_queue_consumers",
}


def known_names() -> set[str]:
    names = set()
    for family in WorkerMetrics().registry.collect():
        for sample in family.samples:
            names.add(sample.name)
        names.add(family.name)
        names.update({f"{family.name}_total", f"{family.name}_bucket", f"{family.name}_count"})
    return names | RABBITMQ_METRICS | {"up"}


def referenced(expr: str) -> set[str]:
    words = set(re.findall(r"\b(amqpjobs_[a-z_]+|rabbitmq_[a-z_]+|up)\b", expr))
    return words


def test_dashboard_and_alerts_use_existing_metrics() -> None:
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    alerts = re.findall(r"expr: (.+)", (EXAMPLES / "amqpjobs-alerts.yml").read_text())
    assert len(exprs) >= 10
    assert len(alerts) == 4
    known = known_names()
    for expr in exprs + alerts:
        unknown = referenced(expr) - known
        assert not unknown, (expr, unknown)
    scrape = (EXAMPLES / "prometheus.yml").read_text()
    assert "job_name: amqpjobs-workers" in scrape
    assert "/metrics/per-object" in scrape
