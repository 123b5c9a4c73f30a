"""Which metrics folders a supervisor's start removes (``runtime/metrics_folders.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpjobs.runtime.metrics_folders import PREFIX, new_folder, remove_left_behind


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder(root: Path, name: str, *files: str) -> Path:
    path = root / name
    path.mkdir()
    for file in files:
        (path / file).write_bytes(b"\0" * 8)
    return path


def test_only_folders_whose_supervisor_and_children_are_gone_are_removed(tmp_path: Path):
    gone, alive = dead_pid(), os.getpid()
    left = folder(tmp_path, f"{PREFIX}{gone}-abc", f"counter_{gone}.db", f"histogram_{dead_pid()}.db")
    empty = folder(tmp_path, f"{PREFIX}{gone}-def")
    draining = folder(tmp_path, f"{PREFIX}{gone}-ghi", f"counter_{gone}.db", f"gauge_livemax_{alive}.db")
    running = folder(tmp_path, f"{PREFIX}{alive}-jkl", f"counter_{gone}.db")
    old_style = folder(tmp_path, f"{PREFIX}x7_k2p9q", f"counter_{gone}.db")
    other = folder(tmp_path, f"not-{PREFIX}{gone}-mno")
    (tmp_path / f"{PREFIX}{gone}-file").write_text("a file, not a folder")
    assert sorted(remove_left_behind(str(tmp_path))) == sorted([str(left), str(empty)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [draining.name, running.name, old_style.name, other.name, f"{PREFIX}{gone}-file"]
    )


def test_a_new_folder_names_its_supervisor_and_clears_those_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read $TMPDIR again
    left = folder(tmp_path, f"{PREFIX}{dead_pid()}-abc")
    made = Path(new_folder())
    assert made.parent == tmp_path
    assert made.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert made.is_dir()
    assert not left.exists()


def test_a_missing_temp_folder_removes_nothing(tmp_path: Path):
    assert remove_left_behind(str(tmp_path / "none")) == []
