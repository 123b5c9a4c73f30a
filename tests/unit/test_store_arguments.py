"""App(results=..., ledger=...) given something that is no store: a ConfigurationError at once (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpjobs import App, ConfigurationError, SqliteLedger, SqliteResults

pytestmark = pytest.mark.version_independent

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology"


@pytest.mark.parametrize(
    ("argument", "value", "got"),
    [
        ("results", "/var/lib/shop/results.db", "a str"),
        ("results", 123, "an int"),  # before: "a int"
        ("ledger", object(), "an object"),
        ("results", SqliteResults, "the class SqliteResults itself: create one, SqliteResults(...)"),
        ("ledger", "/var/lib/shop/ledger.db", "a str"),
        ("ledger", SqliteLedger, "the class SqliteLedger itself: create one, SqliteLedger(...)"),
    ],
)
def test_a_path_or_a_class_where_a_store_goes_is_refused_naming_what_to_give(
    argument: str, value: object, got: str
) -> None:
    # Before: App(results="/var/lib/shop/results.db") was accepted; app.job_status(...) then raised
    # AttributeError: 'str' object has no attribute 'history', `amqpjobs job show` ended in a traceback
    # ('str' object has no attribute 'close') and workers dropped every record; ledger= the same.
    with pytest.raises(ConfigurationError) as caught:
        App("storeargs", topology=TOPOLOGY, **{argument: value})  # type: ignore[arg-type]
    message = str(caught.value)
    kind = "a results store" if argument == "results" else "an idempotency ledger"  # before: "a idempotency ledger"
    assert message.startswith(f"App({argument}=...) must be {kind} (")
    assert f"(got {got})" in message
    example = "SqliteResults('/var/lib/shop/results.db')" if argument == "results" else "SqliteLedger("
    assert example in message


def test_real_stores_are_still_taken(tmp_path: Path) -> None:
    app = App("storeargs", topology=TOPOLOGY, results=SqliteResults(tmp_path / "r.db"),
              ledger=SqliteLedger(tmp_path / "l.db"))  # fmt: skip
    assert isinstance(app.results, SqliteResults)
    assert isinstance(app.ledger, SqliteLedger)
