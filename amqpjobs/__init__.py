"""amqpjobs: reliable background jobs on RabbitMQ."""

from __future__ import annotations

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
    ManagementApiError,
    MessageTooLargeError,
    NotFoundError,
    PreconditionFailedError,
    Problem,
    PublishError,
    PublishNackedError,
    QueueFullError,
    ResourceLockedError,
    ResultsUnavailableError,
    TopologyConflictError,
    TopologyError,
    TopologyValidationError,
    UnroutableError,
)
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

__all__ = [
    "AmqpJobsError",
    "App",
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
    "InvalidPayloadError",
    "JobContext",
    "JobDef",
    "JobFailedError",
    "JobQueueLayout",
    "JobStatus",
    "Ledger",
    "LoadedTopology",
    "ManagementApiError",
    "MessageTooLargeError",
    "NotFoundError",
    "PostgresLedger",
    "PostgresResults",
    "PreconditionFailedError",
    "Problem",
    "PublishError",
    "PublishNackedError",
    "QueueFullError",
    "Reject",
    "ResourceLockedError",
    "ResultsStore",
    "ResultsUnavailableError",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "Scheduler",
    "SchedulerOptions",
    "SqliteLedger",
    "SqliteResults",
    "StateRecord",
    "SyncPublisher",
    "TickEvent",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyValidationError",
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
