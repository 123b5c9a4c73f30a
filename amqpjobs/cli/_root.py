"""The ``amqpjobs`` click group every command hangs from."""

from __future__ import annotations

import logging

import click

from amqpjobs._version import __version__


@click.group()
@click.version_option(__version__, prog_name="amqpjobs")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Reliable background jobs on RabbitMQ."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
