"""``amqpjobs console``: the web console over quarantine and replay (the extra ``amqpjobs[console]``)."""

from __future__ import annotations

from pathlib import Path

import click

from amqpjobs.cli._common import WholeNumber, errors_to_exit_codes, settings, url_options
from amqpjobs.cli._root import main
from amqpjobs.errors import ConfigurationError


@main.command("console")
@click.option(
    "--app", "app_ref", metavar="MODULE:APP", help="The app: its job queues, and its results store for job lookup."
)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; beyond loopback it needs AMQPJOBS_CONSOLE_TOKEN, or "
              "AMQPJOBS_CONSOLE_USER and AMQPJOBS_CONSOLE_PASSWORD, in the environment.")  # fmt: skip
@click.option("--port", type=WholeNumber(0, 65535), default=8480, show_default=True)
@click.option("--read-only", is_flag=True, help="Offer no action (replay, park, purge); refuse every POST.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A host name the browser may use besides localhost and --host (a proxy's). Repeatable.")  # fmt: skip
@click.option("--audit-log", type=click.Path(dir_okay=False, path_type=Path),
              help="The audit log (JSON lines); default $AMQPJOBS_CONSOLE_AUDIT_LOG or "
              "~/.local/state/amqpjobs/console-audit.jsonl.")  # fmt: skip
@click.option("--root-path", default="", metavar="PATH",
              help="The path a reverse proxy serves the console under (/jobs), which it strips before passing "
              "the request on; every link of the pages starts with it.")  # fmt: skip
@url_options
@errors_to_exit_codes
def console_command(
    app_ref: str | None, host: str, port: int, read_only: bool, allowed_hosts: tuple[str, ...],
    audit_log: Path | None, root_path: str, url: str | None, management_url: str | None,
) -> None:  # fmt: skip
    """Serve the web console: overview, quarantine groups, messages, replay with a canary, park, purge, audit log.

    Binds 127.0.0.1 by default. Every action takes the same lock as the CLI's (exit 4 there,
    an error on the page, while the other runs). Exit 2 when the extra is not installed or
    --host is not loopback and no credentials are set.
    """
    try:
        from amqpjobs.console.app import serve
        from amqpjobs.console.config import ConsoleConfig, credentials_from_env, default_audit_path
    except ImportError as exc:
        raise ConfigurationError(
            f"the console needs its extra: pip install 'amqpjobs[console]' ({exc.name or exc} is missing)"
        ) from None
    config = ConsoleConfig(
        settings(url, management_url), host, port, read_only, credentials_from_env(),
        audit_log or default_audit_path(), app_ref, allowed_hosts, root_path,
    )  # fmt: skip
    shown = f"[{host}]" if ":" in host else host

    def listening(bound: int) -> None:  # once the checks passed and the port is bound (the real one for --port 0)
        behind = f"; its pages link under {root_path}/ (--root-path)" if root_path else ""
        click.echo(f"amqpjobs console on http://{shown}:{bound}/ (vhost {config.broker.vhost!r}{behind}; Ctrl-C to "
                   "stop)", err=True)  # fmt: skip

    serve(config, listening)
