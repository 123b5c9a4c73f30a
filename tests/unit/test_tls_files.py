"""A TLS file option (cacertfile, certfile, keyfile) must name a readable regular file of PEM size.

A device, a FIFO or a huge file used to be read as it is: ``certfile=/dev/zero`` read
forever (the process growing without end), a FIFO's ``open`` waited for a writer, and a
path holding a NUL (``%00`` in the URL) raised ``ValueError: embedded null byte`` as a
traceback out of every command.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.tls import ssl_context


@pytest.mark.parametrize("option", ["certfile", "keyfile", "cacertfile"])
@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_at_once_naming_the_option(option: str, path: str, tmp_path: Path) -> None:
    options = {"certfile": str(tmp_path / "missing.pem"), option: path}  # keyfile needs a certfile beside it
    with pytest.raises(ConfigurationError, match=rf"{option}={path!r} is not a regular file \(a PEM file's path\)"):
        ssl_context(options)


@pytest.mark.parametrize("option", ["certfile", "keyfile", "cacertfile"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(option: str, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    options = {"certfile": str(tmp_path / "missing.pem"), option: str(fifo)}
    with pytest.raises(ConfigurationError, match=rf"{option}=.* is not a regular file"):
        ssl_context(options)


@pytest.mark.parametrize("option", ["certfile", "keyfile", "cacertfile"])
def test_a_path_with_a_nul_is_refused_naming_the_option(option: str) -> None:
    options = {"certfile": "/etc/ssl/c.pem", option: "/etc/ssl/c.pem\x00x"}
    with pytest.raises(ConfigurationError, match=rf"{option}='/etc/ssl/c.pem\\x00x' holds a NUL character"):
        ssl_context(options)


def test_a_file_far_larger_than_any_pem_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    with big.open("wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: 65 MiB without writing them
    with pytest.raises(ConfigurationError, match=r"certfile=.* is 65 MiB: larger than any PEM file \(64 MiB at most\)"):
        ssl_context({"certfile": str(big)})
