"""A job app for tests that run the worker as a separate process (`amqpjobs consume`).

Settings come from the environment: ``PROCAPP_TOPOLOGY`` (topology file),
``PROCAPP_RECORD`` (a file each run appends "start <id> <attempt> <redelivered 0|1> <pid>" and
"done <id> <pid>" lines to, with "yielded <id> <pid>" between for ``hold``; "count <id> <pid>" for the
``count`` job; "effect <id> <pid>" for the plain-function ``effect`` job, which has no "done";
"cancelled <id> <pid>" for each cancellation the ``stubborn`` job swallows),
``PROCAPP_RESULTS`` (a SQLite results store; none when unset) and
``PROCAPP_FAIL_IMPORT`` (when set, importing this module appends "import <child> <pid>"
to the record, then raises RuntimeError) and ``PROCAPP_SLOW_IMPORT`` (seconds: importing this
module appends "importing <pid>" to the record, then sleeps that long: an app slow to load;
``PROCAPP_CHILD_SLOW_IMPORT`` the same in a ``--processes`` child only), and
``PROCAPP_IMPORT_THREAD`` (seconds: importing this module starts a non-daemon thread ``import-poller`` that
sleeps that long).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from amqpjobs import App, JobContext, SqliteResults

if os.environ.get("PROCAPP_FAIL_IMPORT"):
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as _fh:
        _fh.write(f"import {os.environ.get('AMQPJOBS_CHILD', '-')} {os.getpid()}\n")
    raise RuntimeError("procapp configured to fail at import (PROCAPP_FAIL_IMPORT)")

if os.environ.get("AMQPJOBS_CHILD") and os.environ.get("PROCAPP_CHILD_SLOW_IMPORT"):  # children only
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as _fh:
        _fh.write(f"importing {os.getpid()}\n")
    time.sleep(float(os.environ["PROCAPP_CHILD_SLOW_IMPORT"]))

if os.environ.get("PROCAPP_SLOW_IMPORT"):
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as _fh:
        _fh.write(f"importing {os.getpid()}\n")
    time.sleep(float(os.environ["PROCAPP_SLOW_IMPORT"]))

if os.environ.get("PROCAPP_IMPORT_THREAD"):  # a library's poller, started at import: a non-daemon thread
    import threading

    threading.Thread(
        target=time.sleep, args=(float(os.environ["PROCAPP_IMPORT_THREAD"]),), name="import-poller"
    ).start()

_results = os.environ.get("PROCAPP_RESULTS")
app = App(
    "procapp",
    topology=os.environ.get("PROCAPP_TOPOLOGY", "topology"),
    results=SqliteResults(_results) if _results else None,
)


def _record(line: str) -> None:
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@app.job("sleep", queue="work", timeout="60s")
async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
    """Sleep ``payload["seconds"]``, recording start and completion."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("hold", queue="work", timeout="60s")
async def hold(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record start, yield 0.2 s to the loop, record "yielded"; a first delivery then holds 60 s, a redelivery ends."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    await asyncio.sleep(0.2)  # the loop turns: anything the worker queued (an ack) reaches the socket
    _record(f"yielded {ctx.job_id} {os.getpid()}")
    if not ctx.redelivered:
        await asyncio.sleep(60)
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("effect", queue="work", timeout="60s")
def effect(payload: dict[str, Any], ctx: JobContext) -> None:
    """A plain function (it runs in a thread): record its start, sleep ``payload["seconds"]``, record its effect."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    time.sleep(float(payload.get("seconds", 0)))
    _record(f"effect {ctx.job_id} {os.getpid()}")


@app.job("count", queue="work", timeout="60s")
async def count(payload: dict[str, Any], ctx: JobContext) -> None:
    """Append "count <id> <pid>" to the record (one small O_APPEND write: whole lines from many processes)."""
    _append(f"count {ctx.job_id} {os.getpid()}")


def _append(line: str) -> None:
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@app.job("stubborn", queue="work", timeout="60s")
async def stubborn(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record its start; a first delivery ignores every cancellation for ``payload["seconds"]``, a redelivery ends.

    Each cancellation it swallows appends "cancelled <id> <pid>".
    """
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    if not ctx.redelivered:
        end = time.monotonic() + float(payload.get("seconds", 0))
        while (left := end - time.monotonic()) > 0:
            try:
                await asyncio.sleep(left)
            except asyncio.CancelledError:
                _record(f"cancelled {ctx.job_id} {os.getpid()}")
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("raiser", queue="work", timeout="60s")
async def raiser(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record its start and sleep ``payload["seconds"]``; cancelled, it raises RuntimeError instead."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    try:
        await asyncio.sleep(float(payload.get("seconds", 0)))
    except asyncio.CancelledError:
        raise RuntimeError("cancelled, and raised this instead") from None
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("heap", queue="work", timeout="60s")
async def heap(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record "heap <id> <objects frozen out of collections> <gc enabled 0/1> <pid>" (heap.settle_heap)."""
    import gc

    _record(f"heap {ctx.job_id} {gc.get_freeze_count()} {int(gc.isenabled())} {os.getpid()}")


@app.job("leak", queue="work", timeout="60s")
async def leak(payload: dict[str, Any], ctx: JobContext) -> None:
    """Leave a thread running ``payload["seconds"]`` and return: ``payload["how"]`` ``thread`` (a plain
    non-daemon ``threading.Thread``) or ``executor`` (the loop's default executor, as ``asyncio.to_thread``)."""
    import threading

    seconds = float(payload.get("seconds", 0))
    if payload.get("how") == "executor":
        asyncio.get_running_loop().run_in_executor(None, time.sleep, seconds)
    else:
        threading.Thread(target=time.sleep, args=(seconds,), name="app-poller").start()
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")


@app.job("wedge", queue="work", timeout="60s")
async def wedge(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record its start, then block the event loop ``payload["seconds"]`` (``time.sleep`` in an async handler)."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    time.sleep(float(payload.get("seconds", 0)))  # noqa: ASYNC251 -- the point: it blocks the loop
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("deaf", queue="work", timeout="60s")
async def deaf(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record its start, make its process ignore SIGTERM and SIGINT, then sleep ``payload["seconds"]``."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("leak_sync", queue="work", timeout="1s")
def leak_sync(payload: dict[str, Any], ctx: JobContext) -> None:
    """A plain function that leaves a non-daemon thread (``app-poller``) running ``payload["seconds"]``, then
    ends as ``payload["end"]`` says: ``return``, ``raise`` (ValueError) or ``timeout`` (sleeps past its 1 s:
    ``payload["overrun"]`` seconds in all, 3 unless given)."""
    import threading

    threading.Thread(target=time.sleep, args=(float(payload.get("seconds", 0)),), name="app-poller").start()
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    if payload.get("end") == "raise":
        raise ValueError("left a thread, then failed")
    if payload.get("end") == "timeout":
        time.sleep(float(payload.get("overrun", 3)))
