"""A TCP proxy a test puts in front of a broker node or a database, to cut, silence or stop it (one home)."""

from __future__ import annotations

import asyncio


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream``; or, while ``silent``, accepts and never answers.

    ``start()`` opens the port (the same one again after ``stop()``); ``cut()`` closes every
    forwarded connection (the client sees its connection lost); ``stop()`` closes the port and
    cuts. ``silent_accepted`` counts connections taken while silent, ``silent_closed`` those the
    client has closed since (an attempt it gave up).
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.silent = False
        self.silent_accepted = 0
        self.silent_closed = 0
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.silent:
            self.silent_accepted += 1
            while await reader.read(4096):
                pass
            self.silent_closed += 1  # the client closed it: it gave that attempt up
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._pairs.append((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()

    def cut(self) -> None:
        for client, upstream in self._pairs:
            client.transport.abort()
            upstream.transport.abort()
        self._pairs.clear()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.cut()
        for task in list(self._tasks):
            task.cancel()
