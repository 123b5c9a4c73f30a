"""The rules of the names people read and compare: the App's and its jobs' (README "Jobs", its first list).

An App's name goes into connection names, the broker's log and ours; a job's into the ``type``
property of its messages, log lines, metrics and quarantine.
"""

from __future__ import annotations

import unicodedata

from amqpjobs.jobs.envelope import shortstr_problem
from amqpjobs.printable import invisible_at, printable
from amqpjobs.text import lone_surrogate

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
    if problem := not_composed("App name", name, "another App written composed would be another app (its own "
                               "ledger marker and scheduler queues) that prints the same"):  # fmt: skip
        return problem
    room = CONNECTION_NAME_MAX_BYTES - len(LONGEST_CONNECTION_ROLE)
    if size > room:
        return (
            f"App name is {size} UTF-8 bytes, over {room}: its connection names (<app>{LONGEST_CONNECTION_ROLE}) "
            f"must fit {CONNECTION_NAME_MAX_BYTES} bytes; give the App a shorter name"
        )
    return None


def job_name_problem(name: object) -> str | None:
    """Why ``name`` can't be a job's name (``@app.job(name)``), or None.

    It is sent as each job's ``type`` property (an AMQP short string: 1-255 UTF-8 bytes) and shown
    and compared in logs, metrics, quarantine and the console: a str of UTF-8 text (no lone
    surrogate), no blank at either end, no control or invisible character
    (:func:`~amqpjobs.printable.invisible_at`: ``mail`` and ``mail\u200b`` would be two jobs that
    print the same), in Unicode's composed form NFC (``cafe`` + U+0301 and the composed ``café`` likewise).
    Jobs from other publishers are read as they come.

    Returns:
        The problem with its fix (``job name 'mail\u3164' has a control or invisible character ...``), or None.
    """
    if not isinstance(name, str):
        return f"job name must be a str (got {type(name).__name__} {printable(repr(name))[:60]})"
    shown = printable(repr(name[:40]))
    if not name.strip():
        return f"job name {shown} is empty or blank: give the job a name (@app.job('mail.send', ...))"
    if where := lone_surrogate(name):
        return f"job name {shown} is not UTF-8 text ({where}): no message can carry it"
    if problem := shortstr_problem(f"job name {name[:40]!r}", name):
        return problem
    if name != name.strip():
        return f"job name {shown} begins or ends with a blank: write it without"
    if (found := invisible_at(name)) is not None:
        return (
            f"job name {shown} has a control or invisible character ({found[1]} at index {found[0]}): it is shown "
            "and compared in logs, metrics and quarantine; use printable characters"
        )
    return not_composed("job name", name, "a publisher writing it composed sends another job that prints the same")


def not_composed(what: str, name: str, why: str) -> str | None:
    """Why ``name`` (``what``: "job name", "App name") is refused: not in Unicode's composed form NFC; or None.

    NFC (Unicode Standard Annex 15) is what keyboards and most editors write: ``cafe`` + U+0301
    and the composed ``café`` print the same but are two names to the broker and to us.
    """
    if unicodedata.is_normalized("NFC", name):
        return None
    return (
        f"{what} {name[:40]!a} is not in Unicode's composed form (NFC: {unicodedata.normalize('NFC', name)[:40]!a}): "
        f"{why}; use unicodedata.normalize('NFC', name)"
    )
