"""The console's forms, read and checked: a bad value is refused naming its field and the fix.

Every refusal is a :class:`FormError` (``<field>: <what to give> (got '<value>')``); the
page that posted is shown again with it and with the values as typed (HTTP 400), so nothing
has to be typed twice. Numbers must be finite: ``float()`` reads ``nan``, ``inf`` and
``1e999`` (infinity), which no rate means and which JSON cannot hold (RFC 8259 section 6:
the audit log would get a line no JSON reader takes).
"""

from __future__ import annotations

import base64
import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from markupsafe import Markup

from amqpjobs.durations import DurationTooLongError, format_duration, parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.replay_plan import (  # shared with the CLI
    DEFAULT_CANARY_TIMEOUT,
    MAX_CANARY,
    MAX_CANARY_TIMEOUT,
    MAX_REPLAY_RATE,
    MIN_REPLAY_RATE,
)
from amqpjobs.printable import printable
from amqpjobs.text import ascii_digits
from amqpjobs.topology.naming import queue_name_problem

#: Filter fields of a quarantine page and of an action's form.
FILTERS: Final = ("job", "error_type", "reason", "group", "search")
#: The value of the "(unknown)" option of the job, reason and error type filters: the messages naming none.
UNKNOWN: Final = "(unknown)"
#: The filters chosen from a list of the values present (a select); their "(unknown)" option means "".
LISTED: Final = ("job", "error_type", "reason")


class FormError(ConfigurationError):
    """A form field's value is refused.

    Attributes:
        field: The field's name (as in the form).

    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def text_of(form: Any, name: str) -> str:
    """The field ``name`` of ``form`` (a Starlette form or query string), stripped; "" when absent."""
    return str(form.get(name) or "").strip()


def required(form: Any, name: str, what: str) -> str:
    """The field ``name``, which must be given (no default stands in for it).

    Raises:
        FormError: absent or empty; the message says ``what`` to give.

    """
    if not (text := text_of(form, name)):
        raise FormError(name, f"missing: give {what}")
    return text


def positive_number(form: Any, name: str, ceiling: float, meaning: str, example: str, floor: float = 0.0) -> float:
    """The field ``name`` (required) as a positive, finite float, at least ``floor`` and at most ``ceiling``.

    Args:
        form: The submitted form.
        name: The field.
        ceiling: The largest value taken.
        meaning: What the number counts, for the error (``messages per second``).
        example: A good value, for the error (``10``).
        floor: The smallest value taken (0: any positive one).

    Raises:
        FormError: missing, not a number, NaN, infinite, zero, negative, below ``floor`` or above ``ceiling``.

    """
    text = required(form, name, f"a positive number of {meaning}, e.g. {example}")
    try:
        value = float(text) if text.isascii() else math.nan  # float() also reads other scripts' digits
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise FormError(name, f"give a positive, finite number of {meaning}, e.g. {example} (got {text!r})")
    if value > ceiling:
        raise FormError(name, f"at most {ceiling:g} {meaning} (got {text!r})")
    if value < floor:
        raise FormError(name, f"at least {floor:g} {meaning} (got {text!r})")
    return value


def whole_number(text: str, ceiling: int) -> int | None:
    """``text`` as a whole number when it is ASCII digits only, else None; past ``ceiling``: ``ceiling + 1``.

    A number of more digits than ``ceiling`` has is above it, whatever they are, and is not
    converted: ``int()`` raises ``ValueError`` past 4300 digits (``sys.get_int_max_str_digits``).
    """
    if not ascii_digits(text):
        return None
    significant = text.lstrip("0") or "0"
    return int(significant) if len(significant) <= len(str(ceiling)) else ceiling + 1


def queue_of(value: str | None) -> str:
    """A quarantine or parked queue name as given.

    Raises:
        FormError: empty, or a name no queue can have (:func:`~amqpjobs.topology.naming.queue_name_problem`).

    """
    if not value:
        raise FormError("queue", "give a quarantine or parked queue name")
    if issue := queue_name_problem(value):
        raise FormError("queue", issue)
    return value


def filter_options(present: Iterable[str], chosen: str) -> list[tuple[str, str, bool]]:
    """(value, label, selected) of each option of a filter's select, after its "any" option (value "").

    A value present as "" (a message naming no job) is the :data:`UNKNOWN` option, so that
    "any" and "(unknown)" differ: one is selected only when it is exactly what was chosen,
    none when no filter was (``chosen`` "").
    """
    return [(value or UNKNOWN, value or UNKNOWN, bool(chosen) and chosen == (value or UNKNOWN)) for value in present]


#: The form field of a message key a page can't write as it is (:func:`key_field`): base64url of its UTF-8.
KEY64 = "job_key64"


def key_field(key: str) -> Markup:
    r"""The ``name`` and ``value`` attributes of a form field that sends message key ``key`` (a job id) back.

    A key the pages show escaped (a control character, a right-to-left override: ``\u202e``) or
    that a browser would change on the way (a line break, sent as CRLF) goes as :data:`KEY64`, its
    UTF-8 in base64url; any other as ``job_id``, as it is. Before, the escaped text was sent as the
    id, and the action found no such job (``parked 0 message(s)``).
    """
    if printable(key) == key and "\n" not in key and "\r" not in key:
        return Markup('name="job_id" value="{}"').format(key)
    encoded = base64.urlsafe_b64encode(key.encode("utf-8", "surrogatepass")).decode("ascii")
    return Markup('name="{}" value="{}"').format(KEY64, encoded)


def form_nonce() -> str:
    """A fresh random value for an action form's ``form_nonce`` field: the console acts once per form shown.

    The CSRF token is one per process, so a form a browser sends again (back button, reload) passes
    it; its nonce, seen before with the same action, is refused (409) instead of acting on whatever
    matches by then. Another button of the same form (Park after Replay) acts.
    """
    return secrets.token_urlsafe(16)


def _key_of(value: str) -> str:
    """The key :func:`key_field` sent as base64url (RFC 4648 section 5; its padding optional), read strictly."""
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except (ValueError, UnicodeError):  # binascii.Error is a ValueError; a non-ASCII character a UnicodeError
        raw = b""
    if not raw:  # invalid, or a lone "=": never a key (the lenient decoder read "!!!" as "")
        raise FormError("job_id", f"a checked message's key is not base64url (got {value[:40]!r}); reload the page")
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeError:
        raise FormError(
            "job_id", f"a checked message's key is not UTF-8 text once decoded (got {value[:40]!r}); reload the page"
        ) from None


def selection_of(values: Any) -> Selection:
    """The :class:`Selection` of a query string or form: the filter fields and any ``job_id`` checked.

    An empty field is no filter; :data:`UNKNOWN` in a listed filter (:data:`LISTED`) selects the messages naming none.
    """
    given: dict[str, str | None] = {k: text_of(values, k) or None for k in FILTERS}
    for k in LISTED:
        if given[k] == UNKNOWN:
            given[k] = ""
    ids = [i for i in values.getlist("job_id") if i] + [_key_of(v) for v in values.getlist(KEY64) if v]
    return Selection(job=given["job"], error_type=given["error_type"], reason=given["reason"], group=given["group"],
                     search=given["search"], job_ids=frozenset(ids) if ids else None)  # fmt: skip


@dataclass(frozen=True)
class ActionForm:
    """An action's form, checked.

    Attributes:
        queue: The quarantine or parked queue.
        chosen: The messages to act on (the filter; the checked ones for scope ``selected``).
        params: What was asked, JSON-ready (shown on the progress page and audited).
        rate: Replays per second (replay).
        canary: K jobs first, None without (replay).
        canary_timeout: Seconds to wait for the canaries' outcomes (replay).

    """

    queue: str
    chosen: Selection
    params: dict[str, Any] = field(default_factory=dict)
    rate: float = 10.0
    canary: int | None = None
    canary_timeout: float = DEFAULT_CANARY_TIMEOUT


def action_form(kind: str, form: Any) -> ActionForm:
    """Read the form of action ``kind`` (``replay``, ``park``, ``unpark``, ``purge``).

    Raises:
        FormError: the first bad field: the queue, the scope (``all`` or ``selected`` with
            some checked), the rate, canary or canary timeout (replay; any timeout typed without a
            canary, as ``replay --canary-timeout`` without ``--canary``; empty is the default), or the
            queue's name not typed out (purge).

    """
    queue = queue_of(text_of(form, "queue"))
    chosen = selection_of(form)
    scope = required(form, "scope", "all (every message matching the filter) or selected (the checked ones): "
                                    "press one of the action buttons")  # fmt: skip
    if scope == "all":  # every message matching the filter, whatever is checked
        chosen = replace(chosen, job_ids=None)
    elif scope != "selected":
        raise FormError("scope", f"give all (every message matching the filter) or selected (the checked ones) "
                                 f"(got {scope!r})")  # fmt: skip
    elif chosen.job_ids is None:
        raise FormError("job_id", "no message checked: check some, or use the 'all matching' button")
    params: dict[str, Any] = {k: text_of(form, k) for k in FILTERS if text_of(form, k)}
    if chosen.job_ids is not None:
        params["job_ids"] = sorted(chosen.job_ids)
    if kind == "purge" and (typed := text_of(form, "confirm")) != queue:
        raise FormError("confirm", f"type the queue's name, {queue}, to purge it (got {typed!r})")
    if kind != "replay":
        return ActionForm(queue, chosen, params)
    rate = positive_number(form, "rate", MAX_REPLAY_RATE, "messages per second", "10", floor=MIN_REPLAY_RATE)
    canary_text = text_of(form, "canary")
    canary = whole_number(canary_text, MAX_CANARY)
    if canary_text and (canary is None or canary < 1):
        raise FormError("canary", f"give a whole number of jobs, at least 1, or leave it empty (got {canary_text!r})")
    if canary is not None and canary > MAX_CANARY:
        raise FormError("canary", f"at most {MAX_CANARY} jobs (got {canary_text!r})")
    timeout = DEFAULT_CANARY_TIMEOUT
    # The form sends the field empty (the default is its placeholder): any text in it was typed, a request.
    timeout_text = text_of(form, "canary_timeout")
    if canary is None and timeout_text:  # as the CLI refuses --canary-timeout without --canary, 60s too
        raise FormError("canary_timeout", "a canary timeout needs a canary (how many jobs to move first, e.g. 2): "
                        f"fill in canary, or empty the timeout (its default is {DEFAULT_CANARY_TIMEOUT:g}s) "
                        f"(got {timeout_text!r})")  # fmt: skip
    if canary is not None and timeout_text:  # the timeout of the canaries: asked for with them; empty: the default
        try:
            timeout = parse_duration(timeout_text)
        except DurationTooLongError:
            timeout = math.inf  # the ceiling's message below
        except ValueError:
            shown = repr(timeout_text)
            raise FormError("canary_timeout", f"give a duration such as 30s, 2m or 1m30s (got {shown})") from None
        if timeout > MAX_CANARY_TIMEOUT:
            raise FormError("canary_timeout", f"at most {format_duration(MAX_CANARY_TIMEOUT)} (got {timeout_text!r})")
    params.update(rate=rate, canary=canary, canary_timeout=timeout)
    return ActionForm(queue, chosen, params, rate, canary, timeout)
