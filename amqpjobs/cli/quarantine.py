"""``amqpjobs quarantine list|show|export|purge`` and ``amqpjobs replay``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from amqpjobs.cli._census import confirm_take, echo_no_match, interrupted_lines, progress_line, shown_line
from amqpjobs.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_FOUND,
    Decimal,
    WholeNumber,
    app_results,
    closing_store,
    error_text,
    errors_to_exit_codes,
    queue_name_arg,
    settings,
    url_options,
)
from amqpjobs.cli._filters import filter_options, move_rate, rate_option, selection
from amqpjobs.cli._outputs import output_target, unwritable
from amqpjobs.cli._payloads import (
    NOT_READ,
    app_payload_store,
    app_purge_stores,
    each_with_payload,
    payload_store_option,
)
from amqpjobs.cli._root import PointingGroup, main
from amqpjobs.cli._running import run_command
from amqpjobs.cli._signals import run_until_signal, signals_held
from amqpjobs.cli.canary import canary_options, check_canary_options, failure_lines, phase_reporter, replay_rate
from amqpjobs.cli.canary import canary_timeout as canary_timeout_seconds
from amqpjobs.cli.flow import paused_target_lines
from amqpjobs.cli.next_steps import after_list, after_replay, after_show
from amqpjobs.errors import ConfigurationError, UnaddressableNameError
from amqpjobs.jobs import envelope
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.quarantine import GROUP_HEADER, Group, Selection, summarize
from amqpjobs.jobs.quarantine import header_text as q_text
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport, check_replay_target
from amqpjobs.printable import json_text, printable
from amqpjobs.runtime.loading import load_app
from amqpjobs.runtime.parking import purge_matching
from amqpjobs.runtime.quarantine import QuarantinedMessage, browse, export, purge, quarantine_queues
from amqpjobs.runtime.replay import replay
from amqpjobs.runtime.unread import unread_queues
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.settings import BrokerSettings


@main.group(cls=PointingGroup)
def quarantine() -> None:
    """Inspect, export, park, unpark and purge quarantine queues (and parked ones).

    Browsing reads messages with basic.get and returns them all to the queue: they keep
    their order but come back with redelivered=true. It runs while a replay does (seeing
    only the messages the replay does not hold); purge waits for no one: it exits 4 then.
    """


@quarantine.command("list")
@click.argument("queue", required=False, callback=queue_name_arg)
@click.option("--all", "all_queues", is_flag=True, help="Every *.quarantine queue of the vhost.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_options
@errors_to_exit_codes
def quarantine_list(
    queue: str | None, all_queues: bool, as_json: bool, url: str | None, management_url: str | None
) -> None:
    """Counts in QUEUE grouped by job, reason and error type, with first and last failure times."""
    broker = settings(url, management_url)
    if not queue and not all_queues:
        raise ConfigurationError("give a quarantine QUEUE or --all")
    names = quarantine_queues(broker) if all_queues else [queue or ""]
    doc = []
    refused: list[UnaddressableNameError] = []
    for name in names:
        try:
            queue_name, messages = run_command(browse(broker, name, keep_bodies=0))  # counts: no body needed
        except UnaddressableNameError as exc:
            if not all_queues:
                raise
            refused.append(exc)  # the others are still listed; exit 2 at the end
            continue
        groups = summarize(m.item for m in messages)
        doc.append((queue_name, len(messages), groups))
    _list_doc(doc, as_json)
    for refusal in refused:
        click.echo(f"error: {error_text(refusal)}", err=True)
    if refused:
        sys.exit(EXIT_BAD_INPUT)


def _list_doc(doc: list[tuple[str, int, list[Group]]], as_json: bool) -> None:
    """Print ``quarantine list``'s (queue, total, groups) rows, or their JSON."""
    if as_json:
        click.echo(json.dumps([
            {"queue": n, "messages": total, "groups": [g.to_json() for g in groups]}
            for n, total, groups in doc
        ], indent=2))  # fmt: skip
        return
    for queue_name, total, groups in doc:
        click.echo(f"{printable(queue_name)}: {total} message(s)")
        if groups:
            click.echo(GROUP_HEADER)
        for g in groups:
            click.echo(g.row())
    if len(doc) == 1 and (hint := after_list(doc[0][0], doc[0][2])):
        click.echo(hint)


@quarantine.command("show")
@click.argument("queue", callback=queue_name_arg)
@click.option("--limit", type=WholeNumber(1), default=20, show_default=True)
@filter_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@payload_store_option
@url_options
@errors_to_exit_codes
def quarantine_show(
    queue: str, limit: int, job: str | None, error_type: str | None, reason: str | None, since: str | None,
    as_json: bool, app_ref: str | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Messages in QUEUE with their evidence and payload (a stored payload read with --app)."""
    broker = settings(url, management_url)
    chosen, census = selection(job, error_type, reason, since), Census()
    store = app_payload_store(app_ref)

    def each(m: QuarantinedMessage, data: dict[str, Any] | None, problem: str) -> None:
        _show_one(m, data, problem, as_json, reading=store is not None)

    shown = run_command(each_with_payload(broker, queue, limit, chosen, census, store, each))
    if not as_json:
        click.echo(shown_line(shown, census, limit, chosen))
        if shown:
            click.echo(after_show(census.queue, chosen))
    echo_no_match(census, chosen)


def _show_one(m: QuarantinedMessage, data: dict[str, Any] | None, problem: str, as_json: bool, reading: bool) -> None:
    """Print one message of ``quarantine show`` (``reading``: --app gave a payload store to read it from)."""
    doc = m.to_json()
    by_ref = envelope.PAYLOAD_REF in m.delivery.headers
    if by_ref:  # the body is empty: the payload is the stored one, or what kept it from being read
        doc["payload"] = data
        doc["stored_payload_problem"] = problem if reading else NOT_READ
    if as_json:
        click.echo(json_text(doc))
        return
    # every field is the publisher's text: escaped, so none can forge a line or steer the terminal
    for line in m.item.summary_lines():
        click.echo(line)
    payload = doc["payload"]
    shown = json.dumps(payload, ensure_ascii=False) if payload is not None else f"(raw) {m.delivery.body[:200]!r}"
    if by_ref and not reading:
        shown = "(stored: give --app MODULE:APP to read it from the app's payload store)"
    elif problem:
        shown = f"(stored, not readable) {problem}"
    click.echo(f"    payload:    {printable(shown[:1000])}")
    for key, value in sorted(doc.get("header_entries") or doc["headers"].items(), key=lambda kv: kv[0]):
        if key == "amqpjobs-traceback":
            tail = q_text(value).strip().splitlines()[-3:]  # another program's table: its type, not a repr
            click.echo("    traceback:  ..." + printable(" | ".join(tail)))
        elif key not in ("amqpjobs-error-message",):
            click.echo(f"    {printable(key)}: {printable(json.dumps(value, ensure_ascii=False)[:300])}")


@quarantine.command("export")
@click.argument("queue", callback=queue_name_arg)
@click.argument("file", type=click.Path(path_type=Path))
@url_options
@errors_to_exit_codes
def quarantine_export(queue: str, file: Path, url: str | None, management_url: str | None) -> None:
    """Write QUEUE's messages to FILE as JSON lines (payload + all headers); they stay queued.

    FILE - (or /dev/stdout) writes them to stdout, and the summary line to stderr.
    """
    out = output_target("FILE", file)
    try:
        count = run_command(export(settings(url, management_url), queue, file, out.open))
    except OSError as exc:
        if exc.filename != str(file) or out.path is None:  # stdout's reader gone: exit 141, as every command
            raise
        raise unwritable("FILE", out.shown, exc) from None
    click.echo(f"exported {count} message(s) to {out.shown}; the queue still holds them", err=out.path is None)


@quarantine.command("purge")
@click.argument("queue", callback=queue_name_arg)
@filter_options
@rate_option
@click.option("--yes", is_flag=True, help="Do not ask.")
@payload_store_option
@url_options
@errors_to_exit_codes
def quarantine_purge(
    queue: str, job: str | None, error_type: str | None, reason: str | None, since: str | None, rate: float | None,
    yes: bool, app_ref: str | None, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Delete every message in QUEUE (a quarantine or parked queue), or those matching the filters.

    With --app, the stored payloads of the deleted messages get a done mark in the app's payload store
    (deleted by the workers' sweep after the store's grace), unless a message left in QUEUE or its
    quarantine/parked sibling still names them, and each deleted job is recorded 'purged' in the
    app's results store (amqpjobs job show).
    With --rate, the messages are deleted one by one at that pace, as park and unpark move them.
    Exit 4 (nothing deleted) while another process moves QUEUE's messages (e.g. a replay).
    """
    broker = settings(url, management_url)
    chosen, pace = selection(job, error_type, reason, since), move_rate(rate)
    store, results = app_purge_stores(app_ref)
    # with a store, each message is taken (its payload marked, its job recorded); paced, each is taken too
    filtered = chosen != Selection() or store is not None or results is not None or pace is not None
    if not yes:
        confirm_take("Delete", queue, chosen, broker.safe_url, "purge")
    if filtered:
        census = Census()
        purging = purge_matching(broker, queue, chosen, census, store, results=results, rate=pace)
        report = run_command(closing_store(closing_store(purging, store), results))
        click.echo(f"purged {report.taken} message(s) from {printable(report.queue)}; {report.left} left")
        if store is not None:
            unmarked = report.payloads_unmarked
            failed = f"; {unmarked} could not be marked (see the warnings)" if unmarked else ""
            gone = f"; {report.payloads_gone} already gone (nothing to mark)" if report.payloads_gone else ""
            click.echo(f"marked {report.payloads_marked} stored payload(s) for deletion after the store's grace "
                       f"({store.grace:g}s); {report.payloads_spared} still named by a message left"
                       f"{gone}{failed}")  # fmt: skip
        echo_no_match(census, chosen)
        return
    name, removed = run_command(purge(broker, queue))
    click.echo(f"purged {removed} message(s) from {name}")


@main.command("replay")
@click.argument("quarantine_queue", metavar="QUARANTINE", callback=queue_name_arg)
@click.option(
    "--to",
    callback=queue_name_arg,
    help="Work queue to send every message to (default: each message's original queue).",
)
@click.option(
    "--app", "app_ref", metavar="MODULE:APP",
    help="The app: --to is refused when its workers do not handle the jobs (they would be quarantined), and "
    "with a results store (App(results=...)) each replayed job is recorded 'replayed'.",
)  # fmt: skip
@click.option("--rate", type=Decimal(), default=50.0, show_default=True, help="At most this many messages per second.")
@click.option("--limit", type=WholeNumber(1), help="Replay at most this many.")
@filter_options
@click.option("--dry-run", is_flag=True, help="Print what would move; move nothing.")
@click.option("--stop-after-failures", type=WholeNumber(1), help="Stop after K replayed jobs came back.")
@canary_options
@url_options
@errors_to_exit_codes
def replay_command(
    quarantine_queue: str, to: str | None, app_ref: str | None, rate: float, limit: int | None, job: str | None,
    error_type: str | None, reason: str | None, since: str | None, dry_run: bool,
    stop_after_failures: int | None, canary: int | None, canary_timeout: str, url: str | None,
    management_url: str | None,
) -> None:  # fmt: skip
    """Move quarantined jobs back to their work queues, rate-limited; each starts a fresh attempt budget.

    One replay per quarantine queue at a time: exit 4 at once, naming the running one (its
    host, pid and start), while another process moves QUARANTINE's messages. Exit 0 when
    done, 1 when --stop-after-failures or a failed --canary stopped the run, or when matching
    messages stayed (a copy too large to send, a target queue that does not exist, no queue to
    go back to): the others were replayed, and the summary counts each kind with its fix.
    """
    check_replay_target(to)  # before any warning about it
    check_canary_options(click.get_current_context(), canary)
    broker = settings(url, management_url)
    store = app_results(app_ref, required=False)
    rate = replay_rate(rate)
    options = ReplayOptions(
        rate=rate, to=to, limit=limit, selection=selection(job, error_type, reason, since), dry_run=dry_run,
        stop_after_failures=stop_after_failures, canary=canary, canary_timeout=canary_timeout_seconds(canary_timeout),
        job_queues=_job_queues(app_ref, to), app=load_app(app_ref).name if app_ref else "", layouts=_layouts(app_ref),
        idempotent=_idempotent(app_ref),
    )  # fmt: skip
    interactive = sys.stderr.isatty()
    phases = phase_reporter(canary, options.canary_timeout, options.limit)

    shown_phase, width = "", 0  # of the live line

    def progress(report: ReplayReport) -> None:
        nonlocal shown_phase, width
        changed = report.phase != shown_phase
        if interactive and changed and shown_phase:  # the canary's line stays, the rest gets its own
            click.echo("", err=True)
            width = 0
        phases(report)
        if report.replayed == 0:  # the canary's start: no move yet
            shown_phase = report.phase
            return
        if interactive and (changed or report.phase == "canary" or report.replayed % 10 == 0):
            line = progress_line(report, canary)
            click.echo("\r" + line.ljust(width), err=True, nl=False)
            width = max(width, len(line))
        shown_phase = report.phase

    report, census = ReplayReport(queue=quarantine_queue), Census()
    run = replay(broker, quarantine_queue, options, progress, report=report, census=census, results=store)
    stopped = run_until_signal(closing_store(run, store))
    with signals_held():
        if stopped is not None:  # the moves under way were cut short, the held messages are back
            if interactive:
                click.echo("", err=True)
            for line in interrupted_lines(report, rate, dry_run):
                click.echo(line, err=True)
            sys.exit(stopped)
        phases(report)  # "canary passed" when every job was a canary
        for line in paused_target_lines(broker, report.moves, dry_run):
            click.echo(line, err=True)
        _replay_end(report, census, options, canary, stop_after_failures, interactive)
        if options.layouts is None and options.to is None:
            _warn_unread(broker, report)


def _layouts(app_ref: str | None) -> dict[str, JobQueueLayout] | None:
    """Job queue -> its current layout from ``--app`` (replay re-routes jobs of dropped shards), else None."""
    return None if app_ref is None else {lay.name: lay for lay in load_app(app_ref).topology().layouts()}


def _idempotent(app_ref: str | None) -> frozenset[str]:
    """The job names ``--app`` declares idempotent (a copy of one done since it failed is replayed, not left)."""
    return frozenset() if app_ref is None else frozenset(job.name for job in load_app(app_ref) if job.idempotent)


def _warn_unread(broker: BrokerSettings, report: ReplayReport) -> None:
    """Without ``--app``: warn about shard targets no worker takes from (maybe dropped by lowering ``shards``)."""
    shards = sorted({t for _, t in report.moves if parse_queue_name(t).kind == "shard"})
    for name in unread_queues(broker, shards) if shards else []:
        click.echo(
            f"warning: {printable(name)}: no worker takes from it (no consumer, no basic.get in the last seconds); "
            "if shards was lowered it is a dropped shard and jobs replayed there wait for ever: give --app "
            "MODULE:APP so replay re-routes jobs of dropped shards by the current shard rule",
            err=True,
        )


def _job_queues(app_ref: str | None, to: str | None) -> dict[str, str] | None:
    """Job name -> job queue from ``--app``; without it, a ``--to`` replay warns that it cannot check (stderr)."""
    if app_ref is not None:
        return {job.name: job.queue for job in load_app(app_ref)}
    if to is not None:
        click.echo(
            f"warning: --to {printable(repr(to))}: without --app MODULE:APP the CLI cannot tell which jobs "
            f"{printable(repr(parse_queue_name(to).job_queue))} workers handle; a job they do not handle lands back "
            "in quarantine as unknown-job", err=True,
        )  # fmt: skip
    return None


def _replay_end(
    report: ReplayReport, census: Census, options: ReplayOptions, canary: int | None,
    stop_after_failures: int | None, interactive: bool,
) -> None:  # fmt: skip
    """What a replay that ran to its end prints, and its exit code."""
    if interactive:
        click.echo("", err=True)
    echo_no_match(census, options.selection)
    if options.dry_run:
        for job_id, target in report.moves:
            why = f" ({report.rerouted[job_id]})" if job_id in report.rerouted else ""
            click.echo(f"would replay {printable(job_id)} -> {printable(target)}{printable(why)}")
        for line in report.not_moved:  # as the real run would skip it, and exit 1 as it would
            click.echo(f"would not replay {line}; it would stay in {printable(report.queue)}", err=True)
        click.echo(f"dry run: {report.replayed} would be replayed, {report.skipped} skipped, nothing moved; "
                   f"{report.left} in {report.queue}{report.skip_reason()}")  # fmt: skip
        if report.partial:
            sys.exit(EXIT_FOUND)
        return
    click.echo(report.summary(canary is not None))
    for line in report.not_moved:
        click.echo(f"not replayed {line}; it stays in {printable(report.queue)}", err=True)
    if report.canary_failures and canary is not None:
        for line in failure_lines(report, options.selection):
            click.echo(line, err=True)
        sys.exit(EXIT_FOUND)
    if report.stopped_early:
        click.echo(f"stopped: {report.returned} replayed job(s) came back to quarantine (--stop-after-failures "
                   f"{stop_after_failures}); fix the cause before replaying the rest", err=True)  # fmt: skip
        sys.exit(EXIT_FOUND)
    click.echo(after_replay(report.queue, report.left))
    if report.partial:  # matching messages stayed, each kind counted in the summary with its fix
        sys.exit(EXIT_FOUND)
