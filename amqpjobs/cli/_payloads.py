"""``--app`` for the quarantine commands that read or delete stored payloads (``show``, ``purge``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from typing import Any, TypeVar

import click

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.runtime.loading import absent_results_file, load_app
from amqpjobs.runtime.payloads import PayloadStore, peek
from amqpjobs.runtime.quarantine import QuarantinedMessage, browsing
from amqpjobs.runtime.results import ResultsStore
from amqpjobs.runtime.sqlite_errors import unused_missing_file
from amqpjobs.wire.settings import BrokerSettings

F = TypeVar("F", bound=Callable[..., Any])
#: ``stored_payload_problem`` of ``quarantine show --json`` for a message naming a stored payload, without ``--app``.
NOT_READ = "not read: give --app MODULE:APP to read it from the app's payload store"


def payload_store_option(func: F) -> F:
    """``--app MODULE:APP``: the app whose payload store holds the large payloads (README "Large payloads")."""
    return click.option(
        "--app", "app_ref", metavar="MODULE:APP", default=None,
        help="The app whose payload store (App(payload_store=...)) holds large payloads: show reads them, "
        "purge marks those of the deleted messages for deletion (after the store's grace) and records each "
        "deleted job 'purged' in the app's results store (App(results=...)).",
    )(func)  # fmt: skip


def app_payload_store(app_ref: str | None) -> PayloadStore | None:
    """The payload store of the app ``app_ref`` names (None without ``--app``).

    Raises:
        ConfigurationError: the app can't be loaded, or it has no payload store.
    """
    if app_ref is None:
        return None
    app = load_app(app_ref, reading=True)  # its stores read-only: this command creates and changes none of them
    if (path := absent_results_file(app)) is not None:  # a typo'd path: said, never made an empty store
        click.echo(f"warning: {unused_missing_file('results store', path)}", err=True)
    if app.payload_store is None:
        raise ConfigurationError(f"app {app_ref!r} has no payload store (App(..., payload_store=...)); leave --app out")
    return app.payload_store


def app_purge_stores(app_ref: str | None) -> tuple[PayloadStore | None, ResultsStore | None]:
    """The payload store and results store of the app ``app_ref`` names, for ``purge --app`` ((None, None) without).

    A purge marks the deleted messages' stored payloads for deletion in the first and records each
    deleted job ``purged`` in the second; an app may have either.

    Raises:
        ConfigurationError: the app can't be loaded (a SQLite results file that is not there included),
            or it has neither store.
    """
    if app_ref is None:
        return None, None
    app = load_app(app_ref, existing=True)  # a results file that is not there is a wrong path, not a new store
    if app.payload_store is None and app.results is None:
        raise ConfigurationError(f"app {app_ref!r} has neither a payload store nor a results store "
                                 "(App(..., payload_store=..., results=...)); leave --app out")  # fmt: skip
    return app.payload_store, app.results


async def each_with_payload(
    settings: BrokerSettings,
    name: str,
    limit: int,
    selection: Selection,
    census: Census,
    store: PayloadStore | None,
    each: Callable[[QuarantinedMessage, dict[str, Any] | None, str], None],
) -> int:
    """``each(message, stored payload, problem)`` for each matching message as it is read; how many there were.

    :func:`~amqpjobs.runtime.quarantine.browsing`: each message's body is let go once ``each``
    returned, so ``quarantine show --limit N`` holds about one body at a time, not N. Without
    ``store`` every message gets ``(None, "")``; see :func:`~amqpjobs.runtime.payloads.peek`.
    """
    count = 0
    try:
        async with aclosing(browsing(settings, name, limit, selection, census)) as messages:
            async for m in messages:
                d = m.delivery
                data, problem = (None, "") if store is None else await peek(store, d.headers, d.content_type,
                                                                            d.content_encoding)  # fmt: skip
                each(m, data, problem)
                d.body = b""  # shown: not held until the browser closes
                count += 1
        return count
    finally:
        if store is not None:
            await store.close()
