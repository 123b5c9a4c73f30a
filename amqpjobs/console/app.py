"""The console's ASGI app: :func:`create_app`, and :func:`serve` that runs it with uvicorn."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.templating import Jinja2Templates

from amqpjobs.console.actions import Actions
from amqpjobs.console.audit import AuditLog
from amqpjobs.console.config import ConsoleConfig, check_bind
from amqpjobs.console.forms import form_nonce, key_field
from amqpjobs.console.routes import routes
from amqpjobs.console.security import Guard
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.replay_plan import MIN_REPLAY_RATE
from amqpjobs.printable import printable_lines
from amqpjobs.runtime.app import App
from amqpjobs.runtime.loading import load_app, load_app_reading_results
from amqpjobs.runtime.outcome_feed import CONNECT_WAIT, OutcomeHub
from amqpjobs.wire.settings import BrokerSettings

HERE = Path(__file__).resolve().parent


@dataclass
class Console:
    """What the handlers share: settings, app (``--app``), actions, audit log, templates, events' subscription."""

    config: ConsoleConfig
    #: The broker as the pages read it: a refused connect is retried for ``CONNECT_WAIT`` seconds at
    #: most, so a page answers 503 in seconds with the broker down, not after a worker's 30 s.
    reads: BrokerSettings
    app: App | None
    actions: Actions
    audit: AuditLog
    templates: Jinja2Templates
    outcomes: OutcomeHub


def _shown(value: Any) -> Any:
    """What a template writes for ``value``: text with its control characters escaped (line feeds kept).

    A job's text (payload, error, header) comes from publishers: an escape sequence or a
    right-to-left override must not reach the page raw. Autoescaping then escapes the HTML.
    Markup (our own, e.g. ``tojson``) is left as it is.
    """
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable_lines(value)
    return value


def _load(app_ref: str, read_only: bool) -> App:
    """The ``--app``: its stores never created here; a SQLite results file that is not there is refused (exit 2).

    Its job lookup reads the results store; its park, unpark and replay record into it
    (unless ``--read-only``): a typo'd path is no empty store.
    """
    return load_app_reading_results(app_ref) if read_only else load_app(app_ref, existing=True)


def create_app(config: ConsoleConfig, csrf_token: str | None = None) -> Starlette:
    """The console for ``config`` (a test may fix ``csrf_token``; by default a random one per process).

    Raises:
        ConfigurationError: ``--app`` can't be loaded, or the address needs credentials
            that are not there (:func:`~amqpjobs.console.config.check_bind`).

    """
    check_bind(config)
    app = _load(config.app_ref, config.read_only) if config.app_ref else None
    audit = AuditLog(config.audit_path)
    if not config.read_only:  # a read-only console writes no audit line
        audit.check()
    layouts = {lay.name: lay for lay in app.topology().layouts()} if app is not None else None
    idempotent = frozenset(job.name for job in app if job.idempotent) if app is not None else frozenset()
    served = {job.name: job.queue for job in app} if app is not None else None  # a job it lacks stays, named
    actions = Actions(config.broker, audit, app.results if app is not None else None, layouts, idempotent,
                      served, app.name if app is not None else "")  # fmt: skip
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, finalize=_shown)
    env.globals["form_nonce"] = form_nonce  # each action form once: a re-sent one (back button) is refused
    env.filters["key_field"] = key_field  # a form field sending a message's key back as it is
    env.globals["min_rate"] = MIN_REPLAY_RATE  # the rate fields' floor: the server's and the CLI's (helper-230)
    templates = Jinja2Templates(env=env)
    reads = config.broker.with_connect_timeout(min(config.broker.connect_timeout, CONNECT_WAIT))
    outcomes = OutcomeHub(reads)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await outcomes.close()
            await actions.close()
            if app is not None:
                await app.close()

    web = Starlette(routes=routes(str(HERE / "static")), lifespan=lifespan)
    web.state.console = Console(config, reads, app, actions, audit, templates, outcomes)
    web.add_middleware(Guard, config=config, csrf_token=csrf_token)
    return web


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening (``port`` 0: a free one the system picks).

    Raises:
        ConfigurationError: the address can't be listened on (the port is in use, the address
            is not this host's ...): names it, and says to give another ``--port`` or ``--port 0``.

    """
    shown = f"[{host}]" if ":" in host else host
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]  # fmt: skip
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        raise ConfigurationError(
            f"can't listen on {shown}:{port} ({exc.strerror or exc}): give another --port, or --port 0 for a free one"
        ) from None
    return sock


def serve(config: ConsoleConfig, listening: Callable[[int], None] | None = None) -> None:
    """Check ``config``, listen, call ``listening`` with the port bound, then serve until interrupted.

    uvicorn serves on the socket bound here (access log off), so ``listening`` (the CLI's
    "console on http://..." line) runs only once every check passed and the port is bound,
    with the port the system chose for ``--port 0``.

    Raises:
        ConfigurationError: as :func:`create_app`, or :func:`listen`.

    """
    import uvicorn

    web = create_app(config)
    sock = listen(config.host, config.port)
    if listening is not None:
        listening(sock.getsockname()[1])
    # an open page keeps its event stream: Ctrl-C waits 5 s for it at most
    server = uvicorn.Server(uvicorn.Config(web, log_level="warning", access_log=False, server_header=False,
                                           timeout_graceful_shutdown=5, root_path=config.root_path))  # fmt: skip
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
