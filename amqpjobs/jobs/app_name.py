"""The App name's rule: it goes into connection names, the broker's log and ours (README "Jobs", its first list)."""

from __future__ import annotations

from amqpjobs.printable import invisible_at, printable

#: The longest ``-<role>`` the app's connection names add to its name (``<app>-sync-publisher-thread``).
LONGEST_CONNECTION_ROLE = "-sync-publisher-thread"
#: A connection name's bound (UTF-8 bytes), as the URL's ``name`` option's (:mod:`amqpjobs.wire.urls`).
CONNECTION_NAME_MAX_BYTES = 255


def app_name_problem(name: object) -> str | None:
    """Why ``name`` can't be an App's name, or None.

    It goes into its connections' names (``<app>-worker``, shown by the management UI and
    written into the broker's log, where a line feed would forge a line) and into log lines:
    a non-blank string of no control characters, at most
    :data:`CONNECTION_NAME_MAX_BYTES` UTF-8 bytes with :data:`LONGEST_CONNECTION_ROLE`.
    (A scheduler's and a ledger marker's queue names hold it too: their rule is checked where they are made.)

    Returns:
        The problem with its fix (``App name is 234 UTF-8 bytes, over 233: ...``), or None.
    """
    if not isinstance(name, str):
        return f"App name must be a string, got {type(name).__name__}"
    if not name.strip():
        return "App name must not be empty or blank: give the App a name (App('shop', ...))"
    if name != name.strip():
        return f"App name {printable(repr(name[:60]))} begins or ends with a blank: write it without"
    if (found := invisible_at(name)) is not None:
        return (
            f"App name {printable(repr(name[:60]))} has a control or invisible character ({found[1]} at index "
            f"{found[0]}): it goes into the app's connection names and the broker's log; use printable characters"
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return f"App name {printable(repr(name[:60]))} is not valid Unicode text (a lone surrogate)"
    room = CONNECTION_NAME_MAX_BYTES - len(LONGEST_CONNECTION_ROLE)
    if size > room:
        return (
            f"App name is {size} UTF-8 bytes, over {room}: its connection names (<app>{LONGEST_CONNECTION_ROLE}) "
            f"must fit {CONNECTION_NAME_MAX_BYTES} bytes; give the App a shorter name"
        )
    return None
