"""FilePayloadStore's file operations run in a thread, never on the event loop (a shared mount can stall).

Each ``pathlib.Path`` and ``os`` file call is wrapped to note whether the calling thread runs an
event loop; every store method is then awaited once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import FilePayloadStore

pytestmark = pytest.mark.version_independent

_PATH_CALLS = ("exists", "mkdir", "write_text", "unlink", "read_bytes", "open", "iterdir", "read_text", "stat")


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def test_every_file_operation_runs_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bool]] = []

    def noted(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, _on_loop()))
            return func(*args, **kwargs)

        return call

    for name in _PATH_CALLS:
        monkeypatch.setattr(Path, name, noted(name, getattr(Path, name)))
    monkeypatch.setattr(os, "replace", noted("replace", os.replace))
    store = FilePayloadStore(tmp_path / "store")
    await store.open()
    await store.write("k1", b"payload")
    assert await store.read("k1") == b"payload"
    assert await store.read("absent") is None
    assert await store.mark_done("k1", 1.0) is True
    assert await store.mark_done("absent", 1.0) is False
    await store.unmark("k1")
    await store.mark_done("k1", 1.0)
    assert await store.prune(older_than=0) == 1
    await store.write("k2", b"x")
    await store.remove("k2")
    assert os.listdir(tmp_path / "store" / "data") == []  # not noted: the test's own look
    made = {name for name, _ in calls}
    assert {"mkdir", "exists", "write_text", "unlink", "read_bytes", "replace", "iterdir"} <= made
    assert [name for name, on_loop in calls if on_loop] == []
