"""A worker's breakers (:class:`amqpjobs.runtime.breakers.Breakers`) without a broker: notices, records, logs."""

from __future__ import annotations

import logging

import pytest

from amqpjobs import App, Breaker
from amqpjobs.jobs.breaker import Notice
from amqpjobs.runtime.breakers import Breakers
from amqpjobs.wire.breakers import OpenRecord
from amqpjobs.wire.settings import broker_settings

pytestmark = pytest.mark.version_independent

NOW = 1_764_565_500.0


def board(cool_down: float = 30.0) -> Breakers:
    app = App("a")
    app.job("j", queue="work", breaker=Breaker(failures=2, window=10, cool_down=cool_down))(lambda p, c: None)
    settings = broker_settings("amqp://guest:guest@127.0.0.1:5672/")
    return Breakers({"j": app.resolve("j")}, settings, clock=lambda: NOW)


def test_an_absurd_opening_heard_from_another_worker_is_cut_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    breakers = board()
    with caplog.at_level(logging.INFO, "amqpjobs.worker"):
        breakers.hear(Notice("open", "j", NOW, 1e300, "elsewhere").encode())  # was: OverflowError in the log line
    machine = breakers.machine("j")
    assert (machine.state, machine.opened_at, machine.until) == ("open", NOW, NOW + 30)
    assert "breaker job=j: the opening from elsewhere says until" in caplog.text
    assert "cut to" in caplog.text


def test_a_record_from_a_clock_ahead_waits_one_cool_down_at_most(caplog: pytest.LogCaptureFixture) -> None:
    breakers = board()
    with caplog.at_level(logging.INFO, "amqpjobs.worker"):
        breakers.adopt("j", OpenRecord(NOW + 600, NOW + 630, 2), " (read from work.breaker.j at start)")
    machine = breakers.machine("j")
    assert (machine.opened_at, machine.until) == (NOW, NOW + 30)
    assert "clock ahead" in caplog.text


def test_a_record_whose_cool_down_is_over_is_logged_half_open(caplog: pytest.LogCaptureFixture) -> None:
    breakers = board()
    with caplog.at_level(logging.INFO, "amqpjobs.worker"):
        breakers.adopt("j", OpenRecord(NOW - 60, NOW - 30, 2), " (read from work.breaker.j at start)")
    assert "no starts until" not in caplog.text
    assert "breaker job=j half-open: opened after 2 failure(s) within 10s at" in caplog.text
    assert "the cool-down is over; the next delivery of the job runs as the probe" in caplog.text
