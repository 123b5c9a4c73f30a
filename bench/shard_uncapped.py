"""Diagnostic: bench/shard_throughput.py with the N+1 cap of the shard dispatcher lifted.

Usage: python bench/shard_uncapped.py [shard_throughput.py options]

Every busy shard gets a lease with prefetch = slots, as the design before issue 30
prefetched up to N deliveries of every shard (quorum shards are leased as well), on this
checkout's worker otherwise unchanged. Run beside shard_throughput.py on the same build,
it tells what the cap itself costs from what the rest of the per-job path costs; it is
not a mode the worker has.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Collection
from typing import Any

import shard_throughput

from amqpjobs.runtime import dispatch

_init = dispatch.ShardDispatcher.__init__


def _uncapped_init(self: dispatch.ShardDispatcher, *args: Any, **kwargs: Any) -> None:
    kwargs["lease"] = True
    _init(self, *args, **kwargs)
    self._free = self.slots * (len(self._lanes) + 1)  # a full lease for every shard, and turns


def _every_busy_shard_gets_all(slots: int, shards: int, busy: Collection[int]) -> dict[int, int]:
    return dict.fromkeys(sorted(busy), slots)


dispatch.LOOKAHEAD_WAIT = 3600.0  # what waits for a running slot waits (the old worker's slot gate), never handed back
dispatch.ShardDispatcher.__init__ = _uncapped_init  # type: ignore[method-assign]
dispatch.lease_sizes = _every_busy_shard_gets_all  # type: ignore[attr-defined]  # the name _plan looks up

if __name__ == "__main__":
    sys.exit(asyncio.run(shard_throughput.main()))
