"""bench/report.py's goals: issue 22's targets have one home, and the closing table judges each figure."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_modules import load_bench_module

pytestmark = pytest.mark.version_independent


def load_report() -> ModuleType:
    return load_bench_module("report.py", "bench_report_goals_under_test")


def test_issue_22_goals_and_their_targets() -> None:
    report = load_report()
    goals = {key: goal.target_text() for key, goal in report.GOALS.items() if goal.issue == 22}
    assert goals == {
        "aj16/dramatiq": "≥ 2.2×",
        "aj16/raw16": "≥ 1.3×",
        "p2/p1": "≥ 1.35×",
        "p2/p1.cpu": "≥ 0.9×",
        "sync/dramatiq": "≥ 1.2×",
        "enqueue1/raw1": "≥ 1.0×",
        "enqueueb/rawb": "≥ 0.9×",
        "p99/raw": "≤ 1.0×",
        "rss": "≤ 60 MB",
        "rss.growth": "≤ 2 MB",
    }


def test_the_closing_table_judges_each_figure_and_names_what_was_not_measured() -> None:
    report = load_report()
    rows = report.goals_table(
        {
            "aj16/dramatiq": (1.5, "3,636 vs 2,423 jobs/s"),
            "p2/p1": (1.35, ""),
            "p99/raw": (1.01, "3.51 vs 3.48 ms"),
            "rss": (48.0, "48.0 MB after 10,000 jobs, 48.0 MB after 200,000"),
        }
    )
    by_goal = {row[0]: row[1:] for row in rows}
    assert len(rows) == 10
    goals = report.GOALS
    assert by_goal[goals["aj16/dramatiq"].text] == ["1.50× (3,636 vs 2,423 jobs/s)", "≥ 2.2×", "**missed**"]
    assert by_goal[goals["p2/p1"].text] == ["1.35×", "≥ 1.35×", "met"]
    assert by_goal[goals["p99/raw"].text] == ["1.01× (3.51 vs 3.48 ms)", "≤ 1.0×", "**missed**"]
    assert by_goal[goals["rss"].text] == [
        "48.0 MB (48.0 MB after 10,000 jobs, 48.0 MB after 200,000)",
        "≤ 60 MB",
        "met",
    ]
    assert by_goal[goals["sync/dramatiq"].text] == ["not measured in this run", "≥ 1.2×", "–"]
    assert [row[0] for row in rows][:2] == [goals["aj16/dramatiq"].text, goals["aj16/raw16"].text]


def test_a_smoke_run_judges_no_goal() -> None:
    report = load_report()
    rows = report.goals_table({"rss": (48.0, ""), "p2/p1": (2.0, "")}, judged=False)
    by_goal = {row[0]: row[1:] for row in rows}
    assert by_goal[report.GOALS["rss"].text] == ["48.0 MB", "≤ 60 MB", "not judged (--quick)"]
    assert by_goal[report.GOALS["p2/p1"].text] == ["2.00×", "≥ 1.35×", "not judged (--quick)"]
    assert by_goal[report.GOALS["sync/dramatiq"].text] == ["not measured in this run", "≥ 1.2×", "–"]
