"""Dramatiq contestant: ``dramatiq peer_dramatiq --processes 1 --threads 8`` (cwd bench/).

RabbitMQ broker with publisher confirms (``confirm_delivery=True``); Dramatiq declares its
queue durable and publishes persistent messages, and acks after the actor returned. The
actor writes one record (bench/common.py), like every other contestant's handler.
"""

from __future__ import annotations

import os

import dramatiq
from common import QUEUE, Recorder
from dramatiq.brokers.rabbitmq import RabbitmqBroker

broker = RabbitmqBroker(url=os.environ.get("BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/"), confirm_delivery=True)
dramatiq.set_broker(broker)
_recorder: Recorder | None = None


@dramatiq.actor(actor_name="noop", queue_name=QUEUE, max_retries=0)
def noop(t: float) -> None:
    global _recorder
    if _recorder is None:
        _recorder = Recorder()
    _recorder(t)
