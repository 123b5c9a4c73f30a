"""The demo (``make demo``): a shop's background jobs, end to end, on the project's RabbitMQ.

1. start (or reuse) the local broker (``scripts/broker.sh up``);
2. create a fresh vhost and apply ``topology/`` to it;
3. start an SMTP mail sink on loopback, and a worker as a separate process
   (``amqpjobs consume examples.shop:app --concurrency 4``);
4. enqueue a few hundred jobs of ``examples/shop.py``, plus poison messages published raw
   and one payment whose card is declined;
5. wait until every job is done (recorded in the shop's SQLite database) or quarantined,
   print a summary, stop the worker with SIGTERM (it drains and exits 0).

Exit status 0 only when no job was lost, no side effect ran twice, every quarantined message
has the expected reason, and the worker exited 0; otherwise 1. Options: ``--vhost NAME``
(default: the vhost the path of ``--url`` names, else ``amqpjobs-demo``; both naming two is
refused, and so is ``/``: the demo deletes its vhost first), ``--cleanup`` (delete the vhost
and the work folder, ``.demo/<vhost>``, at the end; by default both stay for inspection and
the next run starts over with both), ``--url AMQP_URL`` and ``--management-url URL`` (a broker
of your own instead of step 1; the management URL is derived from the AMQP URL when left out:
port + 10000).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, timedelta
from email import message_from_bytes
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import shop  # examples/shop.py (sys.path[0] when run as a script); the worker imports it as examples.shop
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from pydantic import BaseModel

from amqpjobs.errors import AmqpJobsError
from amqpjobs.jobs.evidence import ERROR_MESSAGE, JOB, REASON
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.naming import vhost_problem
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from amqpjobs.wire.urls import split_urls

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VHOST = "amqpjobs-demo"
DEADLINE = 60.0  # seconds for every job to be done or quarantined
WORKER_EXIT_TIMEOUT = 40.0  # SIGTERM → exit (the worker's grace is 30 s)
CONCURRENCY = 4

N_CONFIRM = 200
N_CRM = 20
N_REPORTS = 20
N_PAYMENTS = 20  # captured; plus one with a declined card
DONE_EXPECTED = {
    "orders.confirm": N_CONFIRM,
    "orders.sync_crm": N_CRM,
    "reports.daily": N_REPORTS,
    "payments.capture": N_PAYMENTS,
}
DONE_SQL = {
    "orders.confirm": "SELECT count(*) FROM confirmations",
    "orders.sync_crm": "SELECT count(*) FROM crm_synced",
    "reports.daily": "SELECT count(*) FROM reports",
    "payments.capture": "SELECT count(*) FROM captures",
}
QUARANTINES = ("urgent.quarantine", "batch.quarantine", "billing.quarantine")
WORK_QUEUES = (
    "urgent", "urgent.retry.1s", "urgent.retry.5s", "urgent.retry.30s",
    "batch", "batch.retry.10s", "batch.retry.1m", "batch.retry.10m",
    "billing", "billing.retry.5s", "billing.retry.1m", "billing.retry.15m",
)  # fmt: skip


@dataclass(frozen=True)
class Poison:
    """A message published raw (not through amqpjobs), and the quarantine reason it must get."""

    what: str
    body: bytes
    job: str
    content_type: str
    reason: str


POISON = (
    Poison("body is not JSON", b'{"order_id": 1, oops', "orders.confirm", "application/json", "undecodable"),
    Poison("payload fails the model", b'{"order_id": "abc"}', "orders.confirm", "application/json", "invalid-payload"),
    Poison("unknown job name", b'{"order_id": 7}', "orders.refund", "application/json", "unknown-job"),
    Poison("text/plain body", b"order 7 please", "orders.confirm", "text/plain", "unsupported-content-type"),
)
#: (quarantine queue, reason) -> count the demo must find.
QUARANTINE_EXPECTED: Counter[tuple[str, str]] = Counter(
    [("urgent.quarantine", p.reason) for p in POISON] + [("billing.quarantine", "rejected")]
)


def say(text: str = "") -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------- SMTP sink
class MailSink:
    """aiosmtpd handler: counts received e-mails per order (header X-Order-Id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.per_order: Counter[str] = Counter()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        msg = message_from_bytes(envelope.original_content or b"")
        with self._lock:
            self.per_order[str(msg.get("X-Order-Id", "?"))] += 1
        return "250 Message accepted for delivery"

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.per_order)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------------------- jobs to enqueue
FIRST = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Niklaus")
LAST = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton", "Wirth")
CATALOG = (
    ("MUG-01", "Mug 'It works on my machine'", 1290),
    ("TEE-42", "T-shirt 'Don't panic'", 2200),
    ("STK-07", "Sticker pack", 450),
    ("BK-101", "Book: Reliable Messaging", 3990),
    ("CAB-05", "USB-C cable", 990),
)


def orders(rng: random.Random) -> list[shop.OrderConfirmation]:
    out = []
    for order_id in range(1001, 1001 + N_CONFIRM):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        items = [
            shop.LineItem(sku=sku, name=name, quantity=rng.randint(1, 3), unit_price_cents=price)
            for sku, name, price in rng.sample(CATALOG, rng.randint(1, 3))
        ]
        out.append(
            shop.OrderConfirmation(
                order_id=order_id,
                customer_name=f"{first} {last}",
                email=f"{first.lower()}.{last.lower()}.{order_id}@customer.example",
                items=items,
            )
        )
    return out


async def enqueue_everything(settings: BrokerSettings) -> int:
    """Enqueue the jobs (through the shop's App) and publish the poison messages raw. Returns the job count."""
    rng = random.Random(2024)
    confirmations = orders(rng)
    jobs: list[tuple[str, BaseModel, str, int | None]] = []  # (job, payload, job id, priority)
    for order in confirmations:
        jobs.append(("orders.confirm", order, f"confirm-{order.order_id}", 3))
    for order in confirmations[:N_CRM]:
        total = sum(i.quantity * i.unit_price_cents for i in order.items)
        crm = shop.CrmSync(order_id=order.order_id, customer_email=order.email, total_cents=total)
        jobs.append(("orders.sync_crm", crm, f"crm-{order.order_id}", None))
    first_day = date(2026, 1, 1)
    for i in range(N_REPORTS):
        report = shop.DailyReport(store="berlin" if i % 2 else "lyon", day=first_day + timedelta(days=i // 2))
        jobs.append(("reports.daily", report, f"report-{report.store}-{report.day.isoformat()}", None))
    payments = [
        shop.PaymentCapture(
            payment_id=f"pay-{o.order_id}",
            order_id=o.order_id,
            amount_cents=sum(i.quantity * i.unit_price_cents for i in o.items),
            card_token=f"tok_ok_{n}",
        )
        for n, o in enumerate(confirmations[-N_PAYMENTS:])
    ]
    payments.append(
        shop.PaymentCapture(payment_id="pay-9999", order_id=9999, amount_cents=4200, card_token="tok_declined_4000")
    )
    for payment in payments:
        jobs.append(("payments.capture", payment, payment.payment_id, None))

    app = shop.app
    await app.connect(settings)
    try:
        for start in range(0, len(jobs), 50):  # 50 publishes in flight, each waits for its broker confirm
            await asyncio.gather(
                *(app.enqueue(job, payload, job_id=job_id, priority=prio)
                  for job, payload, job_id, prio in jobs[start : start + 50])
            )  # fmt: skip
    finally:
        await app.close()

    connection = await aio_pika.connect(settings.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("jobs", ensure=False)
        for n, poison in enumerate(POISON, 1):
            message = aio_pika.Message(
                poison.body,
                content_type=poison.content_type,
                type=poison.job,
                message_id=f"poison-{n}",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await exchange.publish(message, routing_key="urgent", mandatory=True)
    finally:
        await connection.close()
    return len(jobs)


# ---------------------------------------------------------------------------- observing
@dataclass
class Progress:
    done: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    in_queues: int = 0

    @property
    def done_total(self) -> int:
        return sum(self.done.values())

    @property
    def quarantined_total(self) -> int:
        return sum(self.quarantined.values())


def db_count(db: Path, sql: str) -> int:
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        value: int = conn.execute(sql).fetchone()[0]
        return value
    except sqlite3.OperationalError:  # the worker has not created the tables yet
        return 0
    finally:
        conn.close()


async def depths(channel: aio_pika.abc.AbstractChannel, names: tuple[str, ...]) -> dict[str, int]:
    """Exact ready-message counts by passive declare (the management API's figures lag)."""
    out = {}
    for name in names:
        declared = await channel.declare_queue(name, passive=True)
        out[name] = declared.declaration_result.message_count or 0
    return out


async def observe(settings: BrokerSettings, db: Path) -> Progress:
    connection = await aio_pika.connect(settings.url)
    try:
        channel = await connection.channel()
        quarantined = await depths(channel, QUARANTINES)
        in_queues = sum((await depths(channel, WORK_QUEUES)).values())
    finally:
        await connection.close()
    return Progress({job: db_count(db, sql) for job, sql in DONE_SQL.items()}, quarantined, in_queues)


async def read_quarantine(settings: BrokerSettings) -> list[tuple[str, str, str, str]]:
    """(queue, reason, job, error message) of every quarantined message; the messages stay where they are."""
    found = []
    connection = await aio_pika.connect(settings.url)
    try:
        channel = await connection.channel()
        for name in QUARANTINES:
            queue = await channel.get_queue(name, ensure=False)
            held = []
            while (msg := await queue.get(no_ack=False, fail=False)) is not None:
                held.append(msg)  # unacked: the next get returns the next message
                headers: dict[str, Any] = dict(msg.headers or {})
                found.append((name, str(headers.get(REASON, "?")), str(headers.get(JOB, "")),
                              str(headers.get(ERROR_MESSAGE, ""))))  # fmt: skip
            for msg in held:
                await msg.nack(requeue=True)  # back into quarantine, for inspection or replay
    finally:
        await connection.close()
    return found


# ---------------------------------------------------------------------------- the run
def broker_urls() -> tuple[str, str]:
    """The broker's AMQP and management URLs; starts the node first unless it runs (``make demo`` started it)."""
    status = subprocess.run(["bash", str(ROOT / "scripts" / "broker.sh"), "status"], capture_output=True, text=True)
    out = status if status.returncode == 0 else subprocess.run(
        ["bash", str(ROOT / "scripts" / "broker.sh"), "up"], stdout=subprocess.PIPE, text=True, timeout=900
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"demo: scripts/broker.sh up failed (exit {out.returncode}); see its messages above")
    urls = subprocess.run(["bash", str(ROOT / "scripts" / "broker.sh"), "url"], stdout=subprocess.PIPE, text=True)
    lines = urls.stdout.split()
    if urls.returncode != 0 or len(lines) < 2:
        raise SystemExit(f"demo: scripts/broker.sh url failed (exit {urls.returncode})")
    return lines[-2], lines[-1]


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_worker(worker: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM the worker and wait for it to drain; None when it had to be killed."""
    if worker.poll() is not None:
        return worker.returncode
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(WORKER_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        return None


def run(vhost: str, cleanup: bool, url: str | None = None, management_url: str | None = None) -> int:
    started = time.monotonic()
    problems: list[str] = []
    say("amqpjobs demo: a shop's background jobs on RabbitMQ, end to end")
    say("  It starts RabbitMQ (or uses the node already running), a mail sink and a worker process, enqueues")
    say("  a few hundred jobs plus some bad messages, and checks that every job ran exactly once or was")
    say("  quarantined with a reason.")
    say("  jobs: examples/shop.py   topology: topology/jobs.toml   this script: examples/demo.py")
    say()

    if url is None:
        url, management_url = broker_urls()
    settings = broker_settings(url, management_url).with_vhost(vhost)
    say(f"[1/6] broker {settings.safe_url}  (management UI {settings.management_url}/)")

    with ManagementClient(settings) as mgmt:
        mgmt.delete_vhost(vhost)
        mgmt.create_vhost(vhost)
    applied = asyncio.run(apply_topology(ROOT / "topology", settings))
    queues = [c.desired.name for c in applied.plan.creates if c.desired.kind == "queue"]
    say(f"[2/6] fresh vhost {vhost!r}; topology/ applied: {len(applied.plan.creates)} objects created, "
        f"{len(queues)} of them queues (work queues urgent, batch, billing; retry tiers; quarantine)")  # fmt: skip

    # one per vhost: the next run starts over, as with the vhost; dots encoded too, so that ".." is no way out
    workdir = ROOT / ".demo" / quote(vhost, safe="").replace(".", "%2E")
    assert workdir.parent == ROOT / ".demo", workdir
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    db = workdir / "shop.sqlite3"
    log_path = workdir / "worker.log"
    sink = MailSink()
    smtp_port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=smtp_port, server_hostname="sink.localhost")
    controller.start()
    worker: subprocess.Popen[bytes] | None = None
    try:
        say(f"[3/6] SMTP mail sink listening on 127.0.0.1:{smtp_port} (receives the confirmation e-mails); "
            f"work folder {workdir.relative_to(ROOT)} (the shop's database, the worker's log)")  # fmt: skip

        exe = Path(sys.executable).with_name("amqpjobs")
        if not exe.exists():
            raise SystemExit(f"demo: {exe} not found: run `make install` first")
        env = {
            **os.environ,
            "AMQPJOBS_URL": settings.url,
            "AMQPJOBS_MANAGEMENT_URL": settings.management_url,
            "SHOP_DB": str(db),
            "SHOP_SMTP_HOST": "127.0.0.1",
            "SHOP_SMTP_PORT": str(smtp_port),
        }
        with log_path.open("wb") as log_file:
            worker = subprocess.Popen(
                [str(exe), "consume", "examples.shop:app", "--concurrency", str(CONCURRENCY)],
                cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        say(f"[4/6] worker process started (pid {worker.pid}): amqpjobs consume examples.shop:app "
            f"--concurrency {CONCURRENCY}; its log: {log_path}")  # fmt: skip

        n_jobs = asyncio.run(enqueue_everything(settings))
        expected_done = sum(DONE_EXPECTED.values())
        expected_quarantined = sum(QUARANTINE_EXPECTED.values())
        say(f"[5/6] enqueued {n_jobs} jobs: {N_CONFIRM} orders.confirm, {N_CRM} orders.sync_crm (fail once, "
            f"then retry), {N_REPORTS} reports.daily, {N_PAYMENTS + 1} payments.capture (one card declined); "
            f"and published {len(POISON)} poison messages raw ({', '.join(p.what for p in POISON)})")  # fmt: skip
        say(f"      waiting until all {expected_done} good jobs are done and {expected_quarantined} "
            f"messages are quarantined (deadline {DEADLINE:.0f} s)...")  # fmt: skip

        wait_start = time.monotonic()
        last_print = 0.0
        progress = Progress()
        while True:
            progress = asyncio.run(observe(settings, db))
            elapsed = time.monotonic() - wait_start
            settled = (
                progress.done_total >= expected_done
                and progress.quarantined_total >= expected_quarantined
                and progress.in_queues == 0
            )
            if settled or elapsed > DEADLINE or worker.poll() is not None:
                break
            if elapsed - last_print >= 2.0:
                last_print = elapsed
                say(f"      {elapsed:4.1f} s: {progress.done_total}/{expected_done} done, "
                    f"{progress.quarantined_total}/{expected_quarantined} quarantined, "
                    f"{progress.in_queues} waiting in work/retry queues")  # fmt: skip
            time.sleep(0.25)
        waited = time.monotonic() - wait_start
        if worker.poll() is not None:
            problems.append(f"the worker exited early with code {worker.returncode}")
            say(f"      the worker exited early (code {worker.returncode})")
        elif not settled:
            problems.append(f"not every job was done or quarantined within the {DEADLINE:.0f} s deadline")
            say(f"      deadline of {DEADLINE:.0f} s passed; stopping the worker")
        else:
            say(f"      every job accounted for after {waited:.1f} s")
            time.sleep(0.5)  # anything running twice would show up now

        exit_code = stop_worker(worker)
        # final figures, after the worker drained
        progress = asyncio.run(observe(settings, db))
        quarantine = asyncio.run(read_quarantine(settings))
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        controller.stop()

    # ------------------------------------------------------------------ summary
    emails = sink.snapshot()
    crm_failed = db_count(db, "SELECT count(*) FROM crm_runs WHERE outcome = 'failed'")
    crm_retried_ok = db_count(db, "SELECT count(*) FROM crm_runs WHERE outcome = 'ok' AND attempt = 2")
    duplicates = db_count(db, "SELECT count(*) FROM duplicates")
    emailed_twice = sorted(order for order, n in emails.items() if n > 1)

    say()
    say("[6/6] summary")
    say("  done, each recorded once in the shop's SQLite database:")
    for job, expected in DONE_EXPECTED.items():
        got = progress.done.get(job, 0)
        say(f"    {job:<18} {got:>4}/{expected}")
        if got < expected:
            problems.append(f"{job}: {expected - got} job(s) lost: neither done nor quarantined in time")
        elif got > expected:
            problems.append(f"{job}: {got} done, expected {expected}")
    say(f"  retried: {crm_failed} orders.sync_crm jobs failed on attempt 1 (ConnectionError), "
        f"{crm_retried_ok} succeeded on attempt 2 after the 1 s tier urgent.retry.1s")  # fmt: skip
    if crm_failed != N_CRM or crm_retried_ok != N_CRM:
        problems.append(f"orders.sync_crm: {crm_failed} failed first attempts and {crm_retried_ok} successful "
                        f"retries, expected {N_CRM} each")  # fmt: skip

    found = Counter((queue, reason) for queue, reason, _, _ in quarantine)
    say(f"  quarantined: {len(quarantine)} (reason from the amqpjobs-reason header; the messages stay in the "
        "quarantine queues)")  # fmt: skip
    for (queue, reason), n in sorted(found.items()):
        example = next((job, err) for q, r, job, err in quarantine if (q, r) == (queue, reason))
        detail = textwrap.shorten(example[1].splitlines()[0], 70, placeholder=" ...") if example[1] else ""
        say(f"    {queue:<19} {reason:<25} {n}  job={example[0] or '?'}: {detail}")
    if found != QUARANTINE_EXPECTED:
        problems.append(f"quarantine holds {dict(found)}, expected {dict(QUARANTINE_EXPECTED)}")

    say(f"  emails: {sum(emails.values())} received by the SMTP sink, for {len(emails)} distinct orders")
    if sum(emails.values()) != N_CONFIRM or len(emails) != N_CONFIRM:
        problems.append(f"the SMTP sink got {sum(emails.values())} e-mails for {len(emails)} orders, "
                        f"expected {N_CONFIRM} for {N_CONFIRM}")  # fmt: skip
    say(f"  duplicates: {duplicates} (side effects recorded twice) + {len(emailed_twice)} orders e-mailed twice")
    if duplicates or emailed_twice:
        problems.append(f"side effects ran twice: {duplicates} duplicate records, orders e-mailed twice: "
                        f"{emailed_twice[:10]}")  # fmt: skip
    if exit_code == 0:
        say("  worker: SIGTERM -> drained in-flight jobs and exited with code 0")
    else:
        problems.append(f"the worker did not exit 0 after SIGTERM (exit {exit_code}, None = killed)")
        say(f"  worker: exit code {exit_code} after SIGTERM")
    say(f"  total time: {time.monotonic() - started:.1f} s")

    if cleanup:
        with ManagementClient(settings) as mgmt:
            mgmt.delete_vhost(vhost)
    say()
    if problems:
        say("RESULT: FAILED")
        for problem in problems:
            say(f"  - {problem}")
        say(f"last lines of the worker log ({log_path}):")
        say(tail(log_path))
        return 1
    say(f"RESULT: OK: all {n_jobs} jobs done or quarantined with a reason, no side effect ran twice")
    if cleanup:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"  look around: shop database and worker log in {workdir}; vhost {vhost!r} (with the quarantined "
            f"messages) at {settings.management_url}/#/queues")  # fmt: skip
    return 0


def demo_vhost(url: str | None, vhost: str | None) -> str:
    """The vhost the demo (re)creates: the one the path of ``url`` names, else ``vhost``, else amqpjobs-demo.

    A URL without a path (or with ``/`` alone) names none. Raises ValueError when the URL and
    ``vhost`` name two, when either names ``/`` (the demo deletes its vhost first), or when the
    vhost has control characters.
    """
    path = urlsplit(split_urls(url)[0]).path if url and split_urls(url) else ""
    named = unquote(path[1:]) if len(path) > 1 else None
    if "/" in (named, vhost):  # --vhost / as much as a URL's %2F: the demo would delete everything in it
        raise ValueError(
            "the vhost '/' is the broker's default: the demo deletes and re-creates its vhost, so it never uses "
            "'/'; give another (--vhost, or the URL's path), or leave both out (vhost amqpjobs-demo)"
        )
    if named is not None and vhost is not None and named != vhost:
        raise ValueError(f"--vhost {vhost!r} and the vhost of --url {named!r} differ: give the vhost once")
    chosen = named or vhost or DEFAULT_VHOST
    if problem := vhost_problem(chosen):
        raise ValueError(problem)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--vhost", help=f"vhost to (re)create (default: the path of --url, else {DEFAULT_VHOST})")
    parser.add_argument("--cleanup", action="store_true", help="delete the vhost and the work folder at the end")
    parser.add_argument("--url", help="AMQP URL of a broker to use instead of starting the local one")
    parser.add_argument("--management-url", help="its management API URL (default: AMQP port + 10000)")
    args = parser.parse_args()
    try:
        vhost = demo_vhost(args.url, args.vhost)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return run(vhost, args.cleanup, args.url, args.management_url)
    except AmqpJobsError as exc:  # messages never contain credentials
        say(f"demo: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
