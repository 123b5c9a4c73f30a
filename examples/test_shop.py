"""Testing the shop's handlers with no broker: copy this file next to your app and adapt it.

``amqpjobs.testing`` runs each job through the worker's own per-delivery code (payload
validation, timeouts, retry tiers, quarantine with evidence) against an in-memory broker
on a virtual clock: the CRM's retry below waits its 1 s tier without sleeping. It adds to
tests against a real RabbitMQ; it does not replace them (README "Testing your jobs").

Run with ``pytest examples/test_shop.py``; the ``async def`` tests need pytest-asyncio
(``pip install amqpjobs[testing]``), and ``pytestmark`` below marks them for it (or set
``asyncio_mode = "auto"`` in your pytest configuration).
"""

from __future__ import annotations

import smtplib
import sqlite3
from email.message import EmailMessage
from pathlib import Path
from typing import Any, ClassVar

import pytest
import shop

from amqpjobs import App, InvalidPayloadError
from amqpjobs.testing import TestBroker

pytestmark = pytest.mark.asyncio


class FakeSMTP:
    """Stands in for ``smtplib.SMTP``: keeps the messages the shop sends."""

    sent: ClassVar[list[EmailMessage]] = []

    def __init__(self, host: str, port: int, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> FakeSMTP:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def send_message(self, msg: EmailMessage) -> None:
        FakeSMTP.sent.append(msg)


@pytest.fixture(autouse=True)
def shop_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh shop database per test, and no real SMTP server."""
    db = tmp_path / "shop.sqlite3"
    monkeypatch.setenv("SHOP_DB", str(db))
    monkeypatch.setattr(smtplib, "SMTP", FakeSMTP)
    FakeSMTP.sent = []
    return db


@pytest.fixture
def amqpjobs_app() -> App:
    """The app the plugin's ``amqpjobs_broker`` fixture runs."""
    return shop.app


ORDER = {
    "order_id": 17,
    "customer_name": "Ada",
    "email": "ada@example.com",
    "items": [{"sku": "tea-1", "name": "Green tea", "quantity": 2, "unit_price_cents": 450}],
}


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


async def test_confirmation_mail_is_sent_and_recorded(amqpjobs_broker: TestBroker, shop_env: Path) -> None:
    await shop.app.enqueue("orders.confirm", ORDER, job_id="confirm-17")
    done = await amqpjobs_broker.drain()
    assert [(p.job, p.kind, p.attempt) for p in done] == [("orders.confirm", "succeeded", 1)]
    [mail] = FakeSMTP.sent
    assert mail["To"] == "ada@example.com"
    assert "9.00 EUR" in mail.get_content()  # 2 x 4.50
    assert rows(shop_env, "SELECT order_id, job_id, attempt FROM confirmations") == [(17, "confirm-17", 1)]


async def test_crm_sync_succeeds_on_its_retry_after_the_first_tier(amqpjobs_broker: TestBroker, shop_env: Path) -> None:
    before = amqpjobs_broker.clock.seconds
    await shop.app.enqueue("orders.sync_crm", {"order_id": 17, "customer_email": "a@b.co", "total_cents": 900})
    done = await amqpjobs_broker.drain()
    assert [p.kind for p in done] == ["retried", "succeeded"]
    assert amqpjobs_broker.clock.seconds - before == 1.0  # the urgent queue's first tier, "1s", on the virtual clock
    assert rows(shop_env, "SELECT attempt, outcome FROM crm_runs ORDER BY attempt") == [(1, "failed"), (2, "ok")]


async def test_declined_card_is_quarantined_with_evidence_not_retried(amqpjobs_broker: TestBroker) -> None:
    payment = {"payment_id": "pay-1", "order_id": 17, "amount_cents": 900, "card_token": "tok_declined_42"}
    await shop.app.enqueue("payments.capture", payment, job_id="pay-1")
    done = await amqpjobs_broker.drain()
    assert [p.kind for p in done] == ["quarantined"]
    [failed] = amqpjobs_broker.quarantine("billing")
    assert failed.reason == "rejected"
    assert failed.headers["amqpjobs-error-message"] == "card tok_declined_42 declined by issuer (do_not_honor)"
    assert failed.evidence.attempts == 1  # the amqpjobs-* evidence headers, parsed
    assert failed.evidence.error_type == "amqpjobs.jobs.outcome.Reject"
    assert failed.headers["amqpjobs-attempts"] == 1
    assert failed.payload["payment_id"] == "pay-1"


async def test_a_producer_in_another_language_sends_bytes_that_are_not_json(amqpjobs_broker: TestBroker) -> None:
    await amqpjobs_broker.publish_raw("jobs", "billing", b"\xff\xfe", type="payments.capture", message_id="bad-1")
    await amqpjobs_broker.drain()
    assert [m.reason for m in amqpjobs_broker.quarantine("billing")] == ["undecodable"]


async def test_a_payload_the_model_refuses_is_rejected_before_sending() -> None:
    async with TestBroker(shop.app) as broker:
        with pytest.raises(InvalidPayloadError, match="items"):
            await shop.app.enqueue("orders.confirm", {**ORDER, "items": []})
        assert await broker.drain() == []
