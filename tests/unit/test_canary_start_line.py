"""The canary's start line names the number that can move: the queue's depth and ``--limit`` bound it."""

from __future__ import annotations

import pytest

from amqpjobs.cli.canary import phase_reporter
from amqpjobs.jobs.replay_plan import ReplayReport


@pytest.mark.parametrize(
    ("canary", "limit", "queued", "said"),
    [
        (2, None, 6, "canary: moving 2 job(s) first"),
        (2, 1, 6, "canary: moving 1 job(s) first"),  # helper-226: said 2, moved 1
        (50, None, 3, "canary: moving up to 3 job(s) first"),
        (50, 10, 3, "canary: moving up to 3 job(s) first"),
    ],
)
def test_the_start_line_says_how_many_can_move(
    capsys: pytest.CaptureFixture[str], canary: int, limit: int | None, queued: int, said: str
) -> None:
    report = ReplayReport(queue="work.quarantine", left=queued, phase="canary")
    phase_reporter(canary, 30.0, limit)(report)
    assert capsys.readouterr().out == f"{said}, then waiting up to 30s for their outcomes\n"
