"""The ``pytest11`` entry point of amqpjobs' pytest plugin (the fixtures are in :mod:`amqpjobs.testing.plugin`).

Outside the ``amqpjobs`` package on purpose: pytest imports entry-point plugins before
pytest-cov starts measuring, and importing ``amqpjobs`` that early would leave its
module-level code unmeasured. So this registers the real plugin at ``pytest_configure``,
once coverage runs.
"""

from __future__ import annotations

import pytest

PLUGIN = "amqpjobs.testing.plugin"


def pytest_configure(config: pytest.Config) -> None:
    """Register :mod:`amqpjobs.testing.plugin` (its fixtures)."""
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
