"""Imports point one way: jobs/ and topology/ stay free of the wire and the runtime, wire/ of the runtime and jobs/.

Only ``wire/`` talks to the client library (aio-pika, aiormq, pamqp). ``testing/`` (the
in-memory double) sits beside the face: it drives the runtime, implements the wire's
protocols (``wire/abc.py``) and uses no other wire module that talks to a broker; nothing
else in the package depends on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "amqpjobs"
TESTING = "amqpjobs.testing"
CONSOLE = "amqpjobs.console"
FORBIDDEN = {
    "jobs": ("amqpjobs.wire", "amqpjobs.runtime", "amqpjobs.cli", CONSOLE, TESTING, "aio_pika", "aiormq", "pamqp"),
    "topology": (
        "amqpjobs.wire",
        "amqpjobs.runtime",
        "amqpjobs.jobs",
        "amqpjobs.cli",
        CONSOLE,
        TESTING,
        "aio_pika",
        "aiormq",
        "pamqp",
    ),
    "wire": ("amqpjobs.runtime", "amqpjobs.cli", "amqpjobs.jobs", CONSOLE, TESTING),
    "runtime": ("amqpjobs.cli", CONSOLE, TESTING),
    # the console is a face beside the CLI: it uses the library, never the CLI's code
    "console": ("amqpjobs.cli", TESTING, "aio_pika", "aiormq", "pamqp"),
    "cli": (TESTING,),
    "testing": ("amqpjobs.cli", CONSOLE, "aio_pika", "aiormq", "pamqp"),
}
#: The wire modules the double may use: the protocols it implements, settings (plain data), and
#: the size rules of a publish (encoding only), so it refuses what the broker's publisher refuses.
TESTING_MAY_USE = ("amqpjobs.wire.abc", "amqpjobs.wire.settings", "amqpjobs.wire.limits")


#: Every module's syntax tree, parsed once when this file is collected: before any test runs,
#: so before any test leaves a thread behind. CPython 3.11's ``ast.parse`` keeps its recursion
#: depth in state the whole interpreter shares, and a thread parsing at the same moment makes it
#: fail at random with "SystemError: AST constructor recursion depth mismatch" (python/cpython
#: gh-106905; CI run 32 failed so on a file that had not changed).
TREES = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(TREES[path]):
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


CLIENT_LIBRARIES = ("aio_pika", "aiormq", "pamqp")


def test_only_the_wire_imports_the_client_library() -> None:
    outside = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name != "wire"
        for name in imports(path)
        if name.split(".")[0] in CLIENT_LIBRARIES
    ]
    assert not outside, outside


def test_the_double_uses_only_the_wire_protocols() -> None:
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / "testing").glob("*.py"))
        for name in imports(path)
        if name.startswith("amqpjobs.wire") and name not in TESTING_MAY_USE
    ]
    assert (PACKAGE / "testing" / "memory.py").exists()
    assert not bad, bad


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """Our modules ``path`` imports when it is imported (not under TYPE_CHECKING, not inside a function)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in modules)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module, *(f"{child.module}.{a.name}" for a in child.names)]
                found.update(n for n in names if n in modules)
            visit(child)

    visit(TREES[path])
    return found


def test_no_import_cycle() -> None:
    """No two modules import each other when imported, directly or through others (Tarjan's algorithm)."""
    paths = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    graph = {m: _module_imports(p, set(paths)) - {m} for m, p in paths.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def strong(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for module in sorted(graph):
        if module not in order:
            strong(module)
    assert len(graph) > 150  # every module was read
    assert cycles == []
