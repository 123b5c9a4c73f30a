"""amqpjobs: reliable background jobs on RabbitMQ."""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from amqpjobs._version import __version__
from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.errors import (
    AmqpJobsError,
    BrokerBlockedError,
    BrokerError,
    BrokerUnavailableError,
    BusyError,
    ChannelClosedError,
    ConfigurationError,
    DuplicateJobError,
    InvalidPayloadError,
    JobFailedError,
    LedgerUnavailableError,
    ManagementApiError,
    MessageTooLargeError,
    NotFoundError,
    PayloadStoreError,
    PreconditionFailedError,
    Problem,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    QueueFullError,
    ResourceLockedError,
    ResultsUnavailableError,
    SignalNotSentError,
    TopologyConflictError,
    TopologyError,
    TopologyValidationError,
    UnaddressableNameError,
    UnroutableError,
)
from amqpjobs.jobs.breaker import Breaker
from amqpjobs.jobs.cron import CronRule, Schedule, tick_id
from amqpjobs.jobs.outcome import Reject, Retry
from amqpjobs.jobs.registry import JobContext, JobDef
from amqpjobs.jobs.results import JobStatus, StateRecord
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.runtime.app import App
from amqpjobs.runtime.ledger import Claim, Ledger, SqliteLedger
from amqpjobs.runtime.ledger_postgres import PostgresLedger
from amqpjobs.runtime.results import ResultsStore, SqliteResults
from amqpjobs.runtime.results_postgres import PostgresResults
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions, TickEvent
from amqpjobs.runtime.sync_publisher import SyncPublisher
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import LoadedTopology, load_topology
from amqpjobs.topology.models import JobQueueLayout, Topology
from amqpjobs.wire.settings import BrokerSettings, broker_settings

if _typing.TYPE_CHECKING:
    from amqpjobs.runtime.payloads import PayloadStore
    from amqpjobs.runtime.payloads_file import FilePayloadStore
    from amqpjobs.runtime.payloads_postgres import PostgresPayloadStore
    from amqpjobs.runtime.payloads_s3 import S3PayloadStore

#: Imported when first used: an app without a payload store never loads them (README "Large payloads").
_LAZY = {
    "FilePayloadStore": "amqpjobs.runtime.payloads_file",
    "PayloadStore": "amqpjobs.runtime.payloads",
    "PostgresPayloadStore": "amqpjobs.runtime.payloads_postgres",
    "S3PayloadStore": "amqpjobs.runtime.payloads_s3",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amqpjobs' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


__all__ = [
    "AmqpJobsError",
    "App",
    "Breaker",
    "BrokerBlockedError",
    "BrokerError",
    "BrokerSettings",
    "BrokerUnavailableError",
    "BusyError",
    "ChannelClosedError",
    "Claim",
    "ConfigurationError",
    "CronRule",
    "DuplicateJobError",
    "FilePayloadStore",
    "InvalidPayloadError",
    "JobContext",
    "JobDef",
    "JobFailedError",
    "JobQueueLayout",
    "JobStatus",
    "Ledger",
    "LedgerUnavailableError",
    "LoadedTopology",
    "ManagementApiError",
    "MessageTooLargeError",
    "NotFoundError",
    "PayloadStore",
    "PayloadStoreError",
    "PostgresLedger",
    "PostgresPayloadStore",
    "PostgresResults",
    "PreconditionFailedError",
    "Problem",
    "PublishError",
    "PublishNackedError",
    "PublisherClosedError",
    "QueueFullError",
    "Reject",
    "ResourceLockedError",
    "ResultsStore",
    "ResultsUnavailableError",
    "Retry",
    "RetryPolicy",
    "S3PayloadStore",
    "Schedule",
    "Scheduler",
    "SchedulerOptions",
    "SignalNotSentError",
    "SqliteLedger",
    "SqliteResults",
    "StateRecord",
    "SyncPublisher",
    "TickEvent",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyValidationError",
    "UnaddressableNameError",
    "UnroutableError",
    "Worker",
    "WorkerOptions",
    "__version__",
    "broker_settings",
    "format_duration",
    "load_topology",
    "parse_duration",
    "tick_id",
]
