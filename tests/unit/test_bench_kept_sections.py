"""bench/report.py keeps the hand-written sections of RESULTS.md (after the marker) when bench/run.py rewrites it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_modules import BENCH, load_bench_module

pytestmark = pytest.mark.version_independent


def load_run() -> ModuleType:
    return load_bench_module("report.py", "bench_report_under_test")


def test_the_part_from_the_marker_on_is_kept(tmp_path: Path) -> None:
    run = load_run()
    out = tmp_path / "RESULTS.md"
    out.write_text(f"# old figures\n\n| a | 1 |\n\n{run.KEPT_MARKER}\n\n## by hand\n\nx = 2\n")
    assert run.kept_sections(out) == f"\n{run.KEPT_MARKER}\n\n## by hand\n\nx = 2\n"


def test_nothing_kept_without_the_marker_or_the_file(tmp_path: Path) -> None:
    run = load_run()
    out = tmp_path / "RESULTS.md"
    assert run.kept_sections(out) == ""
    out.write_text("# old figures\n\n## by hand, but no marker\n")
    assert run.kept_sections(out) == ""


def test_the_committed_results_keep_the_rabbitmq_4_3_section() -> None:
    run = load_run()
    kept = run.kept_sections(BENCH / "RESULTS.md")
    assert "## RabbitMQ 4.3: broker-side delayed retry and `x-modulus-hash` shards (issue 19)" in kept
