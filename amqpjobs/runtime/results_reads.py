"""Reading job states back: :meth:`App.job_status` and :meth:`App.result` (README "Job status and results")."""

from __future__ import annotations

from typing import Any

from amqpjobs.durations import parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.results import JobStatus
from amqpjobs.runtime.results import ResultsStore, read_status, wait_result


class JobResults:
    """The results-store half of :class:`~amqpjobs.runtime.app.App` (its ``results`` and ``name``)."""

    name: str
    results: ResultsStore | None

    def _results_store(self) -> ResultsStore:
        if self.results is None:
            raise ConfigurationError(
                f"app {self.name!r} has no results store: App(..., results=SqliteResults(path) or PostgresResults(url))"
            )
        return self.results

    async def job_status(self, job_id: str) -> JobStatus:
        """The state of job ``job_id`` as the results store has it (README "Job status and results").

        Returns:
            A :class:`~amqpjobs.jobs.results.JobStatus`: ``state`` is ``unknown`` when there is
            no record (never written, pruned, or written while the store was down) or when a
            ``running`` record's lease passed (its worker vanished).

        Raises:
            ConfigurationError: the app has no results store.
            ResultsUnavailableError: the store can't be read now.
        """
        return await read_status(self._results_store(), job_id)

    async def result(self, job_id: str, timeout: float | str = 60.0, poll: float | str = 0.2) -> Any:  # noqa: ASYNC109
        # the issue names it ``timeout=``: a polling deadline, not a cancellation scope
        """Wait for job ``job_id`` to reach a terminal state, polling the results store; its return value.

        Args:
            job_id: The job id (what :meth:`enqueue` returned).
            timeout: Seconds (or a duration string) to wait at most.
            poll: Seconds between reads of the store.

        Returns:
            The handler's return value (decoded JSON; None when it returned None).

        Raises:
            JobFailedError: the job was quarantined or parked (``reason``, ``error``).
            ResultsUnavailableError: it succeeded but its value was not stored (not JSON, too large).
            TimeoutError: no terminal state in time; the message names the last state seen.
            ConfigurationError: the app has no results store.
        """
        return await wait_result(self._results_store(), job_id, parse_duration(timeout), parse_duration(poll))
