"""Management API clients kept across requests made in threads, closed only once no thread uses them.

``asyncio.to_thread`` can't stop a thread: a coroutine cancelled while it awaits a
request leaves the request going, and its owner may close meanwhile. Closing an
``httpx.Client`` under a request, or making a new one after the close, leaves a socket
open that nothing closes (Python warns ``ResourceWarning: unclosed socket`` when it is
collected). Here the last thread out closes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

T = TypeVar("T")


class SharedManagementClients:
    """One management API client per use (a name), shared by the threads that ask through it.

    Thread-safe. Its owner's locks usually keep one request per use at a time, but not
    always: a caller cancelled while its request goes on in a thread releases its lock, and
    the next request of that use then overlaps it on the same client (``httpx.Client`` is
    thread-safe; the client's failover order may then be updated by both, harmlessly).

    Args:
        settings: The broker whose management API the clients ask.
        timeout: Seconds each request may take (see :class:`ManagementClient`).

    """

    def __init__(self, settings: BrokerSettings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self._lock = threading.Lock()
        self._clients: dict[str, ManagementClient] = {}
        self._asking = 0  # threads inside ask()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (its clients may still be ending their requests)."""
        return self._closed

    def ask(self, use: str, question: Callable[[ManagementClient], T], otherwise: T) -> T:
        """``question(client)`` with the client for ``use``; ``otherwise`` without asking once closed.

        Blocking (call it in a thread). Raises what ``question`` raises (the client's
        ``BrokerUnavailableError`` / ``ManagementApiError``).
        """
        with self._lock:
            if self._closed:
                return otherwise
            self._asking += 1
            client = self._clients.get(use)
            if client is None:
                client = self._clients[use] = ManagementClient(self.settings, timeout=self.timeout)
        try:
            return question(client)
        finally:
            with self._lock:
                self._asking -= 1
                if self._closed and not self._asking:
                    self._close_all()

    def close(self) -> None:
        """Close the clients now, or when the last request under way ends; no request is begun after."""
        with self._lock:
            self._closed = True
            if not self._asking:
                self._close_all()

    def _close_all(self) -> None:  # under the lock
        for client in self._clients.values():
            client.close()
        self._clients.clear()
