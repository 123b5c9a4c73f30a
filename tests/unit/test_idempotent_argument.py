"""@app.job(idempotent=...) takes a bool only: "false" from a config file never makes a job idempotent (no broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError

pytestmark = pytest.mark.version_independent

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology"


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_idempotent_that_is_not_a_bool_is_refused(value: object) -> None:
    # Before: @app.job(..., idempotent="false") was taken and stored as "false", which is true: the job
    # ran through the ledger, and a second job with the same id was acked as a duplicate, never run.
    app = App("idemarg", topology=TOPOLOGY)
    with pytest.raises(ConfigurationError) as caught:

        @app.job("mail.send", queue="urgent", idempotent=value)  # type: ignore[arg-type]
        async def send(payload: dict[str, Any], ctx: object) -> None: ...

    assert str(caught.value) == (
        f"job 'mail.send': idempotent must be True or False (got {type(value).__name__} {value!r})"
    )
    assert app.get("mail.send") is None


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_taken(value: bool) -> None:
    app = App("idemarg", topology=TOPOLOGY)

    @app.job("mail.send", queue="urgent", idempotent=value)
    async def send(payload: dict[str, Any], ctx: object) -> None: ...

    assert app.resolve("mail.send").idempotent is value
