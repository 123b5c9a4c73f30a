"""``App(results=..., ledger=...)``: the object given must be a store, not a path or a class (no I/O).

Both are protocols a user may implement (:class:`~amqpjobs.runtime.results.ResultsStore`,
:class:`~amqpjobs.runtime.ledger.Ledger`), so an object is judged by the methods the worker calls.
"""

from __future__ import annotations

from typing import Final, TypeVar

from amqpjobs.errors import ConfigurationError

T = TypeVar("T")

#: Per argument: the methods a store of it has, and what to give instead.
_NEEDS: Final = {
    "results": (
        ("write", "history", "prune", "close", "copy"),
        "SqliteResults('/var/lib/shop/results.db') (one host) or PostgresResults('postgresql://...') (many hosts)",
    ),
    "ledger": (
        ("claim", "done", "release", "prune", "transaction", "close"),
        "SqliteLedger('/var/lib/shop/ledger.db') (one host) or PostgresLedger('postgresql://...') (many hosts)",
    ),
}


def store_argument(argument: str, value: T, owner: str = "App") -> T:
    """``value`` when it is None or has the methods of a ``argument`` store (``"results"`` or ``"ledger"``).

    ``owner``: whose argument it is, for the message (``App``, ``TestBroker``).

    Raises:
        ConfigurationError: anything else (a path, a number, the class itself), naming what to give.

    """
    methods, give = _NEEDS[argument]
    if value is None or (not isinstance(value, type) and all(callable(getattr(value, m, None)) for m in methods)):
        return value
    got = (
        f"the class {value.__name__} itself: create one, {value.__name__}(...)"
        if isinstance(value, type)
        else _a(type(value).__name__)
    )
    kind = "a results store" if argument == "results" else "an idempotency ledger"
    raise ConfigurationError(f"{owner}({argument}=...) must be {kind} (got {got}): give {give}, from amqpjobs")


def _a(word: str) -> str:
    """``word`` after its article: ``an int``, ``a str``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
