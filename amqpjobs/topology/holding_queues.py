"""The quarantine and parked queues of a job queue: the job queue's own type.

Both hold jobs nobody consumes until an operator acts (``amqpjobs quarantine ...``), so they
must keep a job at least as well as its work queue does:

* of a classic job queue: classic, durable, no arguments;
* of a quorum job queue: quorum. A classic queue lives on one node (RabbitMQ 4.0 release
  notes: mirroring removed), and on 4.x confirms a persistent message before it is fsynced
  (RabbitMQ "Classic Queues" → "Persistence"; measured with ``bench/confirm_fsync.py``); a
  quorum queue is replicated and fsyncs before it confirms ("Quorum Queues" → "Data Safety").
  Its delivery limit is :data:`HOLDING_DELIVERY_LIMIT`, always sent: browsing (``basic.get``
  then return) raises ``x-delivery-count`` on 4.0–4.2, and RabbitMQ 4.0 drops a message past
  its default limit of 20 ("Quorum Queues" → "Poison Message Handling"). No dead-letter
  exchange: they are where a job ends, not a step on the way.

Queues an earlier amqpjobs declared classic for a quorum job queue stay as they are: the plan
shows them unchanged with :func:`legacy_note` instead of a conflict (a queue's type can't
change in place: RabbitMQ "Queues" → "Declaration and Property Equivalence").
"""

from __future__ import annotations

import shlex
from typing import Final

from amqpjobs.topology.declarations import QueueDecl, QueueRole, QueueType

#: ``x-delivery-limit`` of a quorum quarantine or parked queue: no practical limit. Not ``-1``:
#: that disables the limit on 4.x but on 3.10 drops the message at its first return
#: (measured on 3.10.8, 4.0.5 and 4.3.6: 2**31 - 1 kept one message through 30 returns on each).
HOLDING_DELIVERY_LIMIT: Final = 2**31 - 1


def holding_queues(job_queue: str, queue_type: QueueType, quarantine: str, parked: str) -> tuple[QueueDecl, QueueDecl]:
    """The quarantine queue and the parked queue of ``job_queue``, of the job queue's type ``queue_type``.

    Args:
        job_queue: The job queue's name.
        queue_type: Its type, ``classic`` or ``quorum``.
        quarantine: The quarantine queue's name.
        parked: The parked queue's name.

    Returns:
        (quarantine, parked) declarations; a quorum pair carries the classic shape of earlier
        versions as its accepted legacy (:attr:`QueueDecl.legacy_note`).

    """
    if queue_type == "classic":
        return (
            QueueDecl(name=quarantine, role="quarantine", job_queue=job_queue),
            QueueDecl(name=parked, role="parked", job_queue=job_queue),
        )

    def quorum(name: str, role: QueueRole) -> QueueDecl:
        note = legacy_note(name, role, quarantine, parked)
        return QueueDecl(name=name, role=role, job_queue=job_queue, queue_type="quorum",
                         delivery_limit=HOLDING_DELIVERY_LIMIT, legacy_note=note)  # fmt: skip

    return quorum(quarantine, "quarantine"), quorum(parked, "parked")


#: Stands for the vhost in a :func:`legacy_note`'s ``rabbitmqctl`` command (topology files name none).
VHOST_PLACEHOLDER: Final = "<vhost>"


def note_for_vhost(note: str, vhost: str) -> str:
    """``note`` with the vhost its ``rabbitmqctl -p`` commands act on written in, quoted for a shell where needed."""
    return note.replace(f"-p {VHOST_PLACEHOLDER} ", f"-p {shlex.quote(vhost)} ")


def legacy_note(queue: str, role: str, quarantine: str, parked: str) -> str:
    """What a classic ``role`` queue ``queue`` of a quorum job queue lacks, and how to make it quorum losing no job.

    The quarantine is emptied into the parked queue; the parked queue, once the quarantine is
    quorum, unparked into it and parked again afterwards: no job runs (a replay would run each once
    more; a purge would drop them: never said).

    Args:
        queue: The classic queue's name.
        role: ``quarantine`` or ``parked``.
        quarantine: The job queue's quarantine queue.
        parked: The job queue's parked queue.
    """
    delete = f"delete it (`rabbitmqctl -p {VHOST_PLACEHOLDER} delete_queue --if-empty {queue}`)"
    if role == "quarantine":
        steps = (
            f"To make it quorum without losing a job: move its jobs to {parked} (`amqpjobs quarantine park {queue} "
            f"--yes`), {delete} and apply again"
        )
    else:
        steps = (
            f"To make it quorum without losing a job or running one, once {quarantine} is quorum: `amqpjobs "
            f"quarantine unpark {queue} --yes` (its jobs wait in {quarantine}), {delete}, apply again, then "
            f"`amqpjobs quarantine park {quarantine} --yes` parks them again"
        )
    return (
        f"{queue} is classic, as amqpjobs declared it before it followed its job queue's type; it keeps "
        f"working, but a job in it lives on one node and, on RabbitMQ 4.x, is not fsynced when confirmed. {steps}"
    )
