"""Deploy-time topology operations: plan, apply, export (``amqpjobs topology ...``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from amqpjobs.errors import BrokerError, BrokerUnavailableError, ManagementApiError, TopologyConflictError
from amqpjobs.printable import shell_quote
from amqpjobs.runtime.policy_checks import planned_effects
from amqpjobs.topology.declarations import BindingDecl, Declarations
from amqpjobs.topology.holding_queues import note_for_vhost
from amqpjobs.topology.loader import LoadedTopology, load_topology
from amqpjobs.topology.naming import shards_exchange_name
from amqpjobs.topology.orphans import orphan_fixes, orphan_queues
from amqpjobs.topology.plan import ObjectState, Plan, binding_name, make_plan
from amqpjobs.topology.policy_effects import PolicyEffect
from amqpjobs.topology.versions import KHEPRI_ONLY_SINCE, raft_majority_refusal
from amqpjobs.wire.arguments import desired_state
from amqpjobs.wire.connection import connect
from amqpjobs.wire.declare import declare, probe_queues, unbind
from amqpjobs.wire.definitions import export_definitions
from amqpjobs.wire.management import ManagementClient, delete_exchange_command
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.topology")


@dataclass(frozen=True)
class PlanResult:
    """A plan and the topology it was made for.

    Attributes:
        loaded: The validated topology (with warnings).
        plan: Desired vs live.
        broker_version: The broker's version, e.g. ``(3, 10, 8)``.
        orphans: Live queues named like a job queue's shards or tiers that the topology no
            longer declares (e.g. after lowering ``shards``), with their message counts:
            no worker consumes them, so their messages would wait for ever.
        stray_bindings: Live bindings from a ``<name>.shards`` exchange the topology declares
            (ours: we own its bindings) to a queue it no longer binds, e.g. shards left
            after lowering ``shards``: the broker would keep routing jobs there; apply
            removes them.
        routing_notes: Warnings about a change of ``shard_routing`` on an applied job queue.
        orphan_exchanges: Live ``<name>.shards`` exchanges of a job queue whose topology no
            longer routes by modulus-hash, with their binding counts.
        no_majority: RabbitMQ 4.3+: why ``topology apply`` would be refused now (no Raft
            majority, :func:`require_majority`), else ``""``.
        settings: The broker planned against (the commands the report names use its
            management API and vhost).
        policy_effects: Queues of the topology whose policies (live, or matching once
            declared) change what the topology declared (:mod:`amqpjobs.topology.policy_effects`).

    """

    loaded: LoadedTopology
    plan: Plan
    broker_version: tuple[int, ...]
    orphans: tuple[tuple[str, int], ...] = ()
    stray_bindings: tuple[BindingDecl, ...] = ()
    routing_notes: tuple[str, ...] = ()
    orphan_exchanges: tuple[tuple[str, int], ...] = ()
    no_majority: str = ""
    settings: BrokerSettings | None = None
    policy_effects: tuple[PolicyEffect, ...] = ()

    @property
    def policy_loses(self) -> bool:
        """Whether a policy on a queue of the topology can lose jobs (``topology plan`` exits 1)."""
        return any(e.loses for e in self.policy_effects)

    def policy_report(self) -> list[str]:
        """One ``POLICY`` line per queue (then exchange) whose policies change what the topology declared."""
        return [f"POLICY    {e.kind:<8} {e}" for e in self.policy_effects]

    def plan_report(self) -> str:
        """:meth:`~amqpjobs.topology.plan.Plan.report`, its summary also counting the bindings to remove."""
        text = self.plan.report()
        if not self.stray_bindings:
            return text
        head, _, summary = text.rpartition("\n")
        create, sep, rest = summary.partition(" to create, ")
        summary = f"{create}{sep}{len(self.stray_bindings)} binding(s) to remove, {rest}" if sep else summary
        return f"{head}\n{summary}" if head else summary

    def removal_report(self, done: bool = False) -> list[str]:
        """One line per stray binding: ``remove`` (plan) or ``removed`` (apply, ``done``)."""
        verb = "removed" if done else "remove"
        why = "" if done else ": not in the topology; apply removes it (jobs routed there reach no worker)"
        return [
            f"{verb:<9} binding  {binding_name(b.source, b.destination, b.routing_key)}{why}"
            for b in self.stray_bindings
        ]

    def orphan_report(self) -> list[str]:
        """One line per orphaned exchange and queue, with what to do."""
        return [
            f"ORPHAN    exchange {name} ({bound} binding(s)): shard_routing is no longer modulus-hash, but the "
            "broker still routes what is published to it, by its own hash, so a publisher still using it splits "
            "tenants between shards; move publishers to the job queue's exchange (crc32 routing keys), then "
            f"delete it: {delete_exchange_command(self.settings, name) if self.settings else name}"
            for name, bound in self.orphan_exchanges
        ] + [
            f"ORPHAN    queue    {name} ({messages} message(s)): no longer in the topology and no worker consumes "
            f"it; {fix}"
            for (name, messages), fix in zip(
                self.orphans, orphan_fixes(self.loaded.topology.layouts(), self.orphans), strict=True
            )
        ]

    def apply_report(self, safe_url: str) -> list[str]:
        """The lines ``topology apply`` prints: each object created, then the totals on ``safe_url``."""
        created = self.plan.creates
        lines = [f"created   {item.desired.kind:<8} {item.desired.name}" for item in created]
        lines += self.removal_report(done=True)
        kept = [i for i in self.plan.items if i.note]
        lines += [f"kept      {i.desired.kind:<8} {i.desired.name}\n            note: {i.note}" for i in kept]
        unchanged = self.plan.counts()["unchanged"]
        removed = f"{len(self.stray_bindings)} binding(s) removed, " if self.stray_bindings else ""
        if created or removed:
            lines.append(f"applied to {safe_url}: {len(created)} created, {removed}{unchanged} unchanged")
        else:
            lines.append(f"nothing to create on {safe_url}: all {unchanged} objects unchanged")
        return lines


async def plan_topology(path: str | Path, settings: BrokerSettings, *, check_majority: bool = True) -> PlanResult:
    """Validate the topology at ``path`` for the connected broker and compare it with the live vhost.

    Arguments and types come from the management API; the depth of each conflicting
    queue (for the remedy) from a passive declare on a throwaway channel, since the
    management API's counts lag by its statistics interval. Nothing is declared.
    ``check_majority``: also say whether apply would be refused now (:func:`require_majority`;
    False where the caller has just required it, as :func:`apply_topology` does).

    Raises:
        TopologyValidationError: the files are invalid.
        BrokerUnavailableError, ManagementApiError: the management API failed, or the
            vhost does not exist.

    """
    version, loaded, live, raw_bindings, effects = await asyncio.to_thread(_read_live, path, settings)  # httpx blocks
    desired = [replace(o, legacy=(o.legacy[0], note_for_vhost(o.legacy[1], settings.vhost))) if o.legacy else o
               for o in desired_state(loaded.topology.declarations())]  # fmt: skip
    plan = make_plan(desired, live)
    conflicting = [i.desired.name for i in plan.conflicts if i.desired.kind == "queue"]
    if conflicting:
        depths = {name: p.messages for name, p in (await probe_queues(settings, conflicting)).items()}
        live = [replace(o, messages=depths.get(o.name, o.messages)) if o.kind == "queue" else o for o in live]
        plan = make_plan(desired, live)
    stray = orphan_queues(loaded.topology.layouts(), [o.name for o in live if o.kind == "queue"])
    orphans: tuple[tuple[str, int], ...] = ()
    if stray:
        probes = await probe_queues(settings, stray)
        orphans = tuple((n, probes[n].messages) for n in sorted(probes))
    no_majority = ""
    try:
        if check_majority:
            await asyncio.to_thread(require_majority, settings, "topology apply")
    except (BrokerUnavailableError, ManagementApiError) as exc:
        log.debug("cluster majority not checked (management API: %s)", exc)
    except BrokerError as exc:
        no_majority = f"{exc}: apply would fail now"
    live_names = {o.name for o in live if o.kind == "exchange"}
    notes, left = _routing_changes(loaded, live_names, {o.name for o in live if o.kind == "queue"}, raw_bindings)
    return PlanResult(
        loaded, plan, version, orphans, _stray_bindings(loaded, raw_bindings), notes, left, no_majority, settings,
        tuple(effects),
    )  # fmt: skip


def _read_live(
    path: str | Path, settings: BrokerSettings
) -> tuple[tuple[int, ...], LoadedTopology, list[ObjectState], list[dict[str, Any]], list[PolicyEffect]]:
    """The broker's version, the topology validated for it, the vhost's objects and bindings (management API).

    And what the vhost's policies do to the topology's queues (:func:`.policy_checks.planned_effects`).

    The file's own problems are found first, without the broker: a broker away hides none.
    """
    load_topology(path)
    with ManagementClient(settings) as mgmt:
        version = mgmt.broker_version()
        loaded = load_topology(path, broker_version=version, exchange_types=mgmt.exchange_types())
        try:
            live = mgmt.live_state(settings.vhost)
        except ManagementApiError as exc:
            if exc.status == 404:
                raise ManagementApiError(
                    f"vhost {settings.vhost!r} does not exist on the broker: create it first "
                    f"(rabbitmqctl add_vhost {shell_quote(settings.vhost)}) or fix the URL's path",
                    404,
                ) from exc
            raise
        effects = planned_effects(mgmt, settings.vhost, desired_state(loaded.topology.declarations()), version)
        return version, loaded, live, mgmt.bindings(settings.vhost), effects


def _routing_changes(
    loaded: LoadedTopology, exchanges: set[str], queues: set[str], bindings: list[dict[str, Any]]
) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """Warnings for job queues switching to modulus-hash, and ``.shards`` exchanges left by switching away.

    A switch to modulus-hash is told by what routes now: an applied sharded job queue whose
    ``<name>.shards`` is missing or bound to none of its shards (a leftover exchange routes
    nothing: publishers used crc32).
    """
    notes: list[str] = []
    left: list[tuple[str, int]] = []
    for lay in loaded.topology.layouts():
        name = shards_exchange_name(lay.name)
        applied = any(q in queues for q in lay.work_queues) and len(lay.work_queues) > 1
        # what routes now: a <name>.shards bound to none of the shards (missing, or left from an earlier
        # modulus-hash time with its bindings gone) routes nothing, so publishers pick by crc32
        routing = any(b["source"] == name and b["destination"] in lay.work_queues for b in bindings)
        if lay.shards_exchange is not None and not routing and applied:
            notes.append(
                f"{lay.name}: shard_routing changes from crc32 to modulus-hash: most tenants move to another shard, "
                "so a tenant's jobs already queued may run alongside or after its new ones (per-tenant order "
                "breaks for jobs in flight); apply when its shards are drained, or accept that"
            )
        if lay.shards_exchange is None and name in exchanges:
            left.append((name, sum(1 for b in bindings if b["source"] == name)))
    return tuple(notes), tuple(left)


def _stray_bindings(loaded: LoadedTopology, live: list[dict[str, Any]]) -> tuple[BindingDecl, ...]:
    """Live bindings from a ``<name>.shards`` exchange the topology declares that it does not declare."""
    declarations = loaded.topology.declarations()
    ours = {e.name for e in declarations.exchanges} & {shards_exchange_name(j.name) for j in loaded.topology.job_queues}
    wanted = {(b.source, b.destination, b.destination_type, b.routing_key) for b in declarations.bindings}
    stray = []
    for b in live:
        key = (b["source"], b["destination"], b["destination_type"], b["routing_key"])
        if b["source"] in ours and key not in wanted:
            stray.append(
                BindingDecl(
                    source=b["source"],
                    destination=b["destination"],
                    destination_type=b["destination_type"],
                    routing_key=b["routing_key"],
                )
            )
    return tuple(stray)


def require_majority(settings: BrokerSettings, what: str, timeout: float = 10.0) -> None:
    """Refuse ``what`` (e.g. "topology apply") at once when the cluster has no Raft majority (RabbitMQ 4.3+).

    Asks the management API (``timeout`` seconds per request) which cluster nodes run (see
    :func:`~amqpjobs.topology.versions.raft_majority_refusal`): on a node in a minority every
    declaration would block until the node gives up (about 30 s), so say why now. A user the
    API does not let list nodes (``GET /api/nodes`` needs the ``monitoring`` tag) is not
    checked: the declarations' own bound still ends a minority's wait with a clear error.

    Raises:
        BrokerError: fewer than a majority of the cluster's nodes run; the message names
            them and the fix.
        BrokerUnavailableError, ManagementApiError: the management API failed.

    """
    with ManagementClient(settings, timeout=timeout) as mgmt:
        version = mgmt.broker_version()
        if version < KHEPRI_ONLY_SINCE:
            return  # Mnesia lets a minority declare: nothing to ask
        try:
            running = mgmt.running_nodes()
        except ManagementApiError as exc:
            if exc.status not in (401, 403):
                raise
            # listing nodes needs the "monitoring" tag: without it, the declarations' own bound still applies
            log.debug("cluster majority not checked: user %r may not list nodes (%s)", settings.username, exc.status)
            return
        refusal = raft_majority_refusal(version, running)
    if refusal is not None:
        raise BrokerError(f"{what} on {settings.safe_url}: {refusal}")


async def require_majority_at_start(settings: BrokerSettings) -> None:
    """:func:`require_majority` for a worker's start-up: exit at once, not after a 30 s consume timeout.

    Best effort: a management API that can't be reached is no reason to refuse (the
    declarations' own bound, :data:`~amqpjobs.wire.declare.DECLARE_TIMEOUT`, still ends a
    start-up on a minority with a clear error).

    Raises:
        BrokerError: fewer than a majority of the cluster's nodes run (RabbitMQ 4.3+).

    """
    try:
        await asyncio.to_thread(require_majority, settings, "worker start-up", 5.0)
    except (BrokerUnavailableError, ManagementApiError) as exc:
        log.debug("cluster majority not checked (management API: %s)", exc)


async def apply_topology(
    path: str | Path, settings: BrokerSettings, declare_timeout: float | None = None
) -> PlanResult:
    """Declare the topology at ``path``, unless any live object conflicts with it.

    Runs :func:`plan_topology` first; with any conflict nothing at all is declared, so
    the broker never gets to close our channel with ``PRECONDITION_FAILED`` mid-apply.
    A second apply of the same topology finds everything unchanged and declares nothing.

    Args:
        path: Topology file or folder.
        settings: The broker.
        declare_timeout: Seconds the declarations may take (None: 30 s,
            :data:`~amqpjobs.wire.declare.DECLARE_TIMEOUT`): on RabbitMQ 4.3 a node in a
            minority never answers them (Khepri).

    Returns:
        The plan that was carried out (its ``creates`` are what was created).

    Raises:
        TopologyValidationError: the files are invalid (nothing declared; found before the
            broker is asked, but for rules of its version).
        TopologyConflictError: live objects differ (nothing declared); ``report`` names
            each differing argument with both values and the remedy.
        BrokerUnavailableError, ManagementApiError: the broker could not be reached.
        BrokerError: the declarations got no answer within ``declare_timeout``, or (RabbitMQ
            4.3+) fewer than a majority of the cluster's nodes run (:func:`require_majority`:
            refused before planning, even when nothing would be created).

    """
    await asyncio.to_thread(load_topology, path)  # the file's own problems first, as plan_topology finds them
    await asyncio.to_thread(require_majority, settings, "topology apply")
    result = await plan_topology(path, settings, check_majority=False)
    if result.plan.conflicts:
        raise TopologyConflictError(result.plan.report())
    if not result.plan.creates and not result.stray_bindings:
        return result
    connection = await connect(settings)
    try:
        if result.plan.creates:
            await declare(connection, _to_declare(result), declare_timeout, settings.safe_url)
        if result.stray_bindings:
            await unbind(connection, result.stray_bindings, declare_timeout, settings.safe_url)
    finally:
        with contextlib.suppress(TimeoutError):  # a node in a minority may not answer the close either
            await asyncio.wait_for(connection.close(), 5)
    return result


def _to_declare(result: PlanResult) -> Declarations:
    """The topology's declarations but the queues found in their legacy shape (``PlanItem.note``): left as is."""
    declarations = result.loaded.topology.declarations()
    kept = {i.desired.name for i in result.plan.items if i.note and i.desired.kind == "queue"}
    if not kept:
        return declarations
    return declarations.model_copy(update={"queues": tuple(q for q in declarations.queues if q.name not in kept)})


def export_topology(path: str | Path, vhost: str = "/") -> dict[str, Any]:
    """Definitions JSON for the topology at ``path``, every object in ``vhost``.

    Raises:
        TopologyValidationError: the files are invalid.

    """
    loaded = load_topology(path)
    return export_definitions(loaded.topology.declarations(), vhost)
