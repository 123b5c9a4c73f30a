"""The console's form fields, read and checked: a bad value is refused naming its field and the fix.

Numbers must be finite: ``float()`` reads ``nan``, ``inf`` and ``1e999`` (infinity), which
no rate means and which JSON cannot hold (RFC 8259 section 6: the audit log would get a line
no JSON reader takes).
"""

from __future__ import annotations

import math
from typing import Any

from amqpjobs.errors import ConfigurationError


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


def positive_number(form: Any, name: str, default: str, meaning: str, example: str) -> float:
    """The field ``name`` as a positive, finite float (``default`` when empty).

    Args:
        form: The submitted form.
        name: The field.
        default: Its value when left empty.
        meaning: What the number counts, for the error (``messages per second``).
        example: A good value, for the error (``10``).

    Raises:
        FormError: not a number, NaN, infinite, zero or negative.

    """
    text = text_of(form, name) or default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise FormError(name, f"give a positive, finite number of {meaning}, e.g. {example} (got {text!r})")
    return value
