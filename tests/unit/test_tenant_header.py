"""The tenant header's one rule, and the words the worker warns with when a header names no tenant by its type."""

from __future__ import annotations

from decimal import Decimal

import pytest

from amqpjobs.jobs import envelope
from amqpjobs.jobs.header_values import tenant_problem

pytestmark = pytest.mark.version_independent


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("acme", None), (b"acme", None), ("", None), (42, None), (Decimal("42"), None), (None, None),
        ({"id": 1}, "a table"), ([1], "an array"), (True, "a boolean"), (1.5, "a float"),
        (Decimal("4.20"), "a decimal"), (Decimal("NaN"), "a decimal"),
    ],
)  # fmt: skip
def test_a_tenant_header_that_names_no_tenant_is_named_with_its_type(value: object, kind: str | None) -> None:
    said = tenant_problem(envelope.TENANT, value)
    assert (envelope.tenant_of(value) is None) == (said is not None or value in ("", None))
    if kind is None:
        assert said is None
    else:
        assert said is not None
        assert said.startswith(f"header amqpjobs-tenant is {kind}, expected a string (or a whole number): "), said
