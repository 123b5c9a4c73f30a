"""Two builds of amqpjobs on bench/shard_throughput.py, interleaved in pairs: the ratio new/old per pair.

Usage: python bench/shard_pairs.py --old /path/to/old/checkout [--pairs 5] -- [shard_throughput.py options]
       (e.g. ``-- --queue-type quorum --handler-ms 5 --n 8000``; the broker of $AMQPJOBS_URL)

On a busy machine absolute rates drift by tens of percent from minute to minute; runs of the
two builds taken one after the other (the first of each pair alternating) see the same
load, so the ratio of a pair is steadier than either rate. Each run is a process of its own
(``--reps 1``): the old build runs with ``PYTHONPATH=<old checkout>`` and the new one with
this checkout's, each with its checkout's ``.venv/bin/python`` (else this interpreter). Prints each pair, then the
median and range of the rates and of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATE = re.compile(r"rep 1: (\d+) jobs/s, (\d+) µs CPU per job")


def one(checkout: Path, extra: list[str]) -> tuple[float, float]:
    """jobs/s and client CPU µs per job of one run of the build at ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    python = checkout / ".venv" / "bin" / "python"
    out = subprocess.run(
        [str(python if python.exists() else sys.executable), str(HERE / "shard_throughput.py"), "--reps", "1", *extra],
        env=env, capture_output=True, text=True, check=True, timeout=900,
    ).stdout  # fmt: skip
    match = RATE.search(out)
    if match is None or f"amqpjobs from {checkout.resolve()}/" not in out:
        raise SystemExit(f"no rate in the output of {checkout}:\n{out}")
    return float(match.group(1)), float(match.group(2))


def spread(values: list[float], digits: int = 0) -> str:
    """``median (min–max)``."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="checkout of the build to compare against")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="checkout of the new build (default this one)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("rest", nargs="*", help="options for shard_throughput.py (after --)")
    args = parser.parse_args()
    old_rates: list[float] = []
    new_rates: list[float] = []
    ratios: list[float] = []
    new_cpu: list[float] = []
    old_cpu: list[float] = []
    for pair in range(args.pairs):
        order = [("new", args.new), ("old", args.old)] if pair % 2 else [("old", args.old), ("new", args.new)]
        got = {name: one(checkout, args.rest) for name, checkout in order}
        old_rates.append(got["old"][0])
        new_rates.append(got["new"][0])
        old_cpu.append(got["old"][1])
        new_cpu.append(got["new"][1])
        ratios.append(got["new"][0] / got["old"][0])
        old, new = got["old"][0], got["new"][0]
        print(f"pair {pair + 1}: old {old:.0f}, new {new:.0f} jobs/s: {ratios[-1]:.2f}x", flush=True)
    print(f"{' '.join(args.rest) or 'defaults'}: old {spread(old_rates)} jobs/s ({spread(old_cpu)} µs CPU/job), "
          f"new {spread(new_rates)} jobs/s ({spread(new_cpu)} µs CPU/job), new/old {spread(ratios, 2)}x "
          f"over {args.pairs} pairs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
