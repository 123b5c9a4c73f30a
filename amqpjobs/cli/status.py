"""``amqpjobs status``: golden signals per job queue, usable as an alert check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from amqpjobs.cli._common import EXIT_FOUND, comma_items, duration_option, errors_to_exit_codes, settings, url_options
from amqpjobs.cli._root import main
from amqpjobs.cli._running import run_command
from amqpjobs.errors import ConfigurationError
from amqpjobs.printable import listed, printable
from amqpjobs.runtime.alarm_status import alarm_problem, alarms_unknown_note, broker_alarms
from amqpjobs.runtime.status import JobQueueStatus, collect, status_report
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import own_queue_words, parse_queue_name, queue_name_problem
from amqpjobs.wire.arguments import desired_state


@main.command("status")
@click.argument("path", required=False, type=click.Path())
@click.option(
    "--queues", "-q", help="Comma-separated job queue names (instead of a topology PATH, or to narrow it to those)."
)
@click.option("--max-age", default=None, help="Unhealthy when a work queue's oldest message is older (e.g. 60s).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_options
@errors_to_exit_codes
def status_command(
    path: str | None, queues: str | None, max_age: str | None, as_json: bool, url: str | None,
    management_url: str | None,
) -> None:  # fmt: skip
    """Golden signals per job queue; exit 1 when unhealthy (usable as an alert check).

    Job queues come from the topology at PATH (default: ./topology when it exists), or
    --queues (found on the broker by name); with both, the topology's job queues named.
    Exit 0 healthy; 1 when any quarantine holds messages, a work queue has no consumer, a
    queue or quarantine exchange is missing, an oldest message is older than --max-age, or
    a resource alarm (disk, memory) blocks the broker's publishers.
    """
    broker = settings(url, management_url)
    bound = duration_option("--max-age", max_age) if max_age is not None else None
    names = None if queues is None else list(dict.fromkeys(comma_items("--queues", queues, "mail,billing")))
    if names == []:
        raise ConfigurationError("--queues is empty: give job queue names, or a topology PATH")
    for name in names or []:
        if problem := queue_name_problem(name):
            raise ConfigurationError(f"--queues: {problem}")
        if (kind := parse_queue_name(name)).kind != "work":
            raise ConfigurationError(f"--queues: {printable(name)} is {own_queue_words(kind)}: give job queue names")
    layouts, desired = None, []
    source = f"--queues {','.join(names)}" if names else ""
    if not names or path is not None:
        where = Path(path or "topology")
        if path is None and not where.exists():
            raise ConfigurationError("give a topology PATH or --queues (no ./topology here)")
        topology = load_topology(where).topology
        layouts, desired = list(topology.layouts()), desired_state(topology.declarations())
        source = f"topology {where.resolve()}" + (" (the default ./topology: no PATH given)" if path is None else "")
        if names:  # both: the topology's job queues, narrowed to those
            layouts, source = _narrowed(layouts, names, where), f"{source}, job queue(s) {','.join(names)}"
            names = None

    async def read() -> tuple[list[JobQueueStatus], tuple[list[dict[str, str]] | None, str]]:
        return await collect(broker, layouts, names, bound, desired), await broker_alarms(broker)

    report, (alarms, why) = run_command(read())
    if report and alarms:  # the whole broker's, said once (as a vhost's own policies are)
        report[0].problems.insert(0, alarm_problem(alarms))
    elif report and alarms is None:
        report[0].notes.append(alarms_unknown_note(why))
    unhealthy = any(j.problems for j in report) or bool(alarms)
    if as_json:
        doc = {"healthy": not unhealthy, "vhost": broker.vhost, "source": source, "alarms": alarms}
        click.echo(json.dumps({**doc, "job_queues": [j.to_json() for j in report]}, indent=2))
    else:
        click.echo(f"{printable(source)}; vhost {broker.vhost!r} on {broker.safe_url}")
        for line in status_report(report):
            click.echo(line)
        if alarms and not report:  # no job queue to say it under
            click.echo(f"UNHEALTHY broker: {alarm_problem(alarms)}")
    if unhealthy:
        sys.exit(EXIT_FOUND)


def _narrowed(layouts: list[JobQueueLayout], names: list[str], where: Path) -> list[JobQueueLayout]:
    """The layouts of the job queues ``names``, in that order.

    Raises:
        ConfigurationError: a name is no job queue of the topology at ``where``.
    """
    known = {lay.name: lay for lay in layouts}
    if unknown := [n for n in names if n not in known]:
        raise ConfigurationError(
            f"--queues: {listed(unknown)}: not a job queue of the topology {printable(str(where))} (its job queues: "
            f"{listed(known)}; leave PATH out to look for any job queue on the broker)"
        )
    return [known[n] for n in dict.fromkeys(names)]
