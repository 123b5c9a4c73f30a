"""The pytest plugin of :mod:`amqpjobs.testing` (entry point ``pytest11``: loaded by every pytest run).

Fixtures:

* ``amqpjobs_broker``: a :class:`~amqpjobs.testing.TestBroker` open around the test, for
  the app your ``amqpjobs_app`` fixture returns (define it in your ``conftest.py``), with
  ``amqpjobs_ledger`` as the app's ledger meanwhile; it is async, so it needs pytest-asyncio;
* ``amqpjobs_ledger``: a fresh :class:`~amqpjobs.runtime.ledger.SqliteLedger` in the test's
  temporary directory (the idempotency ledger ``amqpjobs_broker`` swaps in).

The entry point is :mod:`amqpjobs_pytest`, which registers this module once pytest is
configured (after coverage measurement began).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from amqpjobs.runtime.app import App
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.testing.broker import TestBroker

try:  # strict mode needs pytest-asyncio's decorator for an async fixture
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pragma: no cover - another async plugin may run it
    async_fixture = pytest.fixture  # type: ignore[assignment]


@async_fixture
async def amqpjobs_broker(amqpjobs_app: App, amqpjobs_ledger: SqliteLedger) -> AsyncIterator[TestBroker]:
    """A :class:`TestBroker` for ``amqpjobs_app`` with ledger ``amqpjobs_ledger``, open for the test."""
    async with TestBroker(amqpjobs_app, ledger=amqpjobs_ledger) as broker:
        yield broker
    await amqpjobs_ledger.close()


@pytest.fixture
def amqpjobs_ledger(tmp_path: Path) -> SqliteLedger:
    """A fresh SQLite idempotency ledger in the test's temporary directory."""
    return SqliteLedger(tmp_path / "amqpjobs-ledger.sqlite3")
