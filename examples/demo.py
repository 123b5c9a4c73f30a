"""The demo: apply the example topology to a fresh vhost of the project's broker, then plan it.

Run with ``make demo`` (which starts the broker first). The full job demo arrives with the
worker; until then this shows the deploy step users run first.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from amqpjobs.runtime.deploy import apply_topology, plan_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    urls = subprocess.run(
        ["bash", str(ROOT / "scripts" / "broker.sh"), "url"], capture_output=True, text=True, check=True
    ).stdout.split()
    settings = broker_settings(urls[0], urls[1]).with_vhost("amqpjobs-demo")
    with ManagementClient(settings) as mgmt:
        mgmt.delete_vhost(settings.vhost)
        mgmt.create_vhost(settings.vhost)
    first = asyncio.run(apply_topology(ROOT / "topology", settings))
    print(f"applied topology/ to vhost {settings.vhost}: {len(first.plan.creates)} objects created")
    second = asyncio.run(plan_topology(ROOT / "topology", settings))
    print(second.plan.report())
    return 0 if not second.plan.creates and not second.plan.conflicts else 1


if __name__ == "__main__":
    sys.exit(main())
