"""``amqpjobs topology plan|apply|export``."""

from __future__ import annotations

import json
import sys

import click

from amqpjobs.cli._common import (
    EXIT_FOUND,
    declares,
    duration_option,
    errors_to_exit_codes,
    settings,
    url_options,
)
from amqpjobs.cli._outputs import output_target
from amqpjobs.cli._root import main
from amqpjobs.cli._running import run_command
from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.deploy import apply_topology, export_topology, plan_topology
from amqpjobs.topology.naming import vhost_problem


@main.group()
def topology() -> None:
    """Plan, apply and export the declarative topology (exchanges, job queues, tiers, quarantine)."""


@topology.command("plan")
@click.argument("path", type=click.Path())
@url_options
@errors_to_exit_codes
def topology_plan(path: str, url: str | None, management_url: str | None) -> None:
    """Compare the topology at PATH with the live vhost: create / unchanged / CONFLICT.

    Also lists ORPHAN queues: shards or tiers the topology no longer declares, and POLICY lines:
    queues whose policies (live, or matching once declared) override what the topology declares.
    Exit 0 without conflicts, 1 with conflicts, orphans holding messages or a policy that can
    lose jobs, 2 when PATH is invalid, 3 on broker errors.
    """
    broker = settings(url, management_url)
    result = run_command(plan_topology(path, broker))
    for warning in (*result.loaded.warnings, *result.routing_notes, *filter(None, [result.no_majority])):
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"broker {broker.safe_url} (RabbitMQ {'.'.join(map(str, result.broker_version))})")
    click.echo(result.plan_report())
    for line in result.removal_report():
        click.echo(line)
    for line in result.orphan_report():
        click.echo(line)
    for line in result.policy_report():
        click.echo(line)
    if result.plan.conflicts or any(messages for _, messages in result.orphans) or result.policy_loses:
        sys.exit(EXIT_FOUND)


@topology.command("apply")
@click.argument("path", type=click.Path())
@click.option(
    "--declare-timeout", default="30s", show_default=True,
    help="Give up (exit 3) when the declarations get no answer this long (RabbitMQ 4.3: a node in a minority).",
)  # fmt: skip
@url_options
@errors_to_exit_codes
@declares
def topology_apply(path: str, declare_timeout: str, url: str | None, management_url: str | None) -> None:
    """Declare the topology at PATH; with any conflict, declare nothing and print the plan.

    Idempotent: a second run creates nothing and says so.
    """
    timeout = duration_option("--declare-timeout", declare_timeout)
    broker = settings(url, management_url)
    result = run_command(apply_topology(path, broker, timeout))
    for warning in (*result.loaded.warnings, *result.routing_notes):
        click.echo(f"warning: {warning}", err=True)
    for line in result.orphan_report():
        click.echo(f"warning: {line}", err=True)
    for line in result.policy_report():
        click.echo(f"warning: {line}", err=True)
    for line in result.apply_report(broker.safe_url):
        click.echo(line)


@topology.command("export")
@click.argument("path", type=click.Path())
@click.option("--vhost", default="/", show_default=True, help="Vhost written into every object.")
@click.option(
    "-o",
    "--output",
    type=click.Path(allow_dash=True),
    help="File to write (default, or -: stdout).",
)
@errors_to_exit_codes
def topology_export(path: str, vhost: str, output: str | None) -> None:
    """Write RabbitMQ definitions JSON for the topology at PATH (for `rabbitmqctl import_definitions`).

    The vhost must exist on the broker before the import.
    """
    if not vhost:
        raise ConfigurationError("--vhost is empty: give a vhost name, e.g. / (the default)")
    if problem := vhost_problem(vhost):
        raise ConfigurationError(f"--vhost: {problem}")
    out = output_target("-o/--output", output)  # left out, - or /dev/stdout: stdout
    text = json.dumps(export_topology(path, vhost), indent=2, sort_keys=True)
    out.write(text + "\n")
    if out.path is not None:
        click.echo(f"wrote {out.shown}", err=True)
