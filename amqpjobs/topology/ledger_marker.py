"""An app's ledger marker: the queue ``amqpjobs.ledger.<app>`` that says the app has had a ledger.

What it is for: :mod:`amqpjobs.runtime.ledger_origin`. It is a quorum queue holding nothing
(``x-max-length: 0``). A classic queue lives on one node, and on RabbitMQ 3.10 a classic queue
whose node is down reads as missing (``NOT_FOUND - home node ... is down or inaccessible``):
a lost ledger found meanwhile would be taken for the app's first. A quorum queue is known to
every node of the cluster, and answers a passive declare with its nodes down (measured on
scripts/cluster.sh, 3.10: with its leader down, and with two of the three nodes down). On one
node it works as any queue.

The classic marker of earlier versions stays as it is (a queue's type can't change in place)
and still marks: :meth:`~amqpjobs.topology.declarations.QueueDecl.legacy_shape`, the rule the
quarantine pair follows too.
"""

from __future__ import annotations

from amqpjobs.topology.declarations import QueueDecl
from amqpjobs.topology.naming import ledger_marker_name


def ledger_marker(app: str) -> QueueDecl:
    """The ledger marker of app ``app``: quorum, ``x-max-length`` 0, its classic shape accepted as legacy."""
    name = ledger_marker_name(app)
    return QueueDecl(name=name, role="ledger", job_queue="", queue_type="quorum", max_length=0,
                     legacy_note=legacy_note(name))  # fmt: skip


def legacy_note(marker: str) -> str:
    """What a classic marker ``marker`` (an earlier amqpjobs's) lacks, and how to make it quorum."""
    return (
        f"{marker} is classic, as amqpjobs declared it before the marker became a quorum queue; it keeps marking, "
        "but it lives on one node, and while that node is down a worker that finds its ledger new can't tell a "
        f"lost ledger from a first one (its start is refused until the node is back). {to_quorum(marker)}"
    )


def to_quorum(marker: str, vhost: str = "<vhost>") -> str:
    """How to make a classic marker ``marker`` quorum (``vhost``: for the command, quoted for a shell)."""
    return (
        f"To make it quorum: once every worker of the app has started on its ledger, delete it (`rabbitmqctl -p "
        f"{vhost} delete_queue {marker}`) and start a worker: its start declares the marker again, quorum"
    )
