"""App(tracing=...) takes a bool only: a str from the environment never turns tracing on by its truth (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpjobs import App, ConfigurationError

pytestmark = pytest.mark.version_independent

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology"


@pytest.mark.parametrize("value", ["false", "0", "no", "", "true", 1, 0, None])
def test_tracing_that_is_not_a_bool_is_refused_naming_the_fix(value: object) -> None:
    # Before: App(tracing=os.environ.get("TRACING", "false")) turned tracing ON ("false" is truthy),
    # App(tracing=0) and tracing=None were taken as off: all accepted without a word.
    with pytest.raises(ConfigurationError) as caught:
        App("tracearg", topology=TOPOLOGY, tracing=value)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"App(tracing=...) must be True or False (got {type(value).__name__} {value!r})")
    assert "os.environ.get('AMQPJOBS_TRACING') == '1'" in message


def test_false_is_still_off() -> None:
    assert App("tracearg", topology=TOPOLOGY, tracing=False).tracing is None
