"""``--app`` for the quarantine commands that read or delete stored payloads (``show``, ``purge``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.payloads import PayloadStore, peek
from amqpjobs.runtime.quarantine import QuarantinedMessage, browse
from amqpjobs.wire.settings import BrokerSettings

F = TypeVar("F", bound=Callable[..., Any])
#: ``stored_payload_problem`` of ``quarantine show --json`` for a message naming a stored payload, without ``--app``.
NOT_READ = "not read: give --app MODULE:APP to read it from the app's payload store"


def payload_store_option(func: F) -> F:
    """``--app MODULE:APP``: the app whose payload store holds the large payloads (README "Large payloads")."""
    return click.option(
        "--app", "app_ref", metavar="MODULE:APP", default=None,
        help="The app whose payload store (App(payload_store=...)) holds large payloads: show reads them, "
        "purge marks those of the deleted messages for deletion (after the store's grace).",
    )(func)  # fmt: skip


def app_payload_store(app_ref: str | None) -> PayloadStore | None:
    """The payload store of the app ``app_ref`` names (None without ``--app``).

    Raises:
        ConfigurationError: the app can't be loaded, or it has no payload store.
    """
    if app_ref is None:
        return None
    app = load_app(app_ref)
    if app.payload_store is None:
        raise ConfigurationError(f"app {app_ref!r} has no payload store (App(..., payload_store=...)); leave --app out")
    return app.payload_store


async def browse_with_payloads(
    settings: BrokerSettings, name: str, limit: int, selection: Selection, census: Census, store: PayloadStore | None
) -> tuple[str, list[QuarantinedMessage], list[tuple[dict[str, Any] | None, str]]]:
    """:func:`~amqpjobs.runtime.quarantine.browse`, and each message's stored payload (or problem) read from ``store``.

    Without ``store`` every message gets ``(None, "")``; see :func:`~amqpjobs.runtime.payloads.peek`.
    """
    queue, messages = await browse(settings, name, limit, selection, census)
    if store is None:
        return queue, messages, [(None, "")] * len(messages)
    try:
        stored = []
        for m in messages:
            d = m.delivery
            stored.append(await peek(store, d.headers, d.content_type, d.content_encoding))
        return queue, messages, stored
    finally:
        await store.close()
