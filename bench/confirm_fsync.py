"""What a publisher confirm means on a node: its fsync/fdatasync calls while confirmed messages go in.

Usage (cwd bench/, root for strace, the node's beam process given by pid):
    python confirm_fsync.py --port 5692 --mgmt-port 15692 --pid BEAM_PID --queue-type classic \\
        [--n 1000] [--size 100] [--after 0]

Declares a durable queue of ``--queue-type`` (``classic``, ``classic-v1``, ``classic-v2`` or
``quorum``) in a throwaway vhost, publishes 20 messages to warm up, then attaches
``strace -f -c`` to the beam process ``--pid`` (every thread of that node only) and publishes
``--n`` persistent messages of ``--size`` bytes one at a time with pika's
``confirm_delivery()`` (each ``basic_publish`` returns after its confirm). ``--after`` keeps
strace attached that many seconds longer (fsyncs on a timer). Prints the sync calls counted
and the confirm rate. README "Durability: what a confirmed job survives" has the figures.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pika

SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs", "msync")
ARGUMENTS: dict[str, dict[str, Any]] = {
    "classic": {"x-queue-type": "classic"},
    "classic-v1": {"x-queue-type": "classic", "x-queue-version": 1},
    "classic-v2": {"x-queue-type": "classic", "x-queue-version": 2},
    "quorum": {"x-queue-type": "quorum"},
}


def management(mgmt_port: int, method: str, path: str, body: object = None) -> None:
    """One management API call as guest (loopback only)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}/api{path}", method=method, data=data)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=30):
        pass


def counted(summary: Path) -> dict[str, int]:
    """The sync calls of an ``strace -c`` summary: name -> calls."""
    calls: dict[str, int] = {}
    for line in summary.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit() and parts[-1] in SYNC_CALLS:
            calls[parts[-1]] = int(parts[3])
    return calls


def measure(port: int, mgmt_port: int, pid: int, queue_type: str, n: int, size: int, after: float) -> str:
    """Publish ``n`` confirmed messages under strace of ``pid``; one line of what was counted."""
    vhost = "confirm-fsync-" + uuid.uuid4().hex[:8]
    management(mgmt_port, "PUT", f"/vhosts/{vhost}")
    management(mgmt_port, "PUT", f"/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    summary = Path(tempfile.mkdtemp()) / "strace.txt"
    body, persistent = b"x" * size, pika.BasicProperties(delivery_mode=2)
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost))
        channel = connection.channel()
        channel.queue_declare("q", durable=True, arguments=ARGUMENTS[queue_type])
        channel.confirm_delivery()
        for _ in range(20):
            channel.basic_publish("", "q", body, persistent)
        time.sleep(1)
        trace = ",".join(SYNC_CALLS)
        strace = subprocess.Popen(
            ["strace", "-f", "-c", "-e", f"trace={trace}", "-o", str(summary), "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(2)  # attached to every thread
        started = time.monotonic()
        for _ in range(n):
            channel.basic_publish("", "q", body, persistent)  # returns after the broker's confirm
        elapsed = time.monotonic() - started
        time.sleep(after)
        strace.send_signal(signal.SIGINT)
        strace.wait(timeout=30)
        connection.close()
    finally:
        management(mgmt_port, "DELETE", f"/vhosts/{vhost}")
    calls = counted(summary) or "no sync calls"
    return f"{queue_type}: {n} confirmed in {elapsed:.2f} s ({n / elapsed:.0f}/s), {size} B each; {calls}"


def main() -> None:
    """Parse the arguments, measure once, print the line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True, help="AMQP port of the node")
    parser.add_argument("--mgmt-port", type=int, required=True, help="management port of the node")
    parser.add_argument("--pid", type=int, required=True, help="the node's beam.smp process id")
    parser.add_argument("--queue-type", choices=sorted(ARGUMENTS), required=True)
    parser.add_argument("--n", type=int, default=1000, help="confirmed messages counted (default 1000)")
    parser.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--after", type=float, default=0.0, help="seconds strace stays attached after the last confirm")
    args = parser.parse_args()
    print(measure(args.port, args.mgmt_port, args.pid, args.queue_type, args.n, args.size, args.after))


if __name__ == "__main__":
    main()
