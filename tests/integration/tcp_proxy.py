"""A TCP proxy a test puts in front of a broker node or a database, to cut, silence or stop it (one home)."""

from __future__ import annotations

import asyncio


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream``; or, while ``silent``, accepts and never answers.

    ``start()`` opens the port (the same one again after ``stop()``); ``cut()`` closes every
    forwarded connection (the client sees its connection lost); ``stop()`` closes the port and
    cuts. ``silent_accepted`` counts connections taken while silent, ``silent_closed`` those the
    client has closed since (an attempt it gave up). ``hold_sends(keep)`` stops forwarding what
    clients send, from then on, on every open connection whose first bytes (the AMQP handshake
    names the connection) do not contain ``keep``: their acks, say, never reach the broker.
    ``black_hole()`` is a network cut without a reset: open connections stay open but every byte,
    both ways, is dropped from then on, and new connections are taken silently;
    ``black_hole(False)`` passes bytes again (on the connections still open, and new ones).
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.silent = False
        self.silent_accepted = 0
        self.silent_closed = 0
        self.dropping = False  # black_hole(): open connections forward nothing
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._silent: set[asyncio.StreamWriter] = set()  # connections taken while silent, still open
        self._tasks: set[asyncio.Task[None]] = set()
        self._sent: list[bytearray] = []  # each client's first bytes, in the order accepted
        self._held: set[int] = set()  # ids of those whose sends are held (hold_sends)
        self._never = asyncio.Event()  # awaited by held sends (never set)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.silent:
            self.silent_accepted += 1
            self._silent.add(writer)
            try:
                while await reader.read(4096):
                    pass
            except OSError:  # cut() aborted it
                return
            finally:
                self._silent.discard(writer)
            self.silent_closed += 1  # the client closed it: it gave that attempt up
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._pairs.append((writer, up_writer))
        self._sent.append(first := bytearray())
        for source, sink, sent in ((reader, up_writer, first), (up_reader, writer, None)):
            task = asyncio.create_task(self._pipe(source, sink, sent))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def hold_sends(self, keep: bytes) -> None:
        """Forward nothing more that clients send on open connections whose first bytes lack ``keep``."""
        self._held |= {id(sent) for sent in self._sent if keep not in sent}

    def black_hole(self, on: bool = True) -> None:
        """Drop every byte both ways on open connections and answer no new one (``on``); else pass again."""
        self.dropping = self.silent = on

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, sent: bytearray | None) -> None:
        """Forward ``source`` to ``sink``; ``sent``: a client's first bytes (None: the upstream's answers)."""
        try:
            while data := await source.read(65536):
                if sent is not None:
                    sent += data[: max(0, 4096 - len(sent))]
                    if id(sent) in self._held:
                        await self._never.wait()  # held: until the connection is cut
                if self.dropping:
                    continue  # the black hole: read and lost
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
        for writer in list(self._silent):  # else left open past the test's loop (a ResourceWarning later)
            writer.transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.cut()
        for task in list(self._tasks):
            task.cancel()
