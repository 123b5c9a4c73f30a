"""Celery contestant: ``celery -A peer_celery worker -c 2 -P prefork`` (cwd bench/).

``task_acks_late`` (ack after the task returned), prefetch multiplier 1, publisher
confirms (``confirm_publish``), durable queue, persistent messages (Celery's defaults), no
result backend. The task writes one record (bench/common.py), like every other
contestant's handler.
"""

from __future__ import annotations

import os

from celery import Celery
from common import QUEUE, Recorder

app = Celery("peer_celery", broker=os.environ.get("BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/"))
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_default_delivery_mode="persistent",
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
_recorder: Recorder | None = None


@app.task(name="noop")
def noop(t: float) -> None:
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
    _recorder(t)
