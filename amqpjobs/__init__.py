"""amqpjobs: reliable background jobs on RabbitMQ."""

from __future__ import annotations

from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.errors import (
    AmqpJobsError,
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    ManagementApiError,
    Problem,
    TopologyConflictError,
    TopologyError,
    TopologyValidationError,
)
from amqpjobs.topology.loader import LoadedTopology, load_topology
from amqpjobs.topology.models import JobQueueLayout, Topology

__version__ = "0.1.0"

__all__ = [
    "AmqpJobsError",
    "BrokerError",
    "BrokerUnavailableError",
    "ConfigurationError",
    "JobQueueLayout",
    "LoadedTopology",
    "ManagementApiError",
    "Problem",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyValidationError",
    "__version__",
    "format_duration",
    "load_topology",
    "parse_duration",
]
