"""A small shop's background jobs: the example app that ``examples/demo.py`` runs.

Run a worker for it from the repository root::

    SHOP_DB=/tmp/shop.sqlite3 SHOP_SMTP_PORT=8025 AMQPJOBS_URL=amqp://... \\
        amqpjobs consume examples.shop:app --concurrency 4

Jobs (queues and retry tiers come from ``topology/jobs.toml``):

* ``orders.confirm`` (queue ``urgent``): render an order confirmation e-mail, send it over
  SMTP, record it in SQLite;
* ``orders.sync_crm`` (``urgent``): push the order to a CRM whose API drops the first
  call of every order (a transient ``ConnectionError``), so it succeeds on the retry;
* ``reports.daily`` (``batch``): a slow report that writes one row;
* ``payments.capture`` (``billing``, a quorum queue): capture a payment; a declined card
  is rejected at once (quarantine, reason ``rejected``), never retried.

Every handler does its side effect, commits, and only then returns: the worker acks the
delivery after the handler returned, so a crash in between means a redelivery, never a
lost job. Each side effect is recorded under a UNIQUE business key (order id, payment id,
store + day); a second run for the same key is not hidden but written to the
``duplicates`` table, which the demo requires to stay empty.

Configuration is read when a job runs, never at import: ``SHOP_DB`` (SQLite file),
``SHOP_SMTP_HOST`` (default 127.0.0.1) and ``SHOP_SMTP_PORT`` (default 8025).
"""

from __future__ import annotations

import os
import smtplib
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from amqpjobs.jobs.outcome import Reject
from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App

ROOT = Path(__file__).resolve().parent.parent

app = App("shop", topology=ROOT / "topology", app_version="1.0.0")

SHOP_EMAIL = "orders@shop.example"
#: How long the daily report takes (seconds).
REPORT_SECONDS = 0.2


# ---------------------------------------------------------------------------- payloads
class LineItem(BaseModel):
    sku: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=200)
    quantity: int = Field(ge=1, le=1000)
    unit_price_cents: int = Field(ge=0)


class OrderConfirmation(BaseModel):
    order_id: int = Field(ge=1)
    customer_name: str = Field(min_length=1, max_length=200)
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)
    currency: Literal["EUR", "USD", "GBP"] = "EUR"
    items: list[LineItem] = Field(min_length=1)


class CrmSync(BaseModel):
    order_id: int = Field(ge=1)
    customer_email: str = Field(max_length=254)
    total_cents: int = Field(ge=0)


class DailyReport(BaseModel):
    store: str = Field(min_length=1, max_length=64)
    day: date


class PaymentCapture(BaseModel):
    payment_id: str = Field(min_length=1, max_length=64)
    order_id: int = Field(ge=1)
    amount_cents: int = Field(gt=0)
    currency: Literal["EUR", "USD", "GBP"] = "EUR"
    card_token: str = Field(min_length=1, max_length=64)


# ---------------------------------------------------------------------------- storage
SCHEMA = """
CREATE TABLE IF NOT EXISTS confirmations (
    order_id INTEGER PRIMARY KEY,
    email TEXT NOT NULL,
    message_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    sent_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS crm_runs (
    job_id TEXT NOT NULL,
    order_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS crm_synced (
    order_id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    store TEXT NOT NULL,
    day TEXT NOT NULL,
    confirmed_orders INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    at TEXT NOT NULL,
    UNIQUE (store, day)
);
CREATE TABLE IF NOT EXISTS captures (
    payment_id TEXT PRIMARY KEY,
    order_id INTEGER NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS duplicates (
    job TEXT NOT NULL,
    business_key TEXT NOT NULL,
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at TEXT NOT NULL
);
"""

_schema_lock = threading.Lock()
_schema_ready: set[str] = set()


def db_path() -> str:
    path = os.environ.get("SHOP_DB")
    if not path:
        raise RuntimeError("set SHOP_DB to the shop's SQLite file")
    return path


def open_db(path: str | None = None) -> sqlite3.Connection:
    """Open the shop database (creating its tables on first use in this process)."""
    path = path or db_path()
    conn = sqlite3.connect(path, timeout=30.0)
    conn.execute("PRAGMA busy_timeout = 30000")
    with _schema_lock:
        if path not in _schema_ready:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
            _schema_ready.add(path)
    return conn


@contextmanager
def transaction() -> Iterator[sqlite3.Connection]:
    """A connection whose work commits when the block ends normally (rolls back otherwise), then closes."""
    conn = open_db()
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _insert_once(conn: sqlite3.Connection, sql: str, params: tuple[object, ...], ctx: JobContext, key: str) -> None:
    """Run ``INSERT OR IGNORE``; if the key was already there, record a duplicate (same transaction)."""
    if conn.execute(sql, params).rowcount == 0:
        conn.execute(
            "INSERT INTO duplicates (job, business_key, job_id, attempt, at) VALUES (?, ?, ?, ?, ?)",
            (ctx.job, key, ctx.job_id, ctx.attempt, _now()),
        )


# ---------------------------------------------------------------------------- jobs
def render_confirmation(order: OrderConfirmation) -> EmailMessage:
    total = sum(i.quantity * i.unit_price_cents for i in order.items)
    lines = [f"Hello {order.customer_name},", "", f"thank you for your order #{order.order_id}:", ""]
    for item in order.items:
        cost = item.quantity * item.unit_price_cents
        lines.append(f"  {item.quantity:>3} x {item.name:<30} {cost / 100:>9.2f} {order.currency}")
    lines += ["", f"  Total{'':<34} {total / 100:>9.2f} {order.currency}", "", "The Shop"]
    msg = EmailMessage()
    msg["From"] = SHOP_EMAIL
    msg["To"] = order.email
    msg["Subject"] = f"Your order #{order.order_id} is confirmed"
    msg["Message-ID"] = f"<order-{order.order_id}@shop.example>"
    msg["X-Order-Id"] = str(order.order_id)
    msg.set_content("\n".join(lines) + "\n")
    return msg


@app.job("orders.confirm", queue="urgent", payload=OrderConfirmation, timeout="30s")
def confirm_order(order: OrderConfirmation, ctx: JobContext) -> None:
    """Send the confirmation e-mail, then record it under the order id."""
    msg = render_confirmation(order)
    host = os.environ.get("SHOP_SMTP_HOST", "127.0.0.1")
    port = int(os.environ.get("SHOP_SMTP_PORT", "8025"))
    # local_hostname: skip smtplib's getfqdn() (a DNS lookup) on every connection
    with smtplib.SMTP(host, port, local_hostname="shop.localhost", timeout=10) as smtp:
        smtp.send_message(msg)
    with transaction() as conn:
        _insert_once(
            conn,
            "INSERT OR IGNORE INTO confirmations (order_id, email, message_id, job_id, attempt, sent_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (order.order_id, order.email, msg["Message-ID"], ctx.job_id, ctx.attempt, _now()),
            ctx,
            f"order:{order.order_id}",
        )


@app.job("orders.sync_crm", queue="urgent", payload=CrmSync, timeout="30s")
def sync_crm(order: CrmSync, ctx: JobContext) -> None:
    """Push the order to the CRM. The (simulated) CRM API drops the first call of every order."""
    with transaction() as conn:
        if ctx.attempt == 1:
            conn.execute(
                "INSERT INTO crm_runs (job_id, order_id, attempt, outcome, at) VALUES (?, ?, ?, 'failed', ?)",
                (ctx.job_id, order.order_id, ctx.attempt, _now()),
            )
            conn.commit()
            raise ConnectionError(f"CRM API reset the connection while syncing order {order.order_id}")
        conn.execute(
            "INSERT INTO crm_runs (job_id, order_id, attempt, outcome, at) VALUES (?, ?, ?, 'ok', ?)",
            (ctx.job_id, order.order_id, ctx.attempt, _now()),
        )
        _insert_once(
            conn,
            "INSERT OR IGNORE INTO crm_synced (order_id, job_id, attempt, at) VALUES (?, ?, ?, ?)",
            (order.order_id, ctx.job_id, ctx.attempt, _now()),
            ctx,
            f"crm:{order.order_id}",
        )


@app.job("reports.daily", queue="batch", payload=DailyReport, timeout="5m")
def daily_report(report: DailyReport, ctx: JobContext) -> None:
    """A slow report: count the confirmed orders, write one row per store and day."""
    with transaction() as conn:
        (confirmed,) = conn.execute("SELECT count(*) FROM confirmations").fetchone()
        time.sleep(REPORT_SECONDS)  # the expensive part of a real report
        _insert_once(
            conn,
            "INSERT OR IGNORE INTO reports (store, day, confirmed_orders, job_id, at) VALUES (?, ?, ?, ?, ?)",
            (report.store, report.day.isoformat(), confirmed, ctx.job_id, _now()),
            ctx,
            f"report:{report.store}:{report.day.isoformat()}",
        )


class CardDeclined(Exception):
    """The card issuer said no: retrying will not help."""


def _charge(payment: PaymentCapture) -> None:
    """The (simulated) payment gateway."""
    if payment.card_token.startswith("tok_declined"):
        raise CardDeclined(f"card {payment.card_token} declined by issuer (do_not_honor)")


@app.job("payments.capture", queue="billing", payload=PaymentCapture, timeout="60s")
def capture_payment(payment: PaymentCapture, ctx: JobContext) -> None:
    """Capture the payment and record it under the payment id; a declined card is rejected, never retried."""
    try:
        _charge(payment)
    except CardDeclined as exc:
        raise Reject(str(exc)) from exc
    with transaction() as conn:
        _insert_once(
            conn,
            "INSERT OR IGNORE INTO captures (payment_id, order_id, amount_cents, currency, job_id, attempt, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (payment.payment_id, payment.order_id, payment.amount_cents, payment.currency, ctx.job_id,
             ctx.attempt, _now()),
            ctx,
            f"payment:{payment.payment_id}",
        )  # fmt: skip
