"""One job at a time from synchronous code: ``sync_publisher().enqueue`` vs Dramatiq's ``send``, and the hand-off.

Usage (cwd bench/, the bench extra installed):
    python sync_publish.py --url amqp://guest:guest@127.0.0.1:5672/ [--n 1000] [--reps 3]

``bench/run.py`` runs the same measurement (:func:`measure`) as its section 4; this script
runs it alone. Each contestant publishes ``--n`` jobs one after the other, each confirmed
by the broker before the next (Dramatiq with ``confirm_delivery=True``), into a throwaway
vhost of its own, its queue purged first; the contestants take turns within each
repetition. Also timed: the sync publisher's thread hand-off alone (``SyncPublisher._run``
of a coroutine that returns at once), i.e. what calling into its private event loop thread
costs per call without any publish. Prints medians (min–max) of msg/s and client CPU µs per
message (this process).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from common import JOB, QUEUE, TOPOLOGY, own_cpu
from harness import _noop

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings

#: The contestants of :func:`measure`, in the order they take turns.
KEYS = ("amqpjobs", "dramatiq", "hand-off")


def timed(n: int, one: Callable[[int], object]) -> tuple[float, float]:
    """(msg/s, CPU µs per call) of ``n`` calls of ``one``."""
    t0, c0 = time.perf_counter(), own_cpu()
    for i in range(n):
        one(i)
    wall, used = time.perf_counter() - t0, own_cpu() - c0
    return n / wall, used / n * 1e6


def vhost(root: BrokerSettings, key: str) -> BrokerSettings:
    settings = root.with_vhost(f"bench-{key}-{uuid.uuid4().hex[:6]}")
    with ManagementClient(settings) as mgmt:
        mgmt.create_vhost(settings.vhost)
    return settings


def purge(settings: BrokerSettings) -> None:
    """Empty the bench queue of ``settings``' vhost (management API; no error when it does not exist yet)."""
    with ManagementClient(settings) as mgmt:
        mgmt.request("DELETE", f"/queues/{quote(settings.vhost, safe='')}/{QUEUE}/contents", allow_404=True)


def measure(
    aj: BrokerSettings, dq: BrokerSettings, topology: Path, n: int, reps: int
) -> dict[str, list[tuple[float, float]]]:
    """Time ``n`` confirmed one-at-a-time publishes per contestant, ``reps`` times, the contestants in turns.

    Blocking; everything runs in the calling thread (Dramatiq keeps a connection per thread,
    so the warm-up and the timed calls must share one). Each contestant is connected and
    has published once before any timing.

    Args:
        aj: A vhost with ``topology`` applied (amqpjobs' ``sync_publisher().enqueue`` and the hand-off).
        dq: A vhost for Dramatiq (its ``send`` declares its queue).
        topology: The bench topology file (bench/common.py's ``TOPOLOGY``).
        n: Publishes per contestant and repetition.
        reps: Repetitions.

    Returns:
        For each of :data:`KEYS`, one (msg/s, client CPU µs per call of this process) per repetition.
    """
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    app = App("bench", topology=load_topology(topology).topology, url=aj.url)
    app.job(JOB, queue=QUEUE)(_noop)
    broker = RabbitmqBroker(url=dq.url, confirm_delivery=True)
    actor = dramatiq.actor(actor_name="noop", queue_name=QUEUE, max_retries=0, broker=broker)(lambda t: None)
    results: dict[str, list[tuple[float, float]]] = {key: [] for key in KEYS}
    try:
        with app.sync_publisher() as pub:
            pub.enqueue(JOB, {"t": time.time()})  # connect before timing
            actor.send(time.time())

            async def nothing() -> None:
                return None

            calls: dict[str, Callable[[int], object]] = {
                "amqpjobs": lambda i: pub.enqueue(JOB, {"t": time.time()}),
                "dramatiq": lambda i: actor.send(time.time()),
                "hand-off": lambda i: pub._run(nothing()),
            }
            for _ in range(reps):
                purge(aj)
                purge(dq)
                for key in KEYS:
                    results[key].append(timed(n, calls[key]))
            purge(aj)
            purge(dq)
    finally:
        broker.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--management-url")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    root = broker_settings(args.url, args.management_url)
    topo = Path(f"/tmp/bench-sync-{uuid.uuid4().hex[:6]}.toml")
    topo.write_text(TOPOLOGY)
    aj = vhost(root, "sync-aj")
    dq = vhost(root, "sync-dramatiq")
    try:
        asyncio.run(apply_topology(topo, aj))
        results = measure(aj, dq, topo, args.n, args.reps)
    finally:
        for settings in (aj, dq):
            with ManagementClient(settings) as mgmt:
                mgmt.delete_vhost(settings.vhost)
        topo.unlink()
    med = {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    for key, values in results.items():
        rates = [r for r, _ in values]
        print(f"{key:9s} {med[key][0]:8.0f} msg/s ({min(rates):.0f}–{max(rates):.0f})  {med[key][1]:6.0f} µs CPU/call")
    print(f"sync_publisher().enqueue / Dramatiq send: {med['amqpjobs'][0] / med['dramatiq'][0]:.2f}×")


if __name__ == "__main__":
    main()
