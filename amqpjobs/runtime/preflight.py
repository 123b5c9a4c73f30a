"""``consume --processes N``: what every child would refuse at its start, refused once by the supervisor first.

A child loads the app (:func:`~amqpjobs.runtime.loading.load_app`) and checks it with its
options (:func:`~amqpjobs.runtime.worker_config.check_worker`) before it connects; when that
fails, it fails the same way at every start. Left to the children, a typo (``--queues nosuch``)
started N of them, restarted each until the crash-loop rule tripped (5 exits before ready
within 60 s) and ended with a longer message than one worker's. The supervisor calls the same
two functions before it starts any child, so it refuses such input at once with one worker's
error and exit code (README "Worker processes").

Only the app module's own code failing while imported is left to the children
(:func:`~amqpjobs.runtime.loading.raised_by_module`): it may pass, and the crash loop is the
rule for it, as for a broker that refuses a child.
"""

from __future__ import annotations

import logging

from amqpjobs.errors import (
    BrokerError,
    ConfigurationError,
    LedgerUnavailableError,
    PayloadStoreError,
    ResultsUnavailableError,
)
from amqpjobs.runtime.loading import load_app, raised_by_module
from amqpjobs.runtime.worker_config import WorkerOptions, check_worker, require_served
from amqpjobs.wire.urls import redact_text

log = logging.getLogger("amqpjobs.supervisor")


def check_before_children(app_ref: str, options: WorkerOptions) -> bool:
    """Load the app ``app_ref`` and check it with ``options`` as each child's start would, in this process.

    Reads the app's module and topology files only: no broker, no store is asked (what needs
    them stays the children's, under the crash-loop rule). When the app module's own code
    raises while imported, one WARNING says so and this returns: the children import it again.

    Args:
        app_ref: ``module:attribute`` of the App, as given to ``consume``.
        options: The options every child gets.

    Returns:
        Whether the app was loaded (so its SQLite stores' files were opened here first): False when
        the app module's own code raised.

    Raises:
        ConfigurationError: ``app_ref`` names no module (or a module that can't be imported),
            no attribute or no App, or an App without jobs; the module raised a configuration error of amqpjobs; a
            ``--queues`` name is not a job queue of the app's topology (naming it and the
            topology's); a job's policy can't work with its queue (:func:`check_worker`).
        TopologyValidationError: the app's topology files are invalid.
    """
    try:
        app = load_app(app_ref)
    except (ConfigurationError, BrokerError, LedgerUnavailableError, ResultsUnavailableError, PayloadStoreError) as exc:
        if not raised_by_module(exc):
            raise
        log.warning(
            "the app's module failed while the supervisor imported it to check it (%s); starting the children "
            "anyway, each imports it again: its own error may pass (a child that exits before it is ready 5 "
            "times within 60s stops them all)",
            redact_text(str(exc)),
        )
        return False
    check_worker(app, options)
    require_served(app, options)
    return True
