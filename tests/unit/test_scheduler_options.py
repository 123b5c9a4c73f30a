"""SchedulerOptions' seconds are checked when made, and the clock rule never moves a cursor forward.

Before: ``SchedulerOptions(clock_tolerance=float("nan"))`` (or ``-5``) was taken, and
:func:`~amqpjobs.jobs.cron.rewound_cursor` then "rewound" a cursor that was *behind* the
clock to the second before it: every tick between them (a catch-up after an outage, a
tick due a moment ago) was skipped, with a warning saying the clock ran ahead.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.cron import rewound_cursor
from amqpjobs.runtime.scheduler import SchedulerOptions

NOW = datetime(2026, 3, 29, 1, 59, 59, 500000, tzinfo=UTC)


@pytest.mark.parametrize("tolerance", [math.nan, -5.0, -0.5, 0.0, 60.0, math.inf])
@pytest.mark.parametrize("behind", [0.0, 0.4, 3.0, 3600.0])
def test_a_cursor_not_ahead_of_the_clock_is_never_moved(tolerance: float, behind: float) -> None:
    assert rewound_cursor(NOW - timedelta(seconds=behind), NOW, tolerance) is None


@pytest.mark.parametrize(("ahead", "rewound"), [(59.9, False), (60.0, False), (60.1, True), (3600.0, True)])
def test_just_under_and_over_the_tolerance(ahead: float, rewound: bool) -> None:
    found = rewound_cursor(NOW + timedelta(seconds=ahead), NOW, 60.0)
    assert (found is not None) is rewound
    if found is not None:
        assert found == datetime(2026, 3, 29, 1, 59, 58, tzinfo=UTC)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clock_tolerance", math.nan),
        ("clock_tolerance", -1.0),
        ("clock_tolerance", math.inf),
        ("reoffer", 0.0),
        ("reoffer", math.nan),
        ("max_sleep", -1.0),
        ("max_sleep", math.inf),
        ("warn_every", 0.0),
        ("warn_every", True),
    ],
)
def test_scheduler_options_refuse_seconds_that_are_no_duration(field: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=f"SchedulerOptions.{field}="):
        SchedulerOptions(**cast(dict[str, Any], {field: value}))


def test_scheduler_options_take_zero_tolerance_and_whole_numbers() -> None:
    options = SchedulerOptions(clock_tolerance=0, reoffer=1, max_sleep=0.25, warn_every=30)
    assert (options.clock_tolerance, options.reoffer, options.max_sleep) == (0, 1, 0.25)
