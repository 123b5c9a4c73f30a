"""Imports point one way: jobs/ and topology/ stay free of the wire and the runtime, wire/ of the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "amqpjobs"
FORBIDDEN = {
    "jobs": ("amqpjobs.wire", "amqpjobs.runtime", "amqpjobs.cli", "aio_pika", "aiormq", "pamqp"),
    "topology": ("amqpjobs.wire", "amqpjobs.runtime", "amqpjobs.jobs", "amqpjobs.cli", "aio_pika", "aiormq"),
    "wire": ("amqpjobs.runtime", "amqpjobs.cli"),
    "runtime": ("amqpjobs.cli",),
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_down(layer: str) -> None:
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).glob("*.py"))
        for name in imports(path)
        if name.startswith(FORBIDDEN[layer])
    ]
    assert not bad, bad


#: runtime/ modules that still catch aiormq exception types themselves instead of getting
#: them translated by the wire (known debt; no new ones).
RUNTIME_AIORMQ_DEBT = {"quarantine.py", "scheduler.py"}


def test_only_the_wire_imports_the_client_library() -> None:
    outside = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name != "wire" and path.name not in RUNTIME_AIORMQ_DEBT
        for name in imports(path)
        if name.split(".")[0] in ("aiormq", "pamqp")
    ]
    assert not outside, outside
