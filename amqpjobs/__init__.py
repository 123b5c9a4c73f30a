"""amqpjobs: reliable background jobs on RabbitMQ.

Every name below is imported when first used (PEP 562 ``__getattr__``): ``import amqpjobs``
alone loads nothing else, so that the console script can hold SIGTERM and SIGINT before the
slow imports (:mod:`amqpjobs.__main__`), and an app without a payload store never loads one.
"""

from __future__ import annotations

from amqpjobs._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom without importing typing (the console script's start)
if TYPE_CHECKING:
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
    from amqpjobs.jobs.replay_plan import ReplayOptions
    from amqpjobs.jobs.results import JobStatus, StateRecord
    from amqpjobs.jobs.retry import RetryPolicy
    from amqpjobs.runtime.app import App
    from amqpjobs.runtime.ledger import Claim, Ledger, SqliteLedger
    from amqpjobs.runtime.ledger_postgres import PostgresLedger
    from amqpjobs.runtime.payloads import PayloadStore
    from amqpjobs.runtime.payloads_file import FilePayloadStore
    from amqpjobs.runtime.payloads_postgres import PostgresPayloadStore
    from amqpjobs.runtime.payloads_s3 import S3PayloadStore
    from amqpjobs.runtime.results import ResultsStore, SqliteResults
    from amqpjobs.runtime.results_postgres import PostgresResults
    from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions, TickEvent
    from amqpjobs.runtime.sync_publisher import SyncPublisher
    from amqpjobs.runtime.worker import Worker, WorkerOptions
    from amqpjobs.topology.loader import LoadedTopology, load_topology
    from amqpjobs.topology.models import JobQueueLayout, Topology
    from amqpjobs.wire.settings import BrokerSettings, broker_settings

#: Where each public name lives.
_HOMES: dict[str, str] = {
    "format_duration": "amqpjobs.durations",
    "parse_duration": "amqpjobs.durations",
    "AmqpJobsError": "amqpjobs.errors",
    "BrokerBlockedError": "amqpjobs.errors",
    "BrokerError": "amqpjobs.errors",
    "BrokerUnavailableError": "amqpjobs.errors",
    "BusyError": "amqpjobs.errors",
    "ChannelClosedError": "amqpjobs.errors",
    "ConfigurationError": "amqpjobs.errors",
    "DuplicateJobError": "amqpjobs.errors",
    "InvalidPayloadError": "amqpjobs.errors",
    "JobFailedError": "amqpjobs.errors",
    "LedgerUnavailableError": "amqpjobs.errors",
    "ManagementApiError": "amqpjobs.errors",
    "MessageTooLargeError": "amqpjobs.errors",
    "NotFoundError": "amqpjobs.errors",
    "PayloadStoreError": "amqpjobs.errors",
    "PreconditionFailedError": "amqpjobs.errors",
    "Problem": "amqpjobs.errors",
    "PublishError": "amqpjobs.errors",
    "PublishNackedError": "amqpjobs.errors",
    "PublisherClosedError": "amqpjobs.errors",
    "QueueFullError": "amqpjobs.errors",
    "ResourceLockedError": "amqpjobs.errors",
    "ResultsUnavailableError": "amqpjobs.errors",
    "SignalNotSentError": "amqpjobs.errors",
    "TopologyConflictError": "amqpjobs.errors",
    "TopologyError": "amqpjobs.errors",
    "TopologyValidationError": "amqpjobs.errors",
    "UnaddressableNameError": "amqpjobs.errors",
    "UnroutableError": "amqpjobs.errors",
    "Breaker": "amqpjobs.jobs.breaker",
    "CronRule": "amqpjobs.jobs.cron",
    "Schedule": "amqpjobs.jobs.cron",
    "tick_id": "amqpjobs.jobs.cron",
    "Reject": "amqpjobs.jobs.outcome",
    "Retry": "amqpjobs.jobs.outcome",
    "JobContext": "amqpjobs.jobs.registry",
    "JobDef": "amqpjobs.jobs.registry",
    "ReplayOptions": "amqpjobs.jobs.replay_plan",
    "JobStatus": "amqpjobs.jobs.results",
    "StateRecord": "amqpjobs.jobs.results",
    "RetryPolicy": "amqpjobs.jobs.retry",
    "App": "amqpjobs.runtime.app",
    "Claim": "amqpjobs.runtime.ledger",
    "Ledger": "amqpjobs.runtime.ledger",
    "SqliteLedger": "amqpjobs.runtime.ledger",
    "PostgresLedger": "amqpjobs.runtime.ledger_postgres",
    "PayloadStore": "amqpjobs.runtime.payloads",
    "FilePayloadStore": "amqpjobs.runtime.payloads_file",
    "PostgresPayloadStore": "amqpjobs.runtime.payloads_postgres",
    "S3PayloadStore": "amqpjobs.runtime.payloads_s3",
    "ResultsStore": "amqpjobs.runtime.results",
    "SqliteResults": "amqpjobs.runtime.results",
    "PostgresResults": "amqpjobs.runtime.results_postgres",
    "Scheduler": "amqpjobs.runtime.scheduler",
    "SchedulerOptions": "amqpjobs.runtime.scheduler",
    "TickEvent": "amqpjobs.runtime.scheduler",
    "SyncPublisher": "amqpjobs.runtime.sync_publisher",
    "Worker": "amqpjobs.runtime.worker",
    "WorkerOptions": "amqpjobs.runtime.worker",
    "LoadedTopology": "amqpjobs.topology.loader",
    "load_topology": "amqpjobs.topology.loader",
    "JobQueueLayout": "amqpjobs.topology.models",
    "Topology": "amqpjobs.topology.models",
    "BrokerSettings": "amqpjobs.wire.settings",
    "broker_settings": "amqpjobs.wire.settings",
}


if not TYPE_CHECKING:  # type checkers see the imports above: a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'amqpjobs' has no attribute {name!r}")
        import importlib  # here: the console script's start imports nothing it can leave out

        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # the next use is a plain global
        return value


del TYPE_CHECKING


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
    "ReplayOptions",
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
