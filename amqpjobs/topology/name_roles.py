"""Job queue names the naming scheme reads as a queue of another role, refused at load time."""

from __future__ import annotations

from amqpjobs.errors import Problem
from amqpjobs.topology import naming
from amqpjobs.topology.models import TopologyFile


def app_queue_names(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """Job queues named as a queue of another role (:func:`~amqpjobs.topology.naming.parse_queue_name`).

    An app's own queues (``amqpjobs.<...>.<app>...``): the topology would declare the app's queue
    itself, with other arguments (a ledger marker declared before the app's first ledger makes
    that ledger's start refused as a lost one). A name read as another job queue's quarantine,
    parked, suspects, pause flag, retry tier or shard (``x.quarantine``): every command reading
    names by the scheme would take its work queue for that (``quarantine purge x.quarantine``
    deleted the jobs waiting in it).
    """
    problems: list[Problem] = []
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            name = naming.parse_queue_name(jq.name)
            if name.kind in ("ledger", "leader", "ticks", "running"):
                what = "ledger marker" if name.kind == "ledger" else "scheduler's queues"
                problems.append(
                    Problem(file, f"job_queue[{i}].name", f"{jq.name!r} is the name of a queue of app {name.app!r} "
                            f"(its {what}), which amqpjobs declares itself",
                            "give the job queue another name (names beginning 'amqpjobs.' are amqpjobs' own)")
                )  # fmt: skip
            elif name.kind != "work":
                problems.append(
                    Problem(file, f"job_queue[{i}].name", f"{jq.name!r} is read as {naming.own_queue_words(name)} "
                            "(commands, status and replay take a queue's role from its name), so they would take "
                            "its jobs for that queue's messages",
                            "give the job queue a name that does not end in '.quarantine', '.parked', '.suspects', "
                            "'.paused', '.retry.<duration>' or '.shard-<number>'")
                )  # fmt: skip
    return problems
