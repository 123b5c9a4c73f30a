"""``App(results=...)`` / ``App(ledger=...)`` given no store: the error's words (README "Job status and results")."""

from __future__ import annotations

import pytest

from amqpjobs import App, ConfigurationError


@pytest.mark.parametrize(
    ("argument", "value", "words"),
    [
        ("ledger", 5, "App(ledger=...) must be an idempotency ledger (got an int)"),
        ("ledger", object(), "App(ledger=...) must be an idempotency ledger (got an object)"),
        ("results", "results.db", "App(results=...) must be a results store (got a str)"),
        ("results", 1.5, "App(results=...) must be a results store (got a float)"),
    ],
)
def test_a_value_that_is_no_store_is_named_with_its_article(argument: str, value: object, words: str) -> None:
    # before: "must be a idempotency ledger (got a int)"
    with pytest.raises(ConfigurationError) as caught:
        App("x", **{argument: value})  # type: ignore[arg-type]
    assert str(caught.value).startswith(words), str(caught.value)
