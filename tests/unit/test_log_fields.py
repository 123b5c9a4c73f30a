"""Every log line names a job and a job id by :func:`amqpjobs.runtime.logs.field_value`: at most 200 characters.

Another publisher's job id (its ``message_id``) or ``amqpjobs-job`` header can be of any
length; a line is cut at 1,000 characters (``MAX_LINE``), so a raw id would push out what the
line says after it (what happens to the job now).
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from amqpjobs.runtime.fallback import ack
from amqpjobs.runtime.logs import MAX_LINE, TextFormatter
from amqpjobs.wire.acks import DeliveryChannelClosed

pytestmark = pytest.mark.version_independent

PACKAGE = Path(__file__).resolve().parents[2] / "amqpjobs"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
JOB_ATTRIBUTES = {"job", "job_id", "job_name"}
PASS_THROUGH = {"logfmt_value", "printable", "shell_quote", "str", "repr"}


def _names_a_job(node: ast.expr) -> bool:
    """Whether ``node`` logs ``job_id``, ``x.job_id``, ``x.job`` or ``job.name`` as it is (a job's name or id, maybe
    another publisher's), maybe through :data:`PASS_THROUGH`; not inside another call (``field_value(...)``, a helper
    that uses it, ``d.get(job.name)``)."""
    if isinstance(node, ast.Call):  # what passes the text through as long as it came is no bound
        return ast.unparse(node.func) in PASS_THROUGH and any(_names_a_job(a) for a in node.args)
    if isinstance(node, ast.Name):
        return node.id in JOB_ATTRIBUTES - {"job"}
    if isinstance(node, ast.Attribute) and (
        node.attr in JOB_ATTRIBUTES
        or (node.attr == "name" and isinstance(node.value, ast.Name) and node.value.id == "job")
    ):
        return True
    return any(_names_a_job(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))


def _unbounded_job_fields() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS):
                continue
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id in {"log", "logger"}):
                continue
            for arg in node.args[1:]:
                if _names_a_job(arg):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{arg.lineno}: {ast.unparse(arg)}")
    return found


def test_every_logging_call_bounds_the_job_names_and_ids_it_names() -> None:
    assert _unbounded_job_fields() == []


class _ClosedChannelDelivery:
    async def ack(self, at_once: bool = False) -> None:
        raise DeliveryChannelClosed


async def test_a_warning_about_a_job_with_a_huge_id_keeps_what_it_says_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job_id = "x" * 5000
    with caplog.at_level(logging.WARNING, logger="amqpjobs"):
        assert await ack(_ClosedChannelDelivery(), job_id) is False  # type: ignore[arg-type]
    (record,) = caplog.records
    line = TextFormatter().format(record)
    assert len(line) <= MAX_LINE
    assert line.endswith(
        "its channel closed before the ack; the broker redelivers it (the copy already published makes this a "
        "duplicate the handler must tolerate)"
    )
    assert "x" * 150 in line
    assert "…[4830 more characters]" in line
