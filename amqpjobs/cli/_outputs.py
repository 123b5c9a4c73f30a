"""Where a command's output option writes: one rule for every door (``quarantine export FILE``, ``-o``).

* ``-``, an option left out, and a path that *is* stdout (``/dev/stdout``, ``/dev/fd/1``, the
  file stdout was redirected to): the data goes to stdout, and the command's summary line to
  stderr, so a pipe reads the data alone;
* a regular file is created or truncated; a device is written as it is (``/dev/null`` takes
  it; ``/dev/full`` fails "No space left on device", said by :func:`unwritable`);
* a FIFO is written when a program reads it, and refused when none does: opening it for
  writing would wait for a reader for ever. The probe's open end is the one written, so the
  reader sees no end of file before the data;
* a folder, a socket, or a path in a folder that does not exist is refused naming it.

Every refusal is a :class:`~amqpjobs.errors.ConfigurationError` (exit 2) naming the option and the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import click

from amqpjobs.errors import ConfigurationError
from amqpjobs.printable import printable, shell_quote
from amqpjobs.runtime.quarantine import TextSink


@dataclass(frozen=True)
class Output:
    """A checked output: ``path`` None is stdout; ``fd`` a FIFO's open end (its reader found), else None."""

    option: str
    path: Path | None
    fd: int | None = None

    @property
    def shown(self) -> str:
        """How the summary line names it: ``stdout`` or the path (escaped)."""
        return "stdout" if self.path is None else printable(str(self.path))

    def open(self) -> TextSink:
        """The text stream to write (UTF-8); closing it never closes the process's stdout.

        Raises:
            OSError: the file can't be opened (its ``filename`` is the path).
        """
        if self.path is None:
            sys.stdout.flush()
            return _Unclosed(sys.stdout)
        if self.fd is not None:
            os.set_blocking(self.fd, True)
            return os.fdopen(self.fd, "w", encoding="utf-8")
        return self.path.open("w", encoding="utf-8")

    def write(self, text: str) -> None:
        """Write ``text`` whole, then close.

        Raises:
            ConfigurationError: it can't be written (a full disk, no permission): :func:`unwritable`.
            BrokenPipeError: stdout's reader went away (the CLI's exit 141, as for every command).
        """
        if self.path is None:
            click.echo(text, nl=False)
            return
        try:
            with contextlib.closing(self.open()) as fh:
                fh.write(text)
        except OSError as exc:
            raise unwritable(self.option, self.shown, exc) from None


class _Unclosed:
    """Stdout, flushed (not closed) when closed: the command's later lines still have it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` to stdout."""
        return self._stream.write(text)

    def close(self) -> None:
        """Flush stdout (it stays open)."""
        self._stream.flush()


def is_stdout(path: str | Path) -> bool:
    """Whether ``path`` is ``-`` or names the file stdout writes to (``/dev/stdout``, a file it was redirected to)."""
    if str(path) == "-":
        return True
    try:
        here, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such path, or stdout is no file (a test's capture)
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def output_target(option: str, path: str | Path | None) -> Output:
    """Check the output of ``option`` before any work (None, ``-`` or a stdout path: stdout).

    Raises:
        ConfigurationError: a folder, a socket, a FIFO that no program reads, or a path in a
            missing folder; names the option, the path and what to do (exit 2).
    """
    if path is None or is_stdout(path):
        return Output(option, None)
    target = Path(path)
    shown = printable(str(target))
    try:
        mode: int | None = os.stat(target).st_mode
    except OSError:  # missing (created when written) or out of reach (the write says why)
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigurationError(f"{option} {shown} is a folder; give the path of a file to write")
    if mode is not None and stat.S_ISSOCK(mode):
        raise ConfigurationError(f"{option} {shown} is a socket; give the path of a file to write")
    if mode is not None and stat.S_ISFIFO(mode):
        return Output(option, target, _fifo_end(option, target))
    if not target.parent.is_dir():
        folder = target.parent
        raise ConfigurationError(
            f"{option} {shown}: folder {printable(str(folder))} does not exist; create it "
            f"(mkdir -p {shell_quote(str(folder))}) or give another path"
        )
    return Output(option, target)


def _fifo_end(option: str, fifo: Path) -> int:
    """The FIFO's write end, opened without waiting (ConfigurationError when no program reads it)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no reader (https://man7.org/linux/man-pages/man7/fifo.7.html)
            raise unwritable(option, printable(str(fifo)), exc) from None
        shown = printable(str(fifo))
        raise ConfigurationError(
            f"{option} {shown} is a FIFO that no program reads: start its reader first "
            f"(e.g. cat {shell_quote(str(fifo))}), or give the path of a file"
        ) from None


def unwritable(option: str, shown: str, exc: OSError) -> ConfigurationError:
    """The error for the output of ``option`` (``shown``: its path, escaped) failing while written (exit 2).

    The one wording for every output file: names the option, the path, the system's reason and the fix.
    """
    reason = exc.strerror or exc
    return ConfigurationError(f"{option} {shown} can't be written ({reason}); give another path")
