"""The first connect's turn over a cluster's nodes, and the bounds of each attempt (for ``wire/connection.py``).

A failed node goes to the back and is tried again after a round; a node refused for good
(its TLS certificate, a scheme/port mismatch) leaves the turn. Tenacity's policies (pause,
stop, the line per failed attempt) read the turn's state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tenacity import RetryCallState

from amqpjobs.wire.cluster import Node
from amqpjobs.wire.failover_lines import DownSpell

log = logging.getLogger("amqpjobs.wire")

#: Seconds one connect attempt (TCP, TLS, the AMQP handshake) may take at most: RabbitMQ's own
#: ``handshake_timeout`` (RabbitMQ "Networking" -> "Handshake timeout": 10 s). A node that accepts the
#: connection and never answers (half-dead, or traffic dropped on the way) then counts as unreachable,
#: and reconnects of a robust connection are bounded the same way.
ATTEMPT_TIMEOUT = 10.0
#: Seconds a connect attempt may take at least, even with less of the connect timeout left.
ATTEMPT_FLOOR = 2.0


class NodeRefused(Exception):
    """A node refused for good (its TLS certificate, or a scheme/port mismatch): not tried again."""


class Rotation:
    """The nodes still to try, in order: a failed node goes to the back, a refused one leaves the list.

    Attributes:
        nodes: Every node (what a connection's reconnects go round).
        left: Indexes into ``nodes`` of those still tried.
        pos: Position in ``left`` of the node to try next.
        rounds: How many times ``pos`` went back to the start (a round: each node tried once).
        refusals: Why each refused node was refused (for the final error).
        tried: The node of the last attempt.

    """

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.left = list(range(len(nodes)))
        self.pos = 0
        self.rounds = 0
        self.refusals: list[str] = []
        self.tried = nodes[0]

    @property
    def at(self) -> int:
        """Index into ``nodes`` of the node to try next."""
        return self.left[self.pos]

    def _wrap(self) -> None:
        if self.pos >= len(self.left):
            self.pos = 0
            self.rounds += 1

    def failed(self) -> None:
        """The node at ``pos`` failed (it may answer later): go on to the next."""
        self.pos += 1
        self._wrap()

    def refuse(self, why: str) -> None:
        """The node at ``pos`` is refused for good because of ``why``."""
        self.refusals.append(why)
        del self.left[self.pos]
        if self.left:
            self._wrap()


def pause_policy(rotation: Rotation, deadline: float) -> Callable[[RetryCallState], float]:
    """Tenacity's ``wait``: none before the next node of a round, else 0.2 s doubling up to 2 s.

    A round is one attempt at each node left; no pause reaches past ``deadline`` (the last
    attempt is at it).
    """

    def pause(state: RetryCallState) -> float:
        if rotation.pos or not rotation.rounds:
            return 0.0
        backoff: float = min(2.0, 0.2 * 2.0 ** (rotation.rounds - 1))
        return max(0.0, min(backoff, deadline - time.monotonic()))

    return pause


def stop_policy(rotation: Rotation, deadline: float) -> Callable[[RetryCallState], bool]:
    """Tenacity's ``stop``: at ``deadline``, once every node was tried (a 0 s timeout tries each once)."""

    def stop(state: RetryCallState) -> bool:
        return rotation.rounds >= 1 and time.monotonic() >= deadline

    return stop


def attempt_line(rotation: Rotation, wait: float, started: float) -> Callable[[RetryCallState], None]:
    """Tenacity's ``before_sleep``: a failed attempt's WARNING line of ours, naming the node, paced as a reconnect's.

    Each node's failures are said by the down-node rule (:class:`~amqpjobs.wire.failover_lines.DownSpell`, the
    reconnects' rule too): the first at once, then at most one a minute while it lasts (before, a line per
    attempt: 30-odd in a worker's 30 s connect timeout). A node refused for good is said once, at once.
    """
    spells: dict[str, DownSpell] = {}  # node -> its failures, said by the down-node rule

    def line(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        tried, after = rotation.tried, rotation.nodes[rotation.at]
        following = "retrying" if after is tried else f"trying {after.safe_url}"
        if isinstance(exc, NodeRefused):
            log.warning("%s (not tried again); %s in %.1fs", exc, following, pause)
            return
        again = spells.setdefault(tried.safe_url, DownSpell()).failed(time.monotonic())
        if again is None:
            return
        log.warning(
            "broker at %s not reachable (attempt %d, %.1fs of the %gs connect timeout): %s: %s; %s in %.1fs%s",
            tried.safe_url, state.attempt_number, time.monotonic() - started, wait,
            type(exc).__name__, exc, following, pause, again,
        )  # fmt: skip

    return line


def attempt_timeout(left: float) -> float:
    """Seconds one connect attempt may take with ``left`` seconds of the connect timeout left.

    :data:`ATTEMPT_TIMEOUT` at most, :data:`ATTEMPT_FLOOR` at least (a loaded machine's
    handshake takes a while), else what is left.
    """
    return max(ATTEMPT_FLOOR, min(ATTEMPT_TIMEOUT, left))


def every_node_refused(refusals: list[str]) -> str:
    """The error when every node was refused for good: each refusal."""
    if len(refusals) == 1:
        return refusals[0]
    return f"each of the {len(refusals)} nodes refused: " + "; ".join(refusals)
