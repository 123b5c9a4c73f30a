"""The console's pages and actions (Starlette handlers; HTML from the Jinja2 templates, autoescaped)."""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from amqpjobs.console.actions import Actions
from amqpjobs.console.forms import FILTERS, FormError, action_form, filter_options, queue_of, selection_of, text_of
from amqpjobs.console.views import find_message, lookup, message_doc, overview, quarantine_page
from amqpjobs.errors import AmqpJobsError, ConfigurationError, NotFoundError
from amqpjobs.jobs.envelope import BLANK_AT_LOOKUP, job_id_problem
from amqpjobs.jobs.quarantine import Selection, format_when
from amqpjobs.jobs.replay_plan import DEFAULT_CANARY_TIMEOUT
from amqpjobs.printable import printable
from amqpjobs.topology.naming import parse_queue_name


def _state(request: Request) -> Any:
    return request.app.state.console


def root_of(request: Request) -> str:
    """The path the console is served under ("" at the root; ``/jobs`` behind a proxy, ``--root-path``).

    Every URL the console writes is this plus a path: no scheme, no host, so a TLS proxy in
    front of it (https outside, http inside) and a path prefix both work.
    """
    return str(request.scope.get("root_path", "")).rstrip("/")


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """``template`` with the console's common context (CSRF token, read-only, root path, the fragment helpers)."""
    console = _state(request)
    context.update(csrf_token=request.scope["state"]["csrf_token"], read_only=console.config.read_only,
                   when=format_when, vhost=console.config.broker.vhost, root=root_of(request))  # fmt: skip
    response: Response = console.templates.TemplateResponse(request, template, context, status_code=status)
    return response


def problem(request: Request, message: str, status: int = 400) -> Response:
    """An error page saying what was wrong (the text escaped like everything else)."""
    return render(request, "error.html", status, message=printable(message))


async def home(request: Request) -> Response:
    """The overview: every job queue's golden signals (refreshed by the page's script)."""
    return await _overview(request, "overview.html")


async def overview_fragment(request: Request) -> Response:
    """The overview's table alone (the page's script swaps it in; it keeps the last one on an error)."""
    return await _overview(request, "_overview_table.html")


async def _overview(request: Request, template: str) -> Response:
    console = _state(request)
    try:
        statuses = await overview(console.reads, console.app)
    except AmqpJobsError as exc:  # the broker or its management API is down: say so, and the page retries
        return problem(request, str(exc), 503)
    return render(request, template, statuses=statuses)


async def quarantine(request: Request) -> Response:
    """A quarantine or parked queue: groups by job, reason, error type and stack fingerprint; filters; messages."""
    try:
        queue = queue_of(request.query_params.get("queue"))
        return await _quarantine_view(request, queue, request.query_params)
    except AmqpJobsError as exc:
        return problem(request, str(exc), 404 if isinstance(exc, ConfigurationError) else 503)


async def _quarantine_view(request: Request, queue: str, values: Any, refused: FormError | None = None) -> Response:
    """The quarantine page of ``queue`` filtered by ``values`` (a query string, or a refused action's form).

    A refused form (``refused``) is shown again with its error (HTTP 400) and its values as
    typed, the messages it had checked still checked.

    Raises:
        ConfigurationError: no such queue. BrokerError: the broker failed.

    """
    chosen = selection_of(values)
    page = await quarantine_page(_state(request).reads, queue, replace(chosen, job_ids=None))
    filters = {k: text_of(values, k) for k in FILTERS}
    kept = {k: str(v) for k, v in values.items() if k not in ("csrf_token", "job_id")} if refused else {}
    return render(request, "quarantine.html", 400 if refused else 200, page=page, filters=filters,
                  filtered=replace(chosen, job_ids=None) != Selection(), values=kept,
                  checked=chosen.job_ids or frozenset() if refused else frozenset(),
                  form_error=str(refused) if refused else "", invalid=refused.field if refused else "",
                  options=filter_options, parked=_is_parked(queue),
                  canary_timeout=f"{DEFAULT_CANARY_TIMEOUT:g}s")  # fmt: skip


def _is_parked(queue: str) -> bool:
    """Whether ``queue`` is a parked queue: its pages offer Unpark, not Park (its messages are parked already)."""
    return parse_queue_name(queue).kind == "parked"


async def message(request: Request) -> Response:
    """One message: evidence, traceback, payload, properties and headers, replay history."""
    job_id = request.query_params.get("id", "")
    if not job_id:  # no message named: nothing to look for (a link from the messages table always has one)
        return problem(request, "id: give the job id of the message, e.g. /message?queue=work.quarantine&id=m-1", 400)
    try:
        queue = queue_of(request.query_params.get("queue"))
        found = await find_message(_state(request).reads, queue, job_id)
    except AmqpJobsError as exc:  # a queue it can't read is 404; the broker down is 503, as on every page
        return problem(request, str(exc), 404 if isinstance(exc, ConfigurationError) else 503)
    if found is None:
        return problem(request, f"no message of job {job_id!r} in {queue!r} (replayed, parked or purged?)", 404)
    audit = _state(request).audit.for_job(job_id)
    return render(request, "message.html", m=message_doc(found), audit=audit, queue=queue, parked=_is_parked(queue))


def _who(request: Request) -> tuple[str, str]:
    """(who, from where): the authenticated user, else the OS user running a loopback console."""
    user = request.scope["state"].get("user")
    if not user:
        try:
            user = f"{getpass.getuser()} (local)"
        except (OSError, KeyError):  # no USER and no passwd entry (a bare container)
            user = "(local)"
    return user, request.client.host if request.client else "?"


async def act(request: Request) -> Response:
    """POST replay / park / unpark / purge: start the run, then show its progress page.

    A bad field shows the page again with the field named, the fix, and the values as typed (400).
    """
    kind = request.path_params["kind"]
    if kind not in ("replay", "park", "unpark", "purge"):
        return problem(request, f"no action {kind!r}: replay, park, unpark or purge", 404)
    form = await request.form()
    actions: Actions = _state(request).actions
    try:
        asked = action_form(kind, form)
    except FormError as exc:
        if exc.field == "queue":  # no page to show again
            return problem(request, str(exc), 400)
        try:
            return await _quarantine_view(request, text_of(form, "queue"), form, exc)
        except AmqpJobsError as unreadable:  # the same field again (the page reads the form too): said once
            return problem(request, str(exc) if str(unreadable) == str(exc) else f"{exc} ({unreadable})", 400)
    # a form without a nonce (a script's POST) is not checked; one page's other button (park after replay) acts
    nonce = f"{kind}:{text_of(form, 'form_nonce')}" if text_of(form, "form_nonce") else ""
    if nonce and (earlier := actions.sent_forms.get(nonce)) is not None:
        return problem(request, f"this form was sent already (action {earlier}, {root_of(request)}/action/{earlier}); "
                       "a browser's back button or reload sends it again: reload the queue's page to act on what "
                       "is there now", 409)  # fmt: skip
    who, client = _who(request)
    if kind == "replay":
        run = actions.start_replay(asked.queue, asked.chosen, asked.rate, asked.canary, asked.canary_timeout,
                                   asked.params, who, client)  # fmt: skip
    elif kind in ("park", "unpark"):
        run = actions.start_move(kind, asked.queue, asked.chosen, asked.params, who, client)
    else:
        run = actions.start_purge(asked.queue, asked.chosen, asked.params, who, client)
    if nonce:
        actions.form_sent(nonce, run.id)
    return RedirectResponse(f"{root_of(request)}/action/{run.id}", status_code=303)


async def action(request: Request) -> Response:
    """An action's progress and, once it ended, its summary."""
    run = _state(request).actions.runs.get(request.path_params["run_id"])
    if run is None:
        return problem(request, "no such action (the console keeps the last 200; see the audit log)", 404)
    return render(request, "action.html", run=run, progress=run.progress())


async def stop(request: Request) -> Response:
    """POST: stop a running action as Ctrl-C stops the CLI's (:meth:`Actions.stop`), then show its page."""
    actions: Actions = _state(request).actions
    run = actions.runs.get(request.path_params["run_id"])
    if run is None:
        return problem(request, "no such action (the console keeps the last 200; see the audit log)", 404)
    if not actions.stop(run, _who(request)[0]):
        return problem(request, f"this {run.kind} already ended ({run.state}): nothing to stop", 409)
    return RedirectResponse(f"{root_of(request)}/action/{run.id}", status_code=303)


async def action_json(request: Request) -> Response:
    """An action's progress as JSON (the progress page polls it)."""
    run = _state(request).actions.runs.get(request.path_params["run_id"])
    if run is None:
        return JSONResponse({"error": "no such action"}, 404)
    return JSONResponse(run.progress())


async def job(request: Request) -> Response:
    """Job lookup by id: its record (with ``--app`` and a results store) and the queues that hold it."""
    job_id = request.query_params.get("id", "")  # as given: spaces around it are part of an id (job show's rule)
    if not job_id:
        return render(request, "job.html", found=None, job_id="")
    if issue := job_id_problem(job_id, blank=BLANK_AT_LOOKUP):
        return problem(request, issue, 400)
    try:
        found = await lookup(_state(request).reads, _state(request).app, job_id)
    except AmqpJobsError as exc:
        return problem(request, str(exc), 503)
    return render(request, "job.html", found=found, job_id=job_id)


async def audit(request: Request) -> Response:
    """The audit log, newest first."""
    return render(request, "audit.html", entries=_state(request).audit.recent())


#: Seconds between the comment lines an idle event stream sends: a client that left is noticed within this.
KEEPALIVE = 2.0


async def events(request: Request) -> Response:
    """Outcome events as server-sent events (``data: {"queue", "outcome"}``): the overview refreshes on each.

    Every client shares the console's one subscription (:class:`~amqpjobs.runtime.outcome_feed.OutcomeHub`),
    left when the client disconnects. The broker down is 503, as on every page; no events
    exchange is one ``unavailable`` event (the page then polls).
    """
    hub = _state(request).outcomes
    try:
        reader = await hub.join()
    except NotFoundError:
        return StreamingResponse(iter(["event: unavailable\ndata: {}\n\n"]), media_type="text/event-stream")
    except AmqpJobsError as exc:
        return problem(request, str(exc), 503)

    async def stream() -> AsyncIterator[str]:
        try:
            while not await request.is_disconnected():
                try:
                    event = await asyncio.wait_for(reader.get(), KEEPALIVE)
                except TimeoutError:
                    yield ": idle\n\n"  # a write to a client that left fails: the stream ends
                    continue
                yield f"data: {json.dumps({'queue': event.queue, 'outcome': event.outcome})}\n\n"
        finally:
            hub.leave(reader)  # no await: this runs when the stream is cancelled too

    return StreamingResponse(stream(), media_type="text/event-stream")


def routes(static_dir: str) -> list[Route | Mount]:
    """The console's routes."""
    return [
        Route("/", home),
        Route("/fragments/overview", overview_fragment),
        Route("/quarantine", quarantine),
        Route("/message", message),
        Route("/actions/{kind:str}", act, methods=["POST"]),
        Route("/action/{run_id:str}.json", action_json),
        Route("/action/{run_id:str}/stop", stop, methods=["POST"]),
        Route("/action/{run_id:str}", action, name="action"),
        Route("/job", job),
        Route("/audit", audit),
        Route("/events", events),
        Mount("/static", StaticFiles(directory=static_dir), name="static"),
    ]
