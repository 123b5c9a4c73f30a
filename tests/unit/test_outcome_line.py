"""The worker's outcome line: a job name, id or error of any length still leaves its outcome in the line."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import pytest

from amqpjobs import App, WorkerOptions
from amqpjobs.jobs.outcome import Outcome, Quarantine
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import MAX_LINE, TextFormatter, fit
from amqpjobs.runtime.recording import OutcomeRecords, PacedDeferrals


class Records(OutcomeRecords):
    def __init__(self) -> None:
        self.app = App("lines")
        self.options = WorkerOptions()
        self.stats = Counter()
        self.metrics = None
        self._deferral_lines = PacedDeferrals()
        self._on_outcome = None


def test_a_hostile_name_id_and_error_are_cut_and_the_outcome_stays_in_the_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcome = Outcome(
        Quarantine("unknown-job"), "\x01" * 6000, "id-" + "日" * 5000, 1, 0.0, True, "work",
        error="UnknownJob: " + "\x1b[31m" * 100,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="amqpjobs"):
        Records()._record(outcome)
    (record,) = caplog.records
    line = TextFormatter().format(record)
    assert len(line) <= MAX_LINE
    match = re.fullmatch(r'job=(".*?[^\\]") id=(".*?[^\\]"|\S+) attempt=1 duration=0\.000s outcome=quarantined '
                         r'reason=unknown-job error=(".*")', line.split(": ", 1)[1])  # fmt: skip
    assert match is not None, line
    name, job_id, error = match.groups()
    assert name.startswith('"\\x01\\x01')
    assert name.endswith(' more characters]"')
    assert job_id.startswith('"id-日日')
    assert error.startswith('"UnknownJob: \\x1b[31m')
    assert [len(name) <= 200, len(job_id) <= 200, len(error) <= 300] == [True, True, True]


def test_ordinary_values_are_written_whole(caplog: pytest.LogCaptureFixture) -> None:
    outcome = Outcome(Quarantine("rejected"), "mail.send", "order-42", 2, 0.25, True, "mail", error="Reject: no")
    with caplog.at_level(logging.INFO, logger="amqpjobs"):
        Records()._record(outcome)
    (record,) = caplog.records
    assert record.getMessage() == (
        'job=mail.send id=order-42 attempt=2 duration=0.250s outcome=quarantined reason=rejected error="Reject: no"'
    )


def test_fit_cuts_in_proportion_and_never_loops_on_a_limit_too_small() -> None:
    value, text = fit("\x01" * 6000, 200, logfmt_value)
    assert len(text) <= 200
    assert text == logfmt_value(value)
    assert value.startswith("\x01")
    assert value.endswith("more characters]")
    assert fit("order-42", 200, logfmt_value) == ("order-42", "order-42")
    value, text = fit("\x01" * 6000, 10, logfmt_value)  # 40 characters stay, escaped over 10: returned, not looped
    assert len(value) <= 40
    assert text == logfmt_value(value)


def test_the_line_is_the_record_log_info_would_make_and_the_loggers_filters_still_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import amqpjobs.runtime.recording as recording

    outcome = Outcome(Quarantine("rejected"), "mail.send", "order-42", 2, 0.25, True, "mail", error="Reject: no")
    worker_log = logging.getLogger("amqpjobs.worker")
    with caplog.at_level(logging.INFO, logger="amqpjobs"):
        Records()._record(outcome)
        (record,) = caplog.records
        source = Path(recording.__file__).read_text(encoding="utf-8").splitlines()
        assert (record.name, record.levelname, record.funcName) == ("amqpjobs.worker", "INFO", "_record")
        assert (record.pathname, record.filename, record.module) == (recording.__file__, "recording.py", "recording")
        assert "log.makeRecord(" in source[record.lineno - 1]  # the line that makes it, as findCaller would name
        assert (record.exc_info, record.stack_info) == (None, None)
        dropped = logging.Filter("elsewhere")  # a filter on the logger drops the line, as it drops log.info's
        worker_log.addFilter(dropped)
        try:
            Records()._record(outcome)
        finally:
            worker_log.removeFilter(dropped)
        worker_log.disabled = True
        try:
            Records()._record(outcome)
        finally:
            worker_log.disabled = False
        Records()._record(outcome)
    assert len(caplog.records) == 2
