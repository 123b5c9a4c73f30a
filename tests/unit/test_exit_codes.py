"""One home for exit codes (amqpjobs.exit_codes): the CLI, a worker's stop line and a --processes child agree."""

from __future__ import annotations

import pytest

import amqpjobs.cli as cli
from amqpjobs import exit_codes
from amqpjobs.errors import (
    BrokerBlockedError,
    BrokerError,
    BrokerUnavailableError,
    BusyError,
    ConfigurationError,
    InvalidPayloadError,
    LedgerUnavailableError,
    PayloadStoreError,
    PublishError,
    ResultsUnavailableError,
    TopologyConflictError,
    TopologyValidationError,
    UnroutableError,
)
from amqpjobs.exit_codes import exit_code


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BrokerError("x"), 3),
        (BrokerUnavailableError("x"), 3),
        (ResultsUnavailableError("x"), 3),
        (LedgerUnavailableError("x"), 3),
        (PayloadStoreError("x"), 3),
        (PublishError("x"), 3),  # not confirmed: the outcome is unknown, the broker's side
        (BrokerBlockedError("x"), 3),
        (UnroutableError("x"), 2),  # refused for what it is
        (InvalidPayloadError("job", [], "x"), 2),
        (ConfigurationError("x"), 2),
        (TopologyValidationError([]), 2),
        (TopologyConflictError("x"), 1),
        (BusyError("x", "quarantine queue q", None), 4),
        (OSError("x"), 2),
        (RuntimeError("x"), 1),  # none of ours: Python's own code for an uncaught error
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_each_error_has_one_exit_code(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


def test_the_cli_names_the_same_codes() -> None:
    for name in ("EXIT_FOUND", "EXIT_BAD_INPUT", "EXIT_BROKER", "EXIT_BUSY", "EXIT_BROKEN_PIPE", "EXIT_INTERRUPTED"):
        assert getattr(cli, name) == getattr(exit_codes, name), name
