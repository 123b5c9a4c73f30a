"""``amqpjobs pause`` / ``amqpjobs resume``: stop and start a job queue's jobs on every worker.

README "Flow control" → "Pause and resume"; the mechanism is :mod:`amqpjobs.runtime.pausing`.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from amqpjobs.cli._common import (
    EXIT_UNSIGNALLED,
    error_text,
    errors_to_exit_codes,
    queue_name_arg,
    settings,
    url_options,
)
from amqpjobs.cli._root import main
from amqpjobs.cli._running import run_command
from amqpjobs.errors import AmqpJobsError, SignalNotSentError
from amqpjobs.printable import printable, shell_quote
from amqpjobs.runtime.pausing import pause, resume
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.flags import MAX_REASON, read_flags
from amqpjobs.wire.settings import BrokerSettings

T = TypeVar("T")


def _signalled(change: Coroutine[Any, Any, T]) -> T:
    """Run ``change``; a refused signal (the flag changed all the same) is a warning and exit 5."""
    try:
        return run_command(change)
    except SignalNotSentError as exc:
        click.echo(f"warning: {error_text(exc)}", err=True)
        sys.exit(EXIT_UNSIGNALLED)


@main.command("pause")
@click.argument("job_queue", callback=queue_name_arg)
@click.option(
    "--reason", default="", help="Why, at most 500 characters (shown by status, metrics and the workers' logs)."
)
@url_options
@errors_to_exit_codes
def pause_command(job_queue: str, reason: str, url: str | None, management_url: str | None) -> None:
    """Pause JOB_QUEUE (all its shards): no worker starts its jobs until `amqpjobs resume`.

    Workers stop starting its jobs within 1 s; deliveries they hold unstarted go back to
    the queue, uncharged; jobs running finish. The pause is kept on the broker (a worker
    started or reconnected meanwhile starts nothing of it). Pausing again replaces the
    reason and the since. Exit 2 when there is no such job queue (the message lists them);
    exit 5 when the flag was set but the signal to the workers was refused (they notice
    within 30 s; the message says which permission is missing).
    """
    flag = _signalled(pause(settings(url, management_url), job_queue, reason))
    why = f" (reason: {printable(flag.reason)})" if flag.reason else ""
    click.echo(f"paused job queue {printable(job_queue)} since {flag.to_json()['since']}{why}: no worker starts "
               f"its jobs now; resume with: amqpjobs resume {shell_quote(job_queue)}")  # fmt: skip
    if flag.reason != printable(reason)[:MAX_REASON]:
        click.echo(f"note: another pause of {printable(job_queue)} came at the same moment and its reason was kept, "
                   f"not yours ({printable(reason)!r}): run pause again to replace it")  # fmt: skip


@main.command("resume")
@click.argument("job_queue", callback=queue_name_arg)
@url_options
@errors_to_exit_codes
def resume_command(job_queue: str, url: str | None, management_url: str | None) -> None:
    """Resume JOB_QUEUE after `amqpjobs pause`: workers start its jobs again at once.

    Exit 0 also when it was not paused (it says so); exit 2 when there is no such job queue;
    exit 5 when the flag was deleted but the signal to the workers was refused (they notice within 30 s).
    """
    if _signalled(resume(settings(url, management_url), job_queue)):
        click.echo(f"resumed job queue {printable(job_queue)}: workers start its jobs again")
    else:
        click.echo(f"job queue {printable(job_queue)} was not paused: nothing to do")


def paused_target_lines(settings: BrokerSettings, moves: list[tuple[str, str]], dry_run: bool) -> list[str]:
    """Warnings for the job queues a replay moved jobs into (``moves``: job id, target queue) that are paused.

    Such jobs wait there until ``amqpjobs resume``, and a canary among them gets no outcome. Best
    effort: [] when the management API can't say (README "Flow control" -> "Pause and resume").
    """
    counts = Counter(parse_queue_name(target).job_queue for _, target in moves)
    try:
        flags = read_flags(settings, sorted(q for q in counts if q))
    except AmqpJobsError:
        return []
    wait = "would wait" if dry_run else "wait"
    return [
        f"warning: job queue {printable(q)} is paused (since {flag.since:%Y-%m-%d %H:%M:%S} UTC, reason: "
        f"{flag.reason or 'none given'}): the {counts[q]} job(s) replayed into it {wait} there until "
        f"amqpjobs resume {shell_quote(q)}"
        for q, flag in sorted(flags.items())
    ]
