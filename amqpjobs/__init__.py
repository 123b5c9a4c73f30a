"""amqpjobs: reliable background jobs on RabbitMQ."""

from __future__ import annotations

__version__ = "0.1.0"

from amqpjobs.durations import format_duration, parse_duration  # noqa: E402
from amqpjobs.errors import (  # noqa: E402
    AmqpJobsError,
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    InvalidPayloadError,
    ManagementApiError,
    MessageTooLargeError,
    Problem,
    PublishError,
    PublishNackedError,
    TopologyConflictError,
    TopologyError,
    TopologyValidationError,
    UnroutableError,
)
from amqpjobs.jobs.outcome import Reject, Retry  # noqa: E402
from amqpjobs.jobs.registry import JobContext, JobDef  # noqa: E402
from amqpjobs.jobs.retry import RetryPolicy  # noqa: E402
from amqpjobs.runtime.app import App, SyncPublisher  # noqa: E402
from amqpjobs.runtime.worker import Worker, WorkerOptions  # noqa: E402
from amqpjobs.topology.loader import LoadedTopology, load_topology  # noqa: E402
from amqpjobs.topology.models import JobQueueLayout, Topology  # noqa: E402
from amqpjobs.wire.settings import BrokerSettings, broker_settings  # noqa: E402

__all__ = [
    "AmqpJobsError",
    "App",
    "BrokerError",
    "BrokerSettings",
    "BrokerUnavailableError",
    "ConfigurationError",
    "InvalidPayloadError",
    "JobContext",
    "JobDef",
    "JobQueueLayout",
    "LoadedTopology",
    "ManagementApiError",
    "MessageTooLargeError",
    "Problem",
    "PublishError",
    "PublishNackedError",
    "Reject",
    "Retry",
    "RetryPolicy",
    "SyncPublisher",
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
]
