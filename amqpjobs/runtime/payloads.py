"""Large payloads by reference (claim-check): the payload store protocol and its rules.

With ``App(payload_store=...)``, ``enqueue`` keeps a payload whose JSON body is larger than
the store's ``threshold`` in the store and publishes the message with an empty body and the
header ``amqpjobs-payload-ref: "<store>:<key>"`` (:mod:`amqpjobs.jobs.payload_refs`). A
worker loads it before the handler; every copy (retry tiers, quarantine, parked, replayed)
keeps the header, so they all name the one stored payload.

Deletion never depends on one process staying alive (README "Large payloads"):

* a job that succeeded (acked, or a duplicate the ledger knew) gets a *done mark* stored
  with its payload: the time of the success;
* every worker of an app with a store sweeps every ``sweep_every``: it deletes the payloads
  whose done mark is older than ``grace`` (so a redelivery after a lost ack still finds it);
* a job quarantined by the worker has its done mark removed (a copy that waits in quarantine,
  or later parked, keeps its payload however long it waits);
* purging quarantined or parked messages with the app's store (``quarantine purge --app``)
  gives their payloads a done mark (deleted after the grace), except a payload another
  message left in that quarantine queue or its parked queue still names (kept, unmarked).

A store implements the storage primitives of :class:`PayloadStore`; the stores are
:class:`~amqpjobs.runtime.payloads_file.FilePayloadStore`,
:class:`~amqpjobs.runtime.payloads_postgres.PostgresPayloadStore` and
:class:`~amqpjobs.runtime.payloads_s3.S3PayloadStore`. Nothing here is imported by an app
without a store.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Final, TypedDict

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ConfigurationError, PayloadStoreError
from amqpjobs.jobs.envelope import PAYLOAD_REF, DecodeError, OutgoingMessage, decode_body
from amqpjobs.jobs.outcome import Ack, Decision, Duplicate, Quarantine, Skip
from amqpjobs.jobs.payload_refs import REASONS, PayloadRef, PayloadRefError, parse_ref, store_name_problem
from amqpjobs.text import a_type

log = logging.getLogger("amqpjobs.payloads")

#: Bodies larger than this (bytes) go to the store by default: 256 KiB.
DEFAULT_THRESHOLD: Final = 256 * 1024
#: Seconds a worker waits for the store to read a payload or set a mark: a store that hangs must
#: not hold a delivery's slot for ever (a read that times out is a ``payload-store-error``).
STORE_TIMEOUT: Final = 30.0


class StoreOptions(TypedDict, total=False):
    """The options every store takes (see :class:`PayloadStore`)."""

    name: str | None
    threshold: int
    grace: float | str
    sweep_every: float | str


class PayloadStore(abc.ABC):
    """Where large payloads are kept (base class; see the module docstring for the rules).

    Args:
        name: The store's name in references (default the kind: ``file``, ``postgres``,
            ``s3``); producers and workers of an app must use the same. 1-63 characters
            ``[a-z0-9-]``, starting with a letter.
        threshold: Bodies (UTF-8 JSON) larger than this many bytes are stored (default 256 KiB).
        grace: How long a payload is kept after its job succeeded, seconds or a duration
            string (default ``"1h"``): a redelivery after a lost ack still finds it.
        sweep_every: How often each worker deletes the payloads past their grace (seconds or
            duration, default ``"1m"``).

    Raises:
        ConfigurationError: a bad name or threshold; ``grace`` or ``sweep_every`` not a positive,
            finite duration (0 is refused: a grace of 0 would delete a payload a redelivery
            after a lost ack still needs, a sweep every 0 s would never rest).

    """

    kind: ClassVar[str] = "store"

    def __init__(
        self,
        *,
        name: str | None = None,
        threshold: int = DEFAULT_THRESHOLD,
        grace: float | str = "1h",
        sweep_every: float | str = "1m",
    ) -> None:
        self.name = self.kind if name is None else name
        if problem := store_name_problem(self.name):
            raise ConfigurationError(problem)
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigurationError(f"payload store threshold must be an int of bytes >= 0 (got {threshold!r})")
        self.threshold = threshold
        self.grace = duration_argument(f"payload store {self.name!r}: grace", grace)
        self.sweep_every = duration_argument(f"payload store {self.name!r}: sweep_every", sweep_every)
        self.retention = self.grace  # what the worker's sweep (amqpjobs.runtime.pruning.keep_pruned) reads

    # ------------------------------------------------------------------ storage primitives
    def copy(self) -> PayloadStore:
        """The same store (same options, same data) with connections of its own, for another event loop."""
        twin = copy.copy(self)
        twin._fresh()
        return twin

    def _fresh(self) -> None:  # noqa: B027 - optional hook
        """Forget this object's connections (on a :meth:`copy`); a store with connections overrides it."""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect (and create the table/bucket layout when missing); called before first use."""

    async def marks_problem(self) -> str | None:
        """Why this store can't take a done mark or delete a payload (said at a worker's start), or None."""
        return None

    @abc.abstractmethod
    async def write(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (a new key: :meth:`put` makes them)."""

    @abc.abstractmethod
    async def read(self, key: str) -> bytes | None:
        """The payload under ``key``, or None when there is none."""

    @abc.abstractmethod
    async def mark_done(self, key: str, at: float) -> bool:
        """Record that ``key``'s job succeeded at ``at`` (seconds since the epoch); nothing if it is gone.

        Returns:
            True when the mark was written, False when there is no payload under ``key`` (nothing written).
        """

    @abc.abstractmethod
    async def unmark(self, key: str) -> None:
        """Remove ``key``'s done mark (a copy waits in quarantine); nothing if there is none."""

    @abc.abstractmethod
    async def remove(self, key: str) -> None:
        """Delete ``key``'s payload and mark; nothing if it is gone."""

    @abc.abstractmethod
    async def prune(self, older_than: float) -> int:
        """Delete the payloads whose done mark is more than ``older_than`` seconds old; returns how many."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Close connections."""

    # ------------------------------------------------------------------ the rules
    async def put(self, data: bytes) -> PayloadRef:
        """Store ``data`` under a new key (a UUID); returns its reference.

        Raises:
            PayloadStoreError: the store failed (nothing stored).
        """
        ref = PayloadRef(self.name, uuid.uuid4().hex)
        try:
            await self.open()
            await self.write(ref.key, data)
        except Exception as exc:
            raise PayloadStoreError(f"payload store {self.name!r} could not store a payload: {_what(exc)}") from exc
        return ref

    async def get(self, ref: PayloadRef, quarantine: str = "QUEUE") -> bytes:
        """The payload ``ref`` names; ``quarantine``: the queue whose purge a ``payload-missing`` error names.

        Raises:
            PayloadRefError: ``payload-store-unknown`` (another store's reference),
                ``payload-missing`` or ``payload-store-error``.
        """
        if ref.store != self.name:
            raise PayloadRefError(
                "payload-store-unknown",
                f"reference {str(ref)[:120]!r} names store {ref.store!r}, but this app's payload store is "
                f"{self.name!r}: give the worker's app that store (App(payload_store=...)) or replay the job "
                "to a worker that has it",
            )
        try:
            async with asyncio.timeout(STORE_TIMEOUT):
                await self.open()
                data = await self.read(ref.key)
        except Exception as exc:
            raise PayloadRefError(
                "payload-store-error", f"payload store {self.name!r} failed to read {ref.key!r}: {_what(exc)}"
            ) from exc
        if data is None:
            raise PayloadRefError(
                "payload-missing",
                # short enough for the worker's log line (its error field is cut at 300 characters)
                f"payload store {self.name!r} holds no payload {ref.key!r} (deleted {self.grace:g}s after success, "
                "purged, or never stored): enqueue the job again with its payload and drop this copy "
                f"(amqpjobs quarantine purge {quarantine} --reason payload-missing); a replay would fail the same way",
            )
        return data


def checked_store(value: object) -> PayloadStore:
    """``value`` when it is a payload store (what ``App(payload_store=...)`` was given).

    Raises:
        ConfigurationError: anything else (a path, the class itself), naming what to give.

    """
    if isinstance(value, PayloadStore):
        return value
    got = (
        f"the class {value.__name__} itself: create one, {value.__name__}(...)"
        if isinstance(value, type)
        else a_type(value)
    )
    raise ConfigurationError(
        f"App(payload_store=...) must be a payload store (got {got}): FilePayloadStore(...), "
        "PostgresPayloadStore(...) or S3PayloadStore(...) from amqpjobs, e.g. "
        "App(..., payload_store=FilePayloadStore('/mnt/shared/payloads'))"
    )


def _what(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"TimeoutError: no answer within {STORE_TIMEOUT:g}s"
    return f"{type(exc).__name__}: {exc}"[:500]


async def open_store(store: PayloadStore, then: str, *, marks: bool = False) -> None:
    """Open ``store`` (connect, create its layout) before anything that depends on it is done.

    ``then``: what is not done when it can't be opened (in words, for the message). ``marks``:
    also say (a WARNING) when the store can't take done marks (:meth:`PayloadStore.marks_problem`):
    a worker still runs its jobs then, but each success warns and no stored payload is deleted.

    Raises:
        PayloadStoreError: it could not be opened within :data:`STORE_TIMEOUT` (s), naming the
            store, why, and ``then``.
    """
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            await store.open()
    except Exception as exc:
        raise PayloadStoreError(
            f"payload store {store.name!r} can't be opened ({_what(exc)}); {then}: fix the store's settings "
            f"in App(payload_store={type(store).__name__}(...)) (directory, DSN and password, bucket) or make it "
            "reachable, then try again"
        ) from exc
    if not marks:
        return
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            problem = await store.marks_problem()
    except TimeoutError as exc:
        problem = _what(exc)
    if problem is not None:
        log.warning(
            "payload store %r can't write its done marks (%s): each job's success will warn so, and no stored "
            "payload is ever deleted; give this worker write access to the store",
            store.name,
            problem,
        )


async def check_in(store: PayloadStore, message: OutgoingMessage) -> tuple[OutgoingMessage, PayloadRef | None]:
    """Swap a body larger than ``store.threshold`` for a reference (the enqueue hook).

    Returns:
        The message to publish (body empty, header ``amqpjobs-payload-ref`` set) and the
        reference, or ``message`` unchanged and None when the body is small enough.

    Raises:
        PayloadStoreError: the store failed (nothing sent).

    """
    if len(message.body) <= store.threshold:
        return message, None
    ref = await store.put(message.body)
    return dataclasses.replace(message, body=b"", headers={**message.headers, PAYLOAD_REF: str(ref)}), ref


async def forget(store: PayloadStore, ref: PayloadRef) -> None:
    """Delete a payload whose message was not sent or was purged (best effort: a failure is logged)."""
    try:
        await store.open()
        await store.remove(ref.key)
    except Exception as exc:
        log.warning("deleting stored payload %s failed (%s); it stays until removed by hand", ref, _what(exc))


async def check_out(store: PayloadStore | None, headers: Mapping[str, Any], quarantine: str = "QUEUE") -> bytes | None:
    """The stored payload a received message names, or None when it carries none.

    ``quarantine``: the queue a missing payload's copy will wait in, for the purge its error names.

    Raises:
        PayloadRefError: the reference is malformed, names another store (or the app has
            none), or the payload is missing or can't be read (quarantine reasons, :data:`REASONS`).
    """
    if PAYLOAD_REF not in headers:
        return None
    ref = parse_ref(headers[PAYLOAD_REF])
    if store is None:
        raise PayloadRefError(
            "payload-store-unknown",
            f"the message's payload is kept in store {ref.store!r} ({str(ref)[:120]!r}), but this app has no "
            "payload store: give it one (App(payload_store=...)) and replay the job",
        )
    return await store.get(ref, quarantine)


async def after_outcome(
    store: PayloadStore | None, headers: Mapping[str, Any], decision: Decision, acked: bool
) -> None:
    """Keep the stored payload's deletion rule after a delivery was settled (best effort; failures logged).

    A success (acked :class:`Ack` or :class:`Duplicate`), or a run skipped for good (:class:`Skip`),
    gets its done mark; a job quarantined
    for its own failure (not a payload problem) loses it, so the copy in quarantine keeps its
    payload. Anything else (a retry, a hand-back) changes nothing.
    """
    if store is None or PAYLOAD_REF not in headers:
        return
    done = isinstance(decision, Ack | Duplicate | Skip) and acked
    kept = isinstance(decision, Quarantine) and decision.reason not in REASONS
    if not (done or kept):
        return
    try:
        ref = parse_ref(headers[PAYLOAD_REF])
    except PayloadRefError:
        return
    if ref.store != store.name:
        return
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            await store.open()
            if done:
                await store.mark_done(ref.key, time.time())
            else:
                await store.unmark(ref.key)
    except Exception as exc:
        what = "marking stored payload %s done" if done else "keeping stored payload %s for quarantine"
        log.warning(what + " failed (%s)", ref, _what(exc))


def stored_label(headers: Mapping[str, Any]) -> str:
    """How messages name the stored payload a message's headers refer to: ``stored payload 'file:k'``."""
    try:
        shown = str(parse_ref(headers[PAYLOAD_REF]))
    except PayloadRefError:
        shown = "(malformed reference)"
    return f"stored payload {shown!r}"


async def peek(
    store: PayloadStore | None, headers: Mapping[str, Any], content_type: str | None, content_encoding: str | None
) -> tuple[dict[str, Any] | None, str]:
    """The stored payload a (quarantined) message names, decoded, for showing: (payload or None, problem or "").

    Decoded by the worker's rule (:func:`~amqpjobs.jobs.envelope.decode_body`, the message's
    ``content_type`` / ``content_encoding``). Never raises: a missing payload, a bad reference, a
    failing store or a payload that is not a JSON object is the problem text
    (``"<quarantine reason>: <what was wrong>"``). ``(None, "")``: the message names none.
    """
    try:
        data = await check_out(store, headers)
        if data is None:
            return None, ""
        return decode_body(data, content_type, content_encoding, stored_label(headers)), ""
    except (PayloadRefError, DecodeError) as exc:
        return None, str(exc)


def referenced(store: PayloadStore, headers: Mapping[str, Any]) -> PayloadRef | None:
    """The reference to one of ``store``'s payloads that a message's headers carry, or None."""
    if PAYLOAD_REF not in headers:
        return None
    try:
        ref = parse_ref(headers[PAYLOAD_REF])
    except PayloadRefError:
        return None
    return ref if ref.store == store.name else None


async def retire(store: PayloadStore, ref: PayloadRef) -> bool | None:
    """Give the payload of a purged message its done mark: the sweep deletes it after the grace (best effort).

    Not deleted at once: another copy may still name it (a forged or duplicated quarantine
    copy, a copy a killed replay left in the work queue). Within the grace a worker that
    quarantines such a copy removes the mark again, and one that runs it re-marks it.
    Returns True when it is marked, None when it was gone already (nothing to mark), False
    when the store failed (logged; the payload stays).
    """
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            await store.open()
            return True if await store.mark_done(ref.key, time.time()) else None
    except Exception as exc:
        log.warning("marking purged stored payload %s for deletion failed (%s); it stays", ref, _what(exc))
        return False
