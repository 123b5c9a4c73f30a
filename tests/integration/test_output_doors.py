"""Every door that writes a file (quarantine export FILE, topology export -o, asyncapi -o) reads a path alike.

* ``-`` and a path that is stdout (``/dev/stdout``, ``/dev/fd/1``, the file stdout goes to) write the
  data to stdout, and the summary line to stderr, so the data stays clean for a pipe;
* a FIFO is written when a reader holds it open, and refused at once (exit 2, naming it) when none
  does: opening it would wait for a reader for ever;
* a folder or a socket is refused naming what it is; a device is written (``/dev/null`` takes it,
  ``/dev/full`` is "can't be written (No space left on device)", test_cli_errors).

Before: ``quarantine export work -`` was refused, ``quarantine export work /dev/stdout`` printed its
summary line into the exported JSON lines, and each door given a FIFO with no reader hung (killed by
the test's 20 s bound).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth
from tests.integration.test_cli_errors import EXE
from tests.integration.test_quarantine import cli_env, fill_quarantine
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker

#: Each door, with the path it writes put at {}.
DOORS = {
    "quarantine export": ["quarantine", "export", "work", "{}"],
    "topology export": ["topology", "export", "topology", "-o", "{}"],
    "asyncapi": ["asyncapi", "examples.shop:app", "-o", "{}"],
}


def run(broker: BrokerSettings, args: list[str], path: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    argv = [EXE, *(a.replace("{}", path) for a in args)]
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=cli_env(broker), cwd=cwd, timeout=20,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)} did not end within 20 s")


@pytest.mark.parametrize("target", ["-", "/dev/stdout", "/dev/fd/1"])
async def test_quarantine_export_to_stdout_writes_json_lines_only_there(broker: BrokerSettings, tmp_path: Path,
                                                                         target: str) -> None:  # fmt: skip
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    proc = await asyncio.to_thread(run, broker, DOORS["quarantine export"], target)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [json.loads(line)["message_id"] for line in lines] == ["q-0", "q-1"]  # nothing else in the data
    assert proc.stderr == "exported 2 message(s) to stdout; the queue still holds them\n"
    assert await depth(broker, "work.quarantine") == 2


async def test_quarantine_export_into_the_file_stdout_goes_to_keeps_the_summary_out(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    out = tmp_path / "out.jsonl"
    with out.open("w") as fh:  # amqpjobs quarantine export work out.jsonl > out.jsonl
        proc = await asyncio.to_thread(
            subprocess.run, [EXE, "quarantine", "export", "work", str(out)], stdout=fh, stderr=subprocess.PIPE,
            text=True, env=cli_env(broker), cwd=ROOT, timeout=20,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["message_id"] for line in out.read_text().splitlines()] == ["q-0", "q-1"]
    assert "exported 2 message(s) to stdout" in proc.stderr


@pytest.mark.parametrize("door", list(DOORS))
async def test_a_fifo_with_no_reader_is_refused_at_once(broker: BrokerSettings, tmp_path: Path, door: str) -> None:
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 1)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = await asyncio.to_thread(run, broker, DOORS[door], str(fifo))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = "FILE" if door == "quarantine export" else "-o/--output"
    assert proc.stderr == (
        f"error: {said} {fifo} is a FIFO that no program reads: start its reader first (e.g. cat {fifo}), "
        "or give the path of a file\n"
    )
    assert await depth(broker, "work.quarantine") == 1


@pytest.mark.parametrize("door", list(DOORS))
async def test_a_fifo_with_a_reader_gets_the_output(broker: BrokerSettings, tmp_path: Path, door: str) -> None:
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 1)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = await asyncio.to_thread(run, broker, DOORS[door], str(fifo))
    reader.join(10)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = got[0].decode()
    if door == "quarantine export":
        assert json.loads(text)["message_id"] == "q-0"
    else:
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("door", list(DOORS))
async def test_a_socket_is_refused_naming_it(broker: BrokerSettings, tmp_path: Path, door: str) -> None:
    await make_app(broker, tmp_path)
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        proc = await asyncio.to_thread(run, broker, DOORS[door], str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = "FILE" if door == "quarantine export" else "-o/--output"
    assert proc.stderr == f"error: {said} {path} is a socket; give the path of a file to write\n"


@pytest.mark.parametrize("door", list(DOORS))
async def test_stdout_whose_reader_went_away_ends_quietly_with_141(
    broker: BrokerSettings, tmp_path: Path, door: str
) -> None:
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    read, write = os.pipe()
    os.close(read)  # the reader (head -5) is gone
    argv = [EXE, *(a.replace("{}", "-") for a in DOORS[door])]
    try:
        proc = await asyncio.to_thread(
            subprocess.run, argv, env=cli_env(broker), cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
            timeout=30,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, ""), door
    assert await depth(broker, "work.quarantine") == 2
