"""A payload store in a shared directory (NFS, a mounted volume): :class:`FilePayloadStore`."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Unpack

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.payloads import PayloadStore, StoreOptions
from amqpjobs.runtime.refused_stores import refused_when_used
from amqpjobs.text import a_type


@refused_when_used  # another App's bad argument refuses no app named by --app
class FilePayloadStore(PayloadStore):
    """Payloads as files in a directory every producer and worker mounts.

    Layout: ``<root>/data/<key>`` holds a payload (written to a temporary name, then renamed
    into place: a reader never sees half a file); ``<root>/done/<key>`` is its done mark,
    the time of the success as text (seconds since the epoch). See
    :mod:`amqpjobs.runtime.payloads` for the rules and the other arguments. Every file
    operation runs in a thread (``asyncio.to_thread``): a slow shared mount stalls that
    call, never the event loop with its other jobs and heartbeats.

    Args:
        root: The shared directory (created when missing), the same on every host. A relative
            path (or ``~``) is resolved once, here, against the working directory of the
            process building the store: :attr:`root` is absolute, so a process that changes
            directory later (a daemonized worker, a web server) still uses the one directory.
            Producers and workers that build their stores from different working directories
            would still get different ones: give an absolute path then.

    Raises:
        ConfigurationError: ``root`` is empty (it would be the working directory), or a bad option.

    """

    kind = "file"

    def __init__(
        self,
        root: str | Path,
        **options: Unpack[StoreOptions],
    ) -> None:
        super().__init__(**options)
        fix = (
            "give the shared directory every producer and worker mounts, e.g. FilePayloadStore('/mnt/shared/payloads')"
        )
        if not isinstance(root, str | os.PathLike):
            raise ConfigurationError(f"FilePayloadStore(root=...) must be a str or Path (got {a_type(root)}): {fix}")
        if not str(root).strip() or str(root) == ".":  # Path("") is "."
            raise ConfigurationError(f"FilePayloadStore(root=...) is empty (got {str(root)!r}): {fix}")
        if "\x00" in str(root):  # no file system takes it: every read and write would fail (helper-229)
            raise ConfigurationError(f"FilePayloadStore(root=...) holds a NUL character (got {str(root)!r}): {fix}")
        self.root = Path(os.path.abspath(Path(root).expanduser()))  # once: a later chdir changes nothing
        self._data = self.root / "data"
        self._done = self.root / "done"

    async def open(self) -> None:
        """Create the directories when missing."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self._data.mkdir(parents=True, exist_ok=True)
        self._done.mkdir(parents=True, exist_ok=True)

    async def marks_problem(self) -> str | None:
        """See :meth:`PayloadStore.marks_problem`: a probe file created and removed in ``done/`` and ``data/``."""
        return await asyncio.to_thread(self._marks_problem)

    def _marks_problem(self) -> str | None:
        for directory in (self._done, self._data):
            probe = directory / f".probe-{uuid.uuid4().hex}"
            try:
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                return f"{type(exc).__name__}: {exc.strerror or exc} in {str(directory)!r}"
        return None

    async def write(self, key: str, data: bytes) -> None:
        """See :meth:`PayloadStore.write`."""
        await asyncio.to_thread(self._write, key, data)

    def _write(self, key: str, data: bytes) -> None:
        tmp = self._data / f".tmp-{key}-{uuid.uuid4().hex}"
        try:
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._data / key)
        finally:
            tmp.unlink(missing_ok=True)

    async def read(self, key: str) -> bytes | None:
        """See :meth:`PayloadStore.read`."""
        try:
            return await asyncio.to_thread((self._data / key).read_bytes)
        except FileNotFoundError:
            return None

    async def mark_done(self, key: str, at: float) -> bool:
        """See :meth:`PayloadStore.mark_done`."""
        return await asyncio.to_thread(self._mark_done, key, at)

    def _mark_done(self, key: str, at: float) -> bool:
        if not (self._data / key).exists():
            return False
        (self._done / key).write_text(repr(at), encoding="ascii")
        return True

    async def unmark(self, key: str) -> None:
        """See :meth:`PayloadStore.unmark`."""
        await asyncio.to_thread((self._done / key).unlink, missing_ok=True)

    async def remove(self, key: str) -> None:
        """See :meth:`PayloadStore.remove`: the payload first, then its mark."""
        await asyncio.to_thread(self._remove, key)

    def _remove(self, key: str) -> None:
        (self._data / key).unlink(missing_ok=True)
        (self._done / key).unlink(missing_ok=True)

    async def prune(self, older_than: float) -> int:
        """See :meth:`PayloadStore.prune`."""
        await self.open()
        return await asyncio.to_thread(self._prune, time.time() - older_than)

    def _prune(self, before: float) -> int:
        removed = 0
        for mark in self._done.iterdir():
            try:
                at = float(mark.read_text(encoding="ascii"))
            except FileNotFoundError:  # another worker's sweep took it
                continue
            except ValueError:  # unreadable mark (a crash mid-write): its file's time stands in
                at = mark.stat().st_mtime
            if at < before:
                (self._data / mark.name).unlink(missing_ok=True)
                mark.unlink(missing_ok=True)
                removed += 1
        return removed
