"""Find an :class:`~amqpjobs.runtime.app.App` from a ``module:attribute`` reference, and the event loop to run it on."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from amqpjobs.errors import (
    AmqpJobsError,
    BrokerError,
    ConfigurationError,
    LedgerUnavailableError,
    PayloadStoreError,
    ResultsUnavailableError,
)
from amqpjobs.runtime.app import App
from amqpjobs.runtime.refused_stores import refusal
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.runtime.sqlite_errors import missing_file
from amqpjobs.runtime.sqlite_open import existing_files_only, judged_later, reading_only

#: Our errors that say a service failed: raised by the module while imported, they may pass at the next try.
_SERVICES: Final = (BrokerError, LedgerUnavailableError, ResultsUnavailableError, PayloadStoreError)
#: How :func:`load_app` words the app module's own failure while imported (``.format(module_name)``).
_FAILED = "importing module {!r} failed: "


def load_app(reference: str, reading: bool = False, existing: bool = False) -> App:
    """Import ``module:attribute`` (the current directory is importable) and return the App.

    ``reading``: for a command that only reads (``job show``): the SQLite stores the module
    builds open their files read-only, never creating nor changing them
    (:func:`~amqpjobs.runtime.sqlite_open.reading_only`). ``existing``: for a command that
    records into them (``replay --app``): they open their files but never create one
    (:func:`~amqpjobs.runtime.sqlite_open.existing_files_only`).

    Raises:
        ConfigurationError: malformed reference, module not importable (or raising, or
            calling ``sys.exit()``, while imported), attribute missing or not an :class:`App`.
        AmqpJobsError: any of ours raised by the module while imported, unchanged, in its own
            words (an invalid topology file it loads, a DSN that is no URL, a store it opened
            unavailable now); a SQLite ledger or results store of the named app (only: a module
            may build several apps) that can't be opened, in its own words; a store of the named app
            given an argument that can't work (``SqliteResults(':memory:')``, a DSN that is no URL),
            in its constructor's words (a sibling App's is refused when used:
            :mod:`amqpjobs.runtime.refused_stores`).

    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{reference!r}: give the app as module:attribute, e.g. examples.shop:app")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        stem = module_name.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise ConfigurationError(
            f"cannot import module {module_name!r}: {module_name!r} is a file path, not a module name: give "
            f"{stem}:{attribute} (run from the directory that holds {stem}.py, or add that directory to PYTHONPATH)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with (
            judged_later(),
            reading_only() if reading else existing_files_only() if existing else contextlib.nullcontext(),
        ):
            module = importlib.import_module(module_name)  # each SQLite store's failure kept: judged for the named app
    except ImportError as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and not (module_name == missing or module_name.startswith(f"{missing}.")):
            raise ConfigurationError(  # the module is there; a package it imports is not
                f"importing module {module_name!r} failed: it imports {missing!r}, which is not installed ({exc}): "
                "install it in this environment, or fix the import"
            ) from exc
        raise ConfigurationError(f"cannot import module {module_name!r}: {exc}") from exc
    except AmqpJobsError:
        raise  # our own words (they name the file, the setting, the store), and exit code: a store down is 3
    except Exception as exc:  # the user's module raised while importing
        raise ConfigurationError(f"{_FAILED.format(module_name)}{type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:  # sys.exit() at import would end the CLI with the module's code and no word of ours
        code = "" if exc.code is None else repr(exc.code)
        raise ConfigurationError(
            f"{_FAILED.format(module_name)}it called sys.exit({code}) while imported "
            "(a module an app is loaded from must not end the program: raise an exception instead)"
        ) from exc
    if not hasattr(module, attribute):
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}")
    app = getattr(module, attribute)
    if not isinstance(app, App):
        kind = type(app).__name__
        raise ConfigurationError(
            f"{reference!r} is {'an' if kind[:1] in 'aeiouAEIOU' else 'a'} {kind}, not an amqpjobs App"
        )
    for store in (app.ledger, app.results, app.payload_store):  # a sibling App's bad store is none of this command's
        if (refused := refusal(store)) is not None:  # an argument that can't work: the constructor's words
            raise refused
        if (failure := getattr(store, "open_failure", None)) is not None:
            raise failure
    return app


def absent_results_file(app: App) -> Path | None:
    """The path of ``app``'s SQLite results file when a reading :func:`load_app` found none there, else None."""
    results = app.results
    return results.path if isinstance(results, SqliteResults) and results.absent else None


def load_app_reading_results(reference: str) -> App:
    """:func:`load_app` for a command that reads the app's results store (``job show``, a read-only console).

    Its stores open read-only and create nothing; a SQLite results file that is not there is
    refused at once, before anything else is done (a typo'd path is no empty store).

    Raises:
        ConfigurationError: as :func:`load_app`; the app's SQLite results file does not exist (naming it).
        AmqpJobsError: as :func:`load_app`.
    """
    app = load_app(reference, reading=True)
    if (path := absent_results_file(app)) is not None:
        raise missing_file("results store", path, "reads it")
    return app


def raised_by_module(exc: AmqpJobsError) -> bool:
    """Whether :func:`load_app`'s error ``exc`` is the app module's own code failing while imported.

    Such an error may pass (the module reads a file, an environment variable or a service at
    import), so ``consume --processes N`` leaves it to its children and their crash loop
    (:mod:`amqpjobs.runtime.preflight`). Every other error of :func:`load_app` is the same at
    every try: a reference that names no module (``ImportError``: a module or a package it
    imports is not there), a syntax error in it or in a module it imports (``SyntaxError``),
    no attribute or no App, or a configuration or topology error of amqpjobs raised by the
    module (a bad ``PostgresLedger`` DSN).

    Args:
        exc: What :func:`load_app` raised.

    Returns:
        True for a service failing (the broker, a ledger, results or payload store unavailable),
        and for any other exception of the module's (chained as the ``ConfigurationError``'s
        cause); False otherwise.
    """
    if isinstance(exc, _SERVICES):  # raised by the module, unchanged (load_app): a service may answer again
        return True
    cause = exc.__cause__  # load_app's own wording of the module's failure, not an error of ours the module raised
    wrapped = str(exc).startswith(_FAILED.partition("{")[0])
    return wrapped and cause is not None and not isinstance(cause, (ImportError, SyntaxError, AmqpJobsError))


#: Event loops ``consume --loop`` offers.
LOOPS = ("asyncio", "uvloop")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of event loop ``name`` for :class:`asyncio.Runner` (None: asyncio's default loop).

    ``uvloop`` (libuv-based, the ``amqpjobs[uvloop]`` extra) is imported only when asked for.

    Raises:
        ConfigurationError: an unknown name, or uvloop asked for but not installed.
    """
    if name == "asyncio":
        return None
    if name != "uvloop":
        raise ConfigurationError(f"--loop {name!r}: use one of {', '.join(LOOPS)}")
    try:
        import uvloop
    except ImportError:
        raise ConfigurationError("--loop uvloop: uvloop is not installed; pip install 'amqpjobs[uvloop]'") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
