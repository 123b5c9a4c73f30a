"""A small client for the RabbitMQ management HTTP API (RabbitMQ "Management Plugin" → "HTTP API").

Used for what AMQP cannot tell: queue arguments and depths, vhosts, definitions. Errors
are translated into :class:`~amqpjobs.errors.ManagementApiError` /
:class:`~amqpjobs.errors.BrokerUnavailableError`, worded by :mod:`amqpjobs.wire.management_words`;
messages never contain credentials.
"""

from __future__ import annotations

import functools
import ssl
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from amqpjobs.errors import BrokerUnavailableError, ManagementApiError
from amqpjobs.printable import printable, shell_quote
from amqpjobs.topology.plan import ObjectState
from amqpjobs.wire import management_words as words
from amqpjobs.wire.cluster import connected_node, process_order
from amqpjobs.wire.live_objects import live_objects
from amqpjobs.wire.live_objects import queue_state as queue_state  # re-exported: its home was here
from amqpjobs.wire.rotation import attempt_timeout
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.tls import certificate_problem, refused_certificate, split_tls_options, ssl_context
from amqpjobs.wire.urls import node_address


def _q(name: str) -> str:
    """``name`` as one path segment of a management API URL: every reserved character percent-encoded.

    Dots stay (they are fine inside a name, and the curl commands we print stay readable); a
    whole segment ``.`` or ``..`` is a dot segment to the HTTP client and to RabbitMQ alike, even
    encoded (RFC 3986 5.2.4), so such vhosts are refused before any request
    (:func:`~amqpjobs.topology.naming.vhost_problem`).
    """
    return quote(name, safe="")


def delete_exchange_command(settings: BrokerSettings, exchange: str) -> str:
    """A shell command that deletes ``exchange`` of the settings' vhost through the management API.

    ``DELETE /api/exchanges/<vhost>/<name>``, both url-encoded (RabbitMQ "Management HTTP
    API"; rabbitmqctl has no command to delete an exchange). ``USER`` stands for the
    operator's user: credentials are never printed.
    """
    url = f"{settings.management_url.rstrip('/')}/api/exchanges/{_q(settings.vhost)}/{_q(exchange)}"
    return f"curl -u USER -X DELETE {shell_quote(url)}"


@functools.cache
def _plain_http_context() -> ssl.SSLContext:
    """The TLS context handed to an ``http://`` API's client, which never uses it: one per process.

    ``httpx.Client`` builds a TLS context when made, even for plain HTTP; its default
    (``verify=True``) loads the CA bundle, about 20 ms of CPU each time (measured on the bench
    machine: a worker made four at its start, beside its first deliveries). This one loads no
    CA and verifies as strictly as any, so a TLS handshake through it could only fail.
    """
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class ManagementClient:
    """Synchronous management API client for one broker (one node, or any node of a cluster).

    Args:
        settings: Broker settings (management URL(s) and credentials).
        timeout: Seconds to wait for each HTTP request (for its connection, and then for each
            part of its answer), at most as long as one AMQP connect attempt may take with the
            settings' connect timeout (:func:`~amqpjobs.wire.rotation.attempt_timeout`: 10 s by
            default, 2 s for the console's reads): an API port that accepts and never answers
            is unreachable as soon as a silent AMQP node is. Default: that bound.

    With several nodes and no management URL given, the client asks the API of the node this
    process's AMQP connection is on (:func:`~amqpjobs.wire.cluster.connected_node`), else the
    node a connection of this process tries first (one shuffled order per process); a request
    that can't reach one node's API goes to the next node's (any node of a cluster answers for
    all of it), and the client stays there. ``https`` to node ``i`` uses the TLS options of
    AMQP URL ``i`` (its ``cacertfile``, ``certfile``/``keyfile``, ``verify``,
    ``server_name_indication``); a management URL given uses broker URL 1's.

    Use as a context manager, or call :meth:`close`.

    """

    def __init__(self, settings: BrokerSettings, timeout: float | None = None) -> None:
        self.settings = settings
        bound = attempt_timeout(settings.connect_timeout)
        self.timeout = bound if timeout is None else min(timeout, bound)
        auth = (settings.username, settings.password)
        # (base, the node whose TLS options it uses): node i's derived API, or the one given (node 1's options)
        sources = list(zip(settings.node_management, range(len(settings.nodes)), strict=False)) or [
            (base, 0) for base in settings.management_urls
        ]
        self._addresses = tuple(node_address(url) for url in settings.nodes)
        if settings.node_management and len(sources) > 1:
            sources = [sources[i] for i in process_order(self._addresses)]
        self._http: dict[str, httpx.Client] = {}
        self._node_of: dict[str, int] = {}
        for base, i in sources:
            if base in self._http:
                continue
            verify = _plain_http_context()
            if base.startswith("https://"):
                where = f"management API TLS (from broker URL {i + 1})"
                verify = ssl_context(split_tls_options(settings.nodes[i])[1], where)
            self._http[base] = httpx.Client(auth=auth, timeout=self.timeout, verify=verify)
            self._node_of[base] = i
        self._bases = list(self._http)

    @property
    def base_url(self) -> str:
        """The management API in use (``http(s)://host:port``)."""
        return self._bases[0]

    def _follow_connection(self) -> None:
        """Put the API of the node this process's AMQP connection is on first (derived URLs only)."""
        if len(self._bases) < 2:
            return
        address = connected_node(self._addresses)
        for base in self._bases:
            if self._addresses[self._node_of[base]] == address and base != self._bases[0]:
                self._bases.remove(base)
                self._bases.insert(0, base)
                return

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connection pools."""
        for http in self._http.values():
            http.close()

    def request(
        self, method: str, path: str, json: Any = None, allow_404: bool = False, answers: tuple[int, ...] = ()
    ) -> Any:
        """Send one request to ``/api<path>`` and return the decoded JSON body (or None).

        ``answers``: error statuses whose JSON body is an answer, returned like a 200's (a
        health check's 503).

        Raises:
            BrokerUnavailableError: the management API cannot be reached.
            ManagementApiError: it answered with an error status (404 only when not
                ``allow_404``; then None is returned).

        """
        url = f"/api{path}"
        failures: list[tuple[str, str]] = []
        self._follow_connection()
        for tried in range(len(self._bases)):
            try:
                resp = self._send(method, url, json)
                break
            except httpx.HTTPError as exc:
                refused = refused_certificate(exc)
                if refused is not None:  # never tried elsewhere nor without verification
                    raise BrokerUnavailableError(
                        f"TLS: management API at {self.base_url} refused: {certificate_problem(refused)}"
                    ) from exc
                silent = isinstance(exc, httpx.TimeoutException)  # worded as a silent AMQP node is
                failures.append((self.base_url, f"no answer within {self.timeout:g}s" if silent else
                                 words.plain_http(self.base_url, exc) or f"{type(exc).__name__}: {exc}"))  # fmt: skip
                if not isinstance(exc, httpx.TransportError) or tried + 1 == len(self._bases):
                    raise BrokerUnavailableError(words.unreachable(self.settings, failures)) from exc
                self._bases.append(self._bases.pop(0))  # the next node's API; this one goes last
        if resp.status_code == 404 and allow_404:
            return None
        if resp.status_code == 404 and (path == "/overview" or not self._api_answers()):
            raise ManagementApiError(words.no_api(self.base_url), 404)
        if resp.status_code == 404 and path != f"/vhosts/{_q(self.settings.vhost)}" and not self._vhost_exists():
            raise ManagementApiError(words.no_vhost(self.settings.vhost, self.base_url), 404)
        if resp.status_code == 401:
            raise ManagementApiError(words.refused(self.base_url, self.settings.username, resp), 401)
        if resp.status_code >= 300 and resp.status_code not in answers:  # a redirect answers another URL: no answer
            answer = printable(resp.text[:500])  # its text reaches log lines: no control characters
            if 300 <= resp.status_code < 400:
                answer = f"redirected to {printable(resp.headers.get('location', '?'))} (not followed)"
            raise ManagementApiError(f"{method} {url} -> {resp.status_code}: {answer}", resp.status_code)
        if not resp.content:
            return None
        return resp.json()

    def _send(self, method: str, url: str, json: Any) -> httpx.Response:
        """One request to the current base; once more on a new connection when a kept-alive one was closed.

        The API may close an idle kept-alive connection just as it is reused: the request then
        ends with "Server disconnected without sending a response" (``RemoteProtocolError``),
        before any answer, and a new connection answers it (seen on RabbitMQ 4.3).
        """
        client = self._http[self.base_url]
        try:
            return client.request(method, self.base_url + url, json=json)
        except httpx.RemoteProtocolError:
            return client.request(method, self.base_url + url, json=json)

    def _api_answers(self) -> bool:
        """True when a management API answers at the base URL (asked after a 404: was it the URL that was wrong?)."""
        return self.request("GET", "/overview", allow_404=True) is not None

    def _vhost_exists(self) -> bool:
        """True when the settings' vhost exists (asked after a 404: was it the vhost that was missing?)."""
        return self.request("GET", f"/vhosts/{_q(self.settings.vhost)}", allow_404=True) is not None

    def overview(self) -> dict[str, Any]:
        """``GET /api/overview`` (versions, totals)."""
        result: dict[str, Any] = self.request("GET", "/overview")
        return result

    def broker_version(self) -> tuple[int, ...]:
        """The broker's version as a tuple, e.g. ``(3, 10, 8)``."""
        return parse_version(str(self.overview().get("rabbitmq_version", "0")))

    def exchange_types(self) -> frozenset[str] | None:
        """The exchange types the broker offers (``GET /api/overview``: ``x-consistent-hash`` only with its plugin).

        None when the overview lists none (not a broker that offers no type: nothing to check against).
        """
        types = frozenset(str(t.get("name")) for t in self.overview().get("exchange_types") or ())
        return types or None

    def running_nodes(self) -> dict[str, bool]:
        """Each cluster node's name and whether it runs, as the answering node sees it (``GET /api/nodes``)."""
        nodes: list[dict[str, Any]] = self.request("GET", "/nodes?columns=name,running")
        return {str(n["name"]): bool(n.get("running")) for n in nodes}

    def create_vhost(self, vhost: str) -> None:
        """Create ``vhost`` and give the client's user full permissions on it."""
        self.request("PUT", f"/vhosts/{_q(vhost)}", json={})
        self.request(
            "PUT",
            f"/permissions/{_q(vhost)}/{_q(self.settings.username)}",
            json={"configure": ".*", "write": ".*", "read": ".*"},
        )

    def delete_vhost(self, vhost: str) -> None:
        """Delete ``vhost`` and everything in it (no error when it does not exist)."""
        self.request("DELETE", f"/vhosts/{_q(vhost)}", allow_404=True)

    def alarms(self) -> list[str]:
        """The resource alarms in effect anywhere in the cluster: ``[]``, or e.g. ``["memory"]``, ``["disk"]``.

        ``GET /api/health/checks/alarms`` (RabbitMQ "Monitoring" -> "Health Checks"; 3.8.10+):
        200 without alarms, 503 listing ``{"node": ..., "resource": "memory" | "disk"}``; 3.10 says ``"disk space"``,
        named ``"disk"`` here as on 4.x (``BrokerBlockedError.alarm``, README "Backpressure").

        Raises:
            BrokerUnavailableError: the management API cannot be reached.
            ManagementApiError: it refused (e.g. a user without a management tag gets 401).

        """
        return sorted({"disk" if a["resource"] == "disk space" else a["resource"] for a in self.alarm_details()})

    def alarm_details(self) -> list[dict[str, str]]:
        """The resource alarms in effect, each ``{"node": ..., "resource": ...}`` (3.10 says ``"disk space"``).

        Raises:
            BrokerUnavailableError: the management API cannot be reached.
            ManagementApiError: it refused (e.g. a user without a management tag gets 401).

        """
        answer = self.request("GET", "/health/checks/alarms", answers=(503,)) or {}
        listed = [a for a in answer.get("alarms") or () if isinstance(a, dict)]
        found = {(str(a.get("node", "?")), str(a.get("resource", "?"))) for a in listed}
        return [{"node": node, "resource": resource} for node, resource in sorted(found)]

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        """``GET /api/queues/<vhost>/<name>``, or None when there is no such queue."""
        result: dict[str, Any] | None = self.request("GET", f"/queues/{_q(vhost)}/{_q(name)}", allow_404=True)
        return result

    def queues(self, vhost: str) -> list[dict[str, Any]]:
        """Every queue of ``vhost`` as the management API describes it."""
        result: list[dict[str, Any]] = self.request("GET", f"/queues/{_q(vhost)}")
        return result

    def exchanges(self, vhost: str) -> list[dict[str, Any]]:
        """Every exchange of ``vhost``."""
        result: list[dict[str, Any]] = self.request("GET", f"/exchanges/{_q(vhost)}")
        return result

    def bindings(self, vhost: str) -> list[dict[str, Any]]:
        """Every binding of ``vhost``."""
        result: list[dict[str, Any]] = self.request("GET", f"/bindings/{_q(vhost)}")
        return result

    def policies(self, vhost: str, operator: bool = False) -> list[dict[str, Any]]:
        """The policies (``operator``: the operator policies) of ``vhost``: ``GET /api/[operator-]policies/<vhost>``.

        Raises:
            ManagementApiError: also when the user may not read them (RabbitMQ lets a
                ``policymaker`` or ``administrator`` tag read policies).

        """
        kind = "operator-policies" if operator else "policies"
        result: list[dict[str, Any]] = self.request("GET", f"/{kind}/{_q(vhost)}") or []
        return result

    def import_definitions(self, vhost: str, definitions: dict[str, Any]) -> None:
        """``POST /api/definitions/<vhost>``: import a definitions document into ``vhost``."""
        self.request("POST", f"/definitions/{_q(vhost)}", json=definitions)

    def live_state(self, vhost: str) -> list[ObjectState]:
        """Exchanges (but the default and ``amq.*`` ones), queues and bindings of ``vhost`` (:func:`live_objects`)."""
        return live_objects(self.exchanges(vhost), self.queues(vhost), self.bindings(vhost))


def parse_version(text: str) -> tuple[int, ...]:
    """Turn ``"3.10.8"`` (or ``"4.0.5+1.g0"``) into ``(3, 10, 8)``; unknown parts become 0."""
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)
