"""The ``amqpjobs`` command line: a thin click layer over the library.

Exit codes: 0 success; 1 the check found something (plan conflicts); 2 bad input
(invalid topology files, bad options); 3 the broker or its management API failed; 4 busy:
another process holds the lock the command needs (one mover per quarantine queue), nothing
was done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from amqpjobs import __version__
from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.errors import (
    BrokerError,
    BusyError,
    ConfigurationError,
    InvalidPayloadError,
    PublishError,
    TopologyConflictError,
    TopologyValidationError,
)
from amqpjobs.jobs.asyncapi import asyncapi_document
from amqpjobs.jobs.cron import format_tick
from amqpjobs.jobs.outcome import REASONS
from amqpjobs.jobs.quarantine import BROKER_REASONS, Selection, summarize
from amqpjobs.jobs.timestamps import parse_time
from amqpjobs.printable import json_safe, printable
from amqpjobs.runtime.deploy import apply_topology, export_topology, plan_topology
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.logs import configure_logging
from amqpjobs.runtime.quarantine import ReplayOptions, ReplayReport, browse, export, purge, quarantine_queues, replay
from amqpjobs.runtime.scheduler import SchedulerOptions, run_scheduler
from amqpjobs.runtime.status import collect
from amqpjobs.runtime.worker import WorkerOptions, run_worker
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import MANAGEMENT_URL_ENV, URL_ENV, BrokerSettings, broker_settings

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FOUND = 1
EXIT_BAD_INPUT = 2
EXIT_BROKER = 3
EXIT_BUSY = 4


def _errors_to_exit_codes(func: F) -> F:
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TopologyValidationError as exc:
            click.echo(f"error: {exc}", err=True)
            click.echo("nothing was declared", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except TopologyConflictError as exc:
            click.echo(exc.report)
            if exc.declared_nothing:
                click.echo("conflicts found: nothing was declared", err=True)
            sys.exit(EXIT_FOUND)
        except ConfigurationError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (InvalidPayloadError, PublishError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except BusyError as exc:
            click.echo(f"busy: {exc}", err=True)
            sys.exit(EXIT_BUSY)
        except BrokerError as exc:
            click.echo(f"broker error: {exc}", err=True)
            sys.exit(EXIT_BROKER)
        except OSError as exc:  # files given on the command line
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]


def _url_options(func: F) -> F:
    func = click.option(
        "--management-url",
        envvar=MANAGEMENT_URL_ENV,
        help=f"Management API URL (default: ${MANAGEMENT_URL_ENV}, else the AMQP host, port + 10000).",
    )(func)
    func = click.option(
        "--url", envvar=URL_ENV, help=f"AMQP URL amqp://user:pass@host:port/vhost (default: ${URL_ENV})."
    )(func)
    return func


def _settings(url: str | None, management_url: str | None) -> BrokerSettings:
    return broker_settings(url, management_url)


@click.group()
@click.version_option(__version__, prog_name="amqpjobs")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Reliable background jobs on RabbitMQ."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--queues", "-q", help="Comma-separated job queues to consume (default: all the app's jobs use).")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Slots per work queue; each holds at most one unacked delivery (prefetch 1).",
)
@click.option("--grace", default="30s", show_default=True, help="Time in-flight jobs get to finish on SIGTERM.")
@click.option(
    "--consumer-timeout",
    default="30m",
    show_default=True,
    help="The broker's consumer_timeout; job timeouts above it are warned about.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve /metrics, /healthz, /readyz on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Interface for --metrics-port.")
@_url_options
@_errors_to_exit_codes
def consume(
    app_ref: str,
    queues: str | None,
    concurrency: int,
    grace: str,
    consumer_timeout: str,
    log_json: bool,
    metrics_port: int | None,
    metrics_host: str,
    url: str | None,
    management_url: str | None,
) -> None:
    """Run a worker for the app MODULE:APP until SIGTERM/SIGINT (then drain and exit 0)."""
    try:
        options = WorkerOptions(
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
            concurrency=concurrency,
            grace=parse_duration(grace),
            consumer_timeout=parse_duration(consumer_timeout),
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    configure_logging(json_lines=log_json)
    app = load_app(app_ref)
    settings = _settings(url, management_url)
    sys.exit(asyncio.run(run_worker(app, settings, options, metrics_port, metrics_host)))


@main.group()
def topology() -> None:
    """Plan, apply and export the declarative topology (exchanges, job queues, tiers, quarantine)."""


@topology.command("plan")
@click.argument("path", type=click.Path())
@_url_options
@_errors_to_exit_codes
def topology_plan(path: str, url: str | None, management_url: str | None) -> None:
    """Compare the topology at PATH with the live vhost: create / unchanged / CONFLICT.

    Also lists ORPHAN queues: shards or tiers the topology no longer declares. Exit 0 without
    conflicts, 1 with conflicts or orphans holding messages, 2 when PATH is invalid, 3 on
    broker errors.
    """
    settings = _settings(url, management_url)
    result = asyncio.run(plan_topology(path, settings))
    for warning in result.loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"broker {settings.safe_url} (RabbitMQ {'.'.join(map(str, result.broker_version))})")
    click.echo(result.plan.report())
    for line in result.orphan_report():
        click.echo(line)
    if result.plan.conflicts or any(messages for _, messages in result.orphans):
        sys.exit(EXIT_FOUND)


@topology.command("apply")
@click.argument("path", type=click.Path())
@click.option(
    "--declare-timeout", default="30s", show_default=True,
    help="Give up (exit 3) when the declarations get no answer this long (RabbitMQ 4.3: a node in a minority).",
)  # fmt: skip
@_url_options
@_errors_to_exit_codes
def topology_apply(path: str, declare_timeout: str, url: str | None, management_url: str | None) -> None:
    """Declare the topology at PATH; with any conflict, declare nothing and print the plan.

    Idempotent: a second run creates nothing and says so.
    """
    try:
        timeout = parse_duration(declare_timeout)
    except ValueError as exc:
        raise ConfigurationError(f"--declare-timeout: {exc}") from None
    settings = _settings(url, management_url)
    result = asyncio.run(apply_topology(path, settings, timeout))
    for warning in result.loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    for line in result.orphan_report():
        click.echo(f"warning: {line}", err=True)
    created = result.plan.creates
    for item in created:
        click.echo(f"created   {item.desired.kind:<8} {item.desired.name}")
    unchanged = result.plan.counts()["unchanged"]
    if created:
        click.echo(f"applied to {settings.safe_url}: {len(created)} created, {unchanged} unchanged")
    else:
        click.echo(f"nothing to create on {settings.safe_url}: all {unchanged} objects unchanged")


@topology.command("export")
@click.argument("path", type=click.Path())
@click.option("--vhost", default="/", show_default=True, help="Vhost written into every object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write (default stdout).")
@_errors_to_exit_codes
def topology_export(path: str, vhost: str, output: str | None) -> None:
    """Write RabbitMQ definitions JSON for the topology at PATH (for `rabbitmqctl import_definitions`).

    The vhost must exist on the broker before the import.
    """
    if not vhost:
        raise ConfigurationError("--vhost is empty: give a vhost name, e.g. / (the default)")
    text = json.dumps(export_topology(path, vhost), indent=2, sort_keys=True)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _selection(job: str | None, error_type: str | None, reason: str | None, since: str | None) -> Selection:
    when = None
    if since is not None and not since.strip():
        raise ConfigurationError("--since is empty: give a duration ('2h') or an ISO-8601 time, or leave it out")
    for flag, value in (("--job", job), ("--error-type", error_type), ("--reason", reason)):
        if value is not None and not value.strip():
            raise ConfigurationError(f"{flag} is empty: give a value or leave it out")
    if reason is not None and reason not in REASONS and reason.removeprefix("x-death:") not in BROKER_REASONS:
        raise ConfigurationError(
            f"--reason {reason!r} is not a reason; use one of {', '.join(REASONS)}, or x-death:<reason> "
            f"({', '.join(BROKER_REASONS)}) for broker-side dead-letters"
        )
    if since:
        try:
            when = datetime.now(UTC) - timedelta(seconds=parse_duration(since))
        except ValueError:
            when = parse_time(since)
            if when is None:
                raise ConfigurationError(
                    f"--since {since!r}: give a duration ('2h', '30m') or an ISO-8601 time ('2026-11-29T08:00Z')"
                ) from None
    return Selection(job=job, error_type=error_type, reason=reason, since=when)


def _filter_options(func: F) -> F:
    func = click.option("--since", help="Only failures at or after this: a duration ago ('2h') or an ISO time.")(func)
    func = click.option("--reason", help="Only this reason (exhausted, permanent, ..., or x-death:expired).")(func)
    func = click.option("--error-type", help="Only this error type (e.g. ValueError).")(func)
    func = click.option("--job", help="Only this job name.")(func)
    return func


@main.group()
def quarantine() -> None:
    """Inspect, export and purge quarantine queues.

    Browsing reads messages with basic.get and returns them all to the queue: they keep
    their order but come back with redelivered=true. It runs while a replay does (seeing
    only the messages the replay does not hold); purge waits for no one: it exits 4 then.
    """


@quarantine.command("list")
@click.argument("queue", required=False)
@click.option("--all", "all_queues", is_flag=True, help="Every *.quarantine queue of the vhost.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_url_options
@_errors_to_exit_codes
def quarantine_list(
    queue: str | None, all_queues: bool, as_json: bool, url: str | None, management_url: str | None
) -> None:
    """Counts in QUEUE grouped by job, reason and error type, with first and last failure times."""
    settings = _settings(url, management_url)
    if not queue and not all_queues:
        raise ConfigurationError("give a quarantine QUEUE or --all")
    names = quarantine_queues(settings) if all_queues else [queue or ""]
    doc = []
    for name in names:
        queue_name, messages = asyncio.run(browse(settings, name))
        groups = summarize(m.item for m in messages)
        doc.append((queue_name, len(messages), groups))
    if as_json:
        click.echo(json.dumps([
            {"queue": n, "messages": total, "groups": [
                {"job": g.job, "reason": g.reason, "error_type": g.error_type, "count": g.count,
                 "first_failure": _when(g.first_failure), "last_failure": _when(g.last_failure)}
                for g in groups]}
            for n, total, groups in doc
        ], indent=2))  # fmt: skip
        return
    for queue_name, total, groups in doc:
        click.echo(f"{printable(queue_name)}: {total} message(s)")
        if groups:
            click.echo(f"  {'count':>6}  {'job':<24} {'reason':<24} {'error type':<28} first failure -> last failure")
        for g in groups:
            click.echo(
                f"  {g.count:>6}  {printable(g.job) or '?':<24} {printable(g.reason):<24} "
                f"{printable(g.error_type) or '-':<28} "
                f"{_when(g.first_failure)} -> {_when(g.last_failure)}"
            )


@quarantine.command("show")
@click.argument("queue")
@click.option("--limit", type=click.IntRange(1), default=20, show_default=True)
@_filter_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_url_options
@_errors_to_exit_codes
def quarantine_show(
    queue: str, limit: int, job: str | None, error_type: str | None, reason: str | None, since: str | None,
    as_json: bool, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Messages in QUEUE with their evidence and payload."""
    settings = _settings(url, management_url)
    selection = _selection(job, error_type, reason, since)
    _, messages = asyncio.run(browse(settings, queue, limit, selection))
    for m in messages:
        if as_json:
            click.echo(json_safe(json.dumps(m.to_json(), ensure_ascii=False)))
            continue
        doc = m.to_json()
        item = m.item
        # every field is the publisher's text: escaped, so none can forge a line or steer the terminal
        click.echo(f"--- job {printable(item.job) or '?'} id {printable(item.job_id) or '?'}")
        click.echo(
            f"    reason:     {printable(item.reason)}   attempts: {item.attempts}   replays: {item.replay_count}"
        )
        if item.error_type:
            click.echo(f"    error:      {printable(item.error_type)}: {printable(item.error_message[:500])}")
        click.echo(f"    failed:     {_when(item.first_failed_at)} -> {_when(item.failed_at)}")
        click.echo(f"    from queue: {printable(item.original_queue) or '?'}")
        payload = doc["payload"]
        shown = json.dumps(payload, ensure_ascii=False) if payload is not None else f"(raw) {m.delivery.body[:200]!r}"
        click.echo(f"    payload:    {printable(shown[:1000])}")
        for key, value in sorted(doc["headers"].items()):
            if key == "amqpjobs-traceback":
                tail = str(value).strip().splitlines()[-3:]
                click.echo("    traceback:  ..." + printable(" | ".join(tail)))
            elif key not in ("amqpjobs-error-message",):
                click.echo(f"    {printable(key)}: {printable(json.dumps(value, ensure_ascii=False)[:300])}")
    if not as_json:
        click.echo(f"{len(messages)} message(s) shown")


@quarantine.command("export")
@click.argument("queue")
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@_url_options
@_errors_to_exit_codes
def quarantine_export(queue: str, file: Path, url: str | None, management_url: str | None) -> None:
    """Write QUEUE's messages to FILE as JSON lines (payload + all headers); they stay queued."""
    count = asyncio.run(export(_settings(url, management_url), queue, file))
    click.echo(f"exported {count} message(s) to {file}; the queue still holds them")


@quarantine.command("purge")
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask.")
@_url_options
@_errors_to_exit_codes
def quarantine_purge(queue: str, yes: bool, url: str | None, management_url: str | None) -> None:
    """Delete every message in QUEUE.

    Exit 4 (nothing deleted) while another process moves QUEUE's messages (e.g. a replay).
    """
    settings = _settings(url, management_url)
    if not yes:
        click.confirm(f"Delete every message in quarantine {queue!r} on {settings.safe_url}?", abort=True)
    name, removed = asyncio.run(purge(settings, queue))
    click.echo(f"purged {removed} message(s) from {name}")


@main.command("replay")
@click.argument("quarantine_queue", metavar="QUARANTINE")
@click.option("--to", help="Work queue to send every message to (default: each message's original queue).")
@click.option("--rate", type=float, default=50.0, show_default=True, help="At most this many messages per second.")
@click.option("--limit", type=click.IntRange(1), help="Replay at most this many.")
@_filter_options
@click.option("--dry-run", is_flag=True, help="Print what would move; move nothing.")
@click.option("--stop-after-failures", type=click.IntRange(1), help="Stop after K replayed jobs came back.")
@_url_options
@_errors_to_exit_codes
def replay_command(
    quarantine_queue: str, to: str | None, rate: float, limit: int | None, job: str | None,
    error_type: str | None, reason: str | None, since: str | None, dry_run: bool,
    stop_after_failures: int | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Move quarantined jobs back to their work queues, rate-limited; each starts a fresh attempt budget.

    One replay per quarantine queue at a time: exit 4 at once, naming the running one (its
    host, pid and start), while another process moves QUARANTINE's messages. Exit 0 when
    done, 1 when --stop-after-failures stopped the run.
    """
    settings = _settings(url, management_url)
    options = ReplayOptions(
        rate=rate, to=to, limit=limit, selection=_selection(job, error_type, reason, since), dry_run=dry_run,
        stop_after_failures=stop_after_failures,
    )  # fmt: skip
    interactive = sys.stderr.isatty()

    def progress(report: ReplayReport) -> None:
        if interactive and report.replayed % 10 == 0:
            click.echo(f"\rreplayed {report.replayed} ({report.replayed / max(report.elapsed, 1e-9):.0f}/s)",
                       err=True, nl=False)  # fmt: skip

    report = asyncio.run(replay(settings, quarantine_queue, options, progress))
    if interactive:
        click.echo("", err=True)
    if dry_run:
        for job_id, target in report.moves:
            click.echo(f"would replay {printable(job_id)} -> {printable(target)}")
        click.echo(f"dry run: {report.replayed} would be replayed, {report.skipped} skipped, nothing moved; "
                   f"{report.left} in {report.queue}")  # fmt: skip
        return
    rate_seen = (report.replayed - 1) / report.elapsed if report.elapsed > 0 else 0.0
    click.echo(
        f"replayed {report.replayed}, skipped {report.skipped}, left {report.left} in {report.queue} "
        f"({report.elapsed:.1f}s, {rate_seen:.1f}/s)"
    )
    if report.stopped_early:
        click.echo(f"stopped: {report.returned} replayed job(s) came back to quarantine (--stop-after-failures "
                   f"{stop_after_failures}); fix the cause before replaying the rest", err=True)  # fmt: skip
        sys.exit(EXIT_FOUND)


@main.command("status")
@click.argument("path", required=False, type=click.Path())
@click.option("--queues", "-q", help="Comma-separated job queue names (instead of a topology PATH).")
@click.option("--max-age", default=None, help="Unhealthy when a work queue's oldest message is older (e.g. 60s).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_url_options
@_errors_to_exit_codes
def status_command(
    path: str | None, queues: str | None, max_age: str | None, as_json: bool, url: str | None,
    management_url: str | None,
) -> None:  # fmt: skip
    """Golden signals per job queue; exit 1 when unhealthy (usable as an alert check).

    Job queues come from the topology at PATH (default: ./topology when it exists), or
    --queues. Exit 0 healthy; 1 when any quarantine holds messages, a work queue has no
    consumer, a queue or quarantine exchange is missing, or an oldest message is older
    than --max-age.
    """
    settings = _settings(url, management_url)
    try:
        bound = parse_duration(max_age) if max_age is not None else None
    except ValueError as exc:
        raise ConfigurationError(f"--max-age: {exc}") from None
    if queues is not None and not queues.strip(", "):
        raise ConfigurationError("--queues is empty: give job queue names, or a topology PATH")
    names = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    layouts = None
    if not names:
        where = Path(path or "topology")
        if path is None and not where.exists():
            raise ConfigurationError("give a topology PATH or --queues (no ./topology here)")
        layouts = list(load_topology(where).topology.layouts())
    report = asyncio.run(collect(settings, layouts, names, bound))
    unhealthy = any(j.problems for j in report)
    if as_json:
        click.echo(json.dumps({"healthy": not unhealthy, "job_queues": [j.to_json() for j in report]}, indent=2))
    else:
        click.echo(
            f"{'queue':<34} {'ready':>7} {'unacked':>7} {'cons':>4} {'pub/s':>7} {'dlv/s':>7} {'ack/s':>7} oldest"
        )
        for j in report:
            for q in [*j.work, *j.tiers, j.quarantine, j.suspects]:
                if not q.exists:
                    click.echo(f"{q.name:<34} {'missing':>7}")
                    continue
                age = "-" if q.oldest_age is None else f"{q.oldest_age:.0f}s"
                click.echo(
                    f"{q.name:<34} {q.ready:>7} {q.unacked:>7} {q.consumers:>4} {q.publish_rate:>7.1f} "
                    f"{q.deliver_rate:>7.1f} {q.ack_rate:>7.1f} {age}"
                )
        for j in report:
            for problem in j.problems:
                click.echo(f"UNHEALTHY {j.name}: {problem}")
        if not unhealthy:
            click.echo("healthy")
    if unhealthy:
        sys.exit(EXIT_FOUND)


@main.command("asyncapi")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write (default stdout).")
@_errors_to_exit_codes
def asyncapi(app_ref: str, output: str | None) -> None:
    """Write an AsyncAPI 3.0 document of MODULE:APP: a channel per job queue and shard, a message per job.

    For publishers in other languages: exchange, routing key and AMQP bindings of each
    channel, each job's payload JSON Schema (from its pydantic model) and our headers' schema.
    """
    app = load_app(app_ref)
    text = json.dumps(asyncapi_document(app.name, app.app_version, app, app.topology()), indent=2)
    if output:
        Path(output).write_text(text + "\n", encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)


@main.group()
def schedule() -> None:
    """Cron schedules: run a scheduler replica, list the next fire times."""


@schedule.command("run")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--schedules", "-s", help="Comma-separated schedule names (default: all of the app's).")
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@_url_options
@_errors_to_exit_codes
def schedule_run(
    app_ref: str, schedules: str | None, log_json: bool, url: str | None, management_url: str | None
) -> None:
    """Run a scheduler replica for MODULE:APP until SIGTERM/SIGINT (then exit 0).

    Run as many replicas as you like: the broker elects one, which enqueues each tick
    once; when it dies another takes over within seconds.
    """
    names = tuple(n.strip() for n in schedules.split(",") if n.strip()) if schedules else None
    configure_logging(json_lines=log_json)
    app = load_app(app_ref)
    settings = _settings(url, management_url)
    sys.exit(asyncio.run(run_scheduler(app, settings, SchedulerOptions(schedules=names))))


@schedule.command("list")
@click.argument("app_ref", metavar="MODULE:APP")
@click.option("--count", type=click.IntRange(1, 100), default=3, show_default=True, help="Fire times per schedule.")
@click.option("--after", help="Count from this ISO-8601 time instead of now (e.g. 2026-03-29T00:00Z).")
@_errors_to_exit_codes
def schedule_list(app_ref: str, count: int, after: str | None) -> None:
    """Each schedule of MODULE:APP with its next fire times, in UTC and in the schedule's local time."""
    app = load_app(app_ref)
    start = datetime.now(UTC) if after is None else parse_time(after)
    if start is None:
        raise ConfigurationError(f"--after {after!r}: give an ISO-8601 time such as 2026-03-29T00:00Z")
    schedules = app.schedules()
    if not schedules:
        click.echo(f"app {app.name!r} has no schedules")
    for s in schedules:
        click.echo(
            f"{s.name}  job={s.job}  cron={s.rule.expression!r}  tz={s.rule.tz}  missed={s.missed}  "
            f"overlap={s.overlap}  grace={format_duration(s.grace)}"
        )
        for tick in s.rule.upcoming(start, count):
            local = tick.astimezone(s.rule.zone)
            offset = local.isoformat()[-6:]
            click.echo(f"  {format_tick(tick)}  {local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({offset})")
