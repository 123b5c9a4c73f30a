"""A job app for the poison-containment tests: jobs that exit the worker, block its loop, or just run.

Settings come from the environment: ``POISON_TOPOLOGY`` (topology file) and
``POISON_RECORD`` (a file each run appends ``start <id> <pid> <redelivered> <attempt>`` and
``done <id> <pid>`` lines to, fsynced, so a line written before ``os._exit`` is kept), and
``POISON_LEDGER`` (the SQLite ledger of the idempotent job :func:`once`, with its ``effects`` table).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel, field_validator

from amqpjobs import App, JobContext, Reject, SqliteLedger

ledger = SqliteLedger(os.environ["POISON_LEDGER"]) if "POISON_LEDGER" in os.environ else None
app = App("poisonapp", topology=os.environ.get("POISON_TOPOLOGY", "topology"), ledger=ledger)


def _record(line: str) -> None:
    with open(os.environ["POISON_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@app.job("poison", queue="work", timeout="60s")
async def poison(payload: dict[str, Any], ctx: JobContext) -> None:
    """``payload["kind"]``: ``exit`` kills the worker, ``block`` blocks the loop ``seconds``, else sleeps.

    ``fail`` sleeps ``seconds``, then raises a RuntimeError ``size`` characters long, ``depth`` frames deep.
    ``sysexit`` raises ``SystemExit(3)``, ``interrupt`` raises ``KeyboardInterrupt`` (the handler's own raise).
    ``reject`` sleeps ``seconds``, then raises :class:`~amqpjobs.Reject` (quarantined at once, reason ``rejected``).
    ``hang`` waits for its worker to be killed (by the test) on its first start, exits it at once on a later one.
    """
    _record(f"start {ctx.job_id} {os.getpid()} {int(ctx.redelivered)} {ctx.attempt}")
    kind = payload.get("kind")
    if kind == "hang" and not ctx.redelivered:
        await asyncio.sleep(50)
    if kind in ("exit", "hang"):
        os._exit(1)
    if kind == "reject":
        await asyncio.sleep(float(payload.get("seconds", 0)))
        raise Reject("rejected on purpose")
    _raise_if_asked(kind)
    if kind == "fail":  # fails after ``seconds``, ``depth`` frames deep, with an error ``size`` characters long
        await asyncio.sleep(float(payload.get("seconds", 0)))
        _fail(int(payload.get("depth", 0)), "x" * int(payload.get("size", 10)))
    if kind == "block":
        time.sleep(float(payload["seconds"]))  # noqa: ASYNC251 - blocking an async handler is the fault under test
    else:
        await asyncio.sleep(float(payload.get("seconds", 0)))
    _record(f"done {ctx.job_id} {os.getpid()}")


def _fail(depth: int, message: str) -> None:
    if depth > 0:
        _fail(depth - 1, message)
    raise RuntimeError(message)


def _raise_if_asked(kind: object) -> None:
    if kind == "sysexit":
        raise SystemExit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt


@app.job("poison_thread", queue="work", timeout="60s")
def poison_thread(payload: dict[str, Any], ctx: JobContext) -> None:
    """A plain-function handler (it runs in a thread): ``sysexit`` / ``interrupt`` as :func:`poison`."""
    _record(f"start {ctx.job_id} {os.getpid()} {int(ctx.redelivered)}")
    _raise_if_asked(payload.get("kind"))
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("once", queue="work", timeout="60s", idempotent=True)
def once(payload: dict[str, Any], ctx: JobContext) -> None:
    """An idempotent job: fails its first attempt, then writes its effect with its done-mark (``ctx.transaction()``)."""
    _record(f"start {ctx.job_id} {os.getpid()} {int(ctx.redelivered)} {ctx.attempt}")
    if ctx.attempt == 1:
        time.sleep(float(payload.get("seconds", 0)))
        raise RuntimeError("first attempt fails on purpose")
    with ctx.transaction() as db:
        db.execute("INSERT INTO effects (job_id, pid) VALUES (?, ?)", (ctx.job_id, os.getpid()))
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("hang_thread", queue="work", timeout="1s")
def hang_thread(payload: dict[str, Any], ctx: JobContext) -> None:
    """A plain-function handler that never ends in time (a thread can't be stopped): its process's end stops it."""
    _record(f"start {ctx.job_id} {os.getpid()} {int(ctx.redelivered)} {ctx.attempt}")
    time.sleep(600)


class Checked(BaseModel):
    """A payload whose validation (app code, run before the handler) kills the worker when ``kill`` is true."""

    kill: bool = False

    @field_validator("kill")
    @classmethod
    def _check(cls, kill: bool) -> bool:
        _record(f"validate - {os.getpid()}")
        if kill:
            os._exit(1)
        return kill


@app.job("checked", queue="work", payload=Checked, timeout="60s")
async def checked(payload: Checked, ctx: JobContext) -> None:
    """Runs only for a payload that passed its validation."""
    _record(f"start {ctx.job_id} {os.getpid()} {int(ctx.redelivered)} {ctx.attempt}")
    _record(f"done {ctx.job_id} {os.getpid()}")
