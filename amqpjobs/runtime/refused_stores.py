"""A store built with an invalid argument in ``--app``'s import: refused when used, not at the import.

A module may build several Apps, and the CLI's ``--app m:app`` names one of them
(:func:`~amqpjobs.runtime.loading.load_app`). A sibling App's store given an argument that
can't work (``SqliteResults(':memory:')``, ``PostgresLedger('nonsense')``, ``FilePayloadStore('')``,
a retention that is no duration) must not refuse the named app: inside
:func:`~amqpjobs.runtime.sqlite_open.judged_later` the store classes below keep the
:class:`~amqpjobs.errors.ConfigurationError` of their constructor instead of raising it, and are
built empty. Any later use of such a store (an attribute it would have set: every method reads one)
raises that error, in the constructor's words (the argument and the fix); :func:`refusal` gives it to
``load_app``, which raises the named app's own at once. Outside that block (your program's import)
the constructor raises, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.sqlite_open import judging_later

T = TypeVar("T", bound=type)

#: The attribute a refused store keeps its error in (set on the instance only, so ``__getattr__`` finds the others).
_KEPT = "_amqpjobs_refused"


def refused_when_used(cls: T) -> T:
    """Make ``cls``'s constructor keep its ConfigurationError in ``--app``'s import (see the module's docstring)."""
    init: Callable[..., None] = cls.__dict__["__init__"]  # each store class defines its own

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ConfigurationError as exc:
            if not judging_later():
                raise
            self.__dict__.clear()  # nothing half-built: every use meets the error
            self.__dict__[_KEPT] = exc

    def __getattr__(self: Any, name: str) -> NoReturn:  # only for what the instance does not have
        kept = self.__dict__.get(_KEPT)
        if kept is not None and not name.startswith("__"):
            raise ConfigurationError(str(kept)) from kept  # a new one each use: no traceback kept growing
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    cls.__init__ = __init__  # type: ignore[misc]
    setattr(cls, "__getattr__", __getattr__)  # noqa: B010 -- set at run time: mypy still checks every attribute
    return cls


def refusal(store: object) -> ConfigurationError | None:
    """The error a store's constructor kept (:func:`refused_when_used`), or None (a store built well, or None)."""
    kept = getattr(store, "__dict__", {}).get(_KEPT)
    return kept if isinstance(kept, ConfigurationError) else None
