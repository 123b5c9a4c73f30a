"""Event-loop stalls: which handler blocked the loop, for how long, and what that did to its ack.

An ``async def`` handler that does blocking work (CPU, ``time.sleep``, a sync client)
stops the whole event loop: no heartbeats reach the broker, which closes the connection
after the heartbeat timeout and requeues every unacked delivery (RabbitMQ "Detecting Dead
TCP Connections with Heartbeats"). The ack sent after such a run may never reach the
broker, so the run must not be counted a success.

:class:`StallWatch` measures stalls two ways:

* a task on the loop ticks every :data:`TICK` seconds; a late tick is a stall of that
  length (the loop's own view, also read at the end of a run that is still inside one);
* a thread looks at the loop every :data:`TICK` seconds; while the loop is stuck over
  :data:`WARN_AFTER` seconds it finds the handler run on the loop thread's stack (each run
  registers its frame) and charges it the time, so the WARNING names each job that
  blocked, with its own share (two handlers blocking back to back are two warnings).

The loop writes that WARNING once it is back. A block that goes on is said while it lasts
too: the watching thread writes one WARNING per run once the loop has not answered for
:data:`BLOCKED_WARN_AFTER` seconds (job, id, handler, and that heartbeats stopped with it),
as an operator reading the log of a worker stuck for ten minutes needs it then, not after.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from types import FrameType
from typing import Any

from amqpjobs.runtime.logs import field_value

log = logging.getLogger("amqpjobs.worker")

#: Seconds between ticks of the loop task and looks of the watching thread.
TICK = 0.1
#: A stall longer than this (seconds) while a handler runs is logged as a WARNING (once per run).
WARN_AFTER = 1.0
#: Seconds the loop may not answer before the watching thread says so, during the block (once per run): well
#: inside a heartbeat timeout (60 s by default: the broker closes the connection after it).
BLOCKED_WARN_AFTER = 5.0


#: What a run registered with :meth:`StallWatch.enter` is: its field name in the WARNING, where the block was,
#: and the fix. A payload model's validation and a key function run on the loop whatever the handler.
RUNS: dict[str, tuple[str, str, str]] = {
    "handler": ("handler", "", "Make the handler a plain `def` (it then runs in a thread) or move the blocking call "
                "into `await asyncio.to_thread(...)`"),
    "validation": ("payload_model", " validating its payload (before its handler started)",
                   "A payload model's validators run on the event loop for every job, whatever the handler: keep "
                   "them quick and move the blocking call into the handler (a plain `def` runs in a thread)"),
    "key": ("key", " computing its idempotency key (before its handler started)",
            "A job's key function runs on the event loop for a delivery without message_id, whatever the handler: "
            "keep it quick (a pure function of the payload)"),
}  # fmt: skip


def handler_name(handler: object) -> str:
    """``module.qualname`` of a job's handler (``myapp.jobs.resize``), for the words about its stall."""
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    module = getattr(handler, "__module__", None)
    return f"{module}.{name}" if module else str(name)


class StallWatch:
    """Watches one event loop for stalls; handler runs register with :meth:`enter`/:meth:`leave`.

    Attributes:
        episodes: Recent stalls over :data:`WARN_AFTER` seconds, as (start, end) monotonic times.

    """

    def __init__(self) -> None:
        self.episodes: deque[tuple[float, float]] = deque(maxlen=64)
        self._last_tick = time.monotonic()
        self._runs: dict[int, tuple[str, str, object, str]] = {}  # id(frame) -> (job, job id, what runs, its kind)
        self._warned: set[int] = set()  # runs already warned about (one WARNING per run)
        self._said_live: set[int] = set()  # runs said by the watching thread while they block
        self._shares: dict[int, list[Any]] = {}  # key -> [job, job id, seconds, kind]
        self._shares_lock = threading.Lock()
        self._loop_thread = threading.get_ident()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the tick task (on the running loop) and the watching thread."""
        self._loop_thread = threading.get_ident()
        self._last_tick = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        self._thread = threading.Thread(target=self._watch, name="amqpjobs-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop both (idempotent)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()

    def enter(self, frame: FrameType, job: str, job_id: str, handler: object = "", kind: str = "handler") -> int:
        """Register a run by the frame it runs in; returns the key for :meth:`leave`.

        ``handler``: what runs (its name, or the function or class itself: named by :func:`handler_name`
        only when a WARNING says it); ``kind``: what it is (a key of :data:`RUNS`: the handler's run, its
        payload model's validation, its key function), named so in its WARNING with its fix.
        """
        key = id(frame)
        self._runs[key] = (job, job_id, handler, kind)
        return key

    def leave(self, key: int | None) -> None:
        """The run ended (None: nothing was registered)."""
        if key is None:
            return
        self._runs.pop(key, None)
        if self._warned:
            self._warned.discard(key)
        if self._said_live:
            self._said_live.discard(key)

    def longest_since(self, since: float) -> float:
        """The longest stall (seconds) that overlapped ``since`` .. now, one still going on included."""
        now = time.monotonic()
        longest = max(0.0, now - self._last_tick - TICK)
        for start, end in self.episodes:
            if end >= since:
                longest = max(longest, end - start)
        return longest

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            gap = now - self._last_tick - TICK
            self._last_tick = now
            if gap > WARN_AFTER:
                self.episodes.append((now - gap, now))
                self._report(gap)

    def _report(self, seconds: float) -> None:
        with self._shares_lock:
            shares, self._shares = self._shares, {}
        if len(shares) == 1:  # one culprit: the loop's own measure of the whole gap
            for share in shares.values():
                share[2] = seconds
        for key, (job, job_id, blocked, kind) in shares.items():
            if key in self._warned:
                continue
            if key in self._runs:
                self._warned.add(key)
            log.warning(
                "job=%s id=%s blocked the event loop for %.1fs%s: heartbeats stop and the broker may close the "
                "connection and redeliver every unacked job. %s",
                field_value(job), field_value(job_id), blocked, RUNS[kind][1], RUNS[kind][2],
            )  # fmt: skip

    def _watch(self) -> None:
        looked = time.monotonic()
        while not self._stop.wait(TICK):
            now = time.monotonic()
            stuck, since = now - self._last_tick, now - looked
            looked = now
            if stuck < WARN_AFTER or not self._runs:
                continue
            frame: Any = sys._current_frames().get(self._loop_thread)
            while frame is not None:
                run = self._runs.get(id(frame))
                if run is not None:
                    job, job_id, handler, kind = run
                    with self._shares_lock:
                        share = self._shares.setdefault(id(frame), [job, job_id, 0.0, kind])
                        # the first look in a stall charges the whole time stuck so far
                        share[2] += stuck if len(self._shares) == 1 and share[2] == 0.0 else since
                    if stuck >= BLOCKED_WARN_AFTER and id(frame) not in self._said_live:
                        self._said_live.add(id(frame))
                        name = handler if isinstance(handler, str) else handler_name(handler)
                        self._say_live(job, job_id, name, kind)
                    break
                frame = frame.f_back

    @staticmethod
    def _say_live(job: str, job_id: str, handler: str, kind: str = "handler") -> None:
        """The WARNING of a block still going on (from the watching thread: the loop can't write it)."""
        log.warning(
            "job=%s id=%s %s=%s has blocked the event loop for %gs%s and still does: heartbeats have stopped "
            "with it, so the broker closes the connection after its heartbeat timeout and redelivers every "
            "unacked job, and /readyz answers 503. %s",
            field_value(job), field_value(job_id), RUNS[kind][0], field_value(handler or "?"), BLOCKED_WARN_AFTER,
            RUNS[kind][1], RUNS[kind][2],
        )  # fmt: skip
