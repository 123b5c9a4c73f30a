"""What the console serves and how it lets people in (no I/O but the environment)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.settings import BrokerSettings

#: A bearer token (or the password of any basic-auth user) for a console on another address than loopback.
TOKEN_ENV: Final = "AMQPJOBS_CONSOLE_TOKEN"
#: Basic-auth user and password, the other way in.
USER_ENV: Final = "AMQPJOBS_CONSOLE_USER"
PASSWORD_ENV: Final = "AMQPJOBS_CONSOLE_PASSWORD"
#: Where the audit log goes unless ``--audit-log`` says.
AUDIT_ENV: Final = "AMQPJOBS_CONSOLE_AUDIT_LOG"
DEFAULT_PORT: Final = 8480
#: Fewest characters of a token: 16 random URL-safe characters are 96 bits, past guessing over HTTP.
MIN_TOKEN: Final = 16
#: How to make a token (32 random bytes, 43 URL-safe characters).
MAKE_TOKEN: Final = "python -c 'import secrets; print(secrets.token_urlsafe())'"
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1")
#: A root path (``--root-path``): URL path segments of unreserved characters (RFC 3986 section 2.3).
ROOT_PATH: Final = re.compile(r"(/[A-Za-z0-9._~-]+)+")


@dataclass(frozen=True)
class Credentials:
    """Who may use a console bound beyond loopback: a token, or a basic-auth user and password."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        """Refuse a token anyone could guess (:func:`token_problem`).

        Raises:
            ConfigurationError: names the problem and how to make a good token.

        """
        if self.token is not None and (issue := token_problem(self.token)):
            raise ConfigurationError(f"{TOKEN_ENV} {issue}; make one with: {MAKE_TOKEN}")

    @property
    def required(self) -> bool:
        """Whether requests must authenticate."""
        return bool(self.token or (self.user and self.password))

    def __repr__(self) -> str:  # never print a secret
        return f"Credentials(token={'***' if self.token else None}, user={self.user!r}, password=***)"


def token_problem(token: str) -> str | None:
    """Why ``token`` can't guard a console (blank, shorter than :data:`MIN_TOKEN`, holding whitespace), or None.

    The message never repeats the token.
    """
    if not token.strip():
        return "is set but blank"
    if len(token) < MIN_TOKEN:
        return f"is {len(token)} characters: give one of at least {MIN_TOKEN}"
    if any(c.isspace() for c in token):
        return "holds whitespace (a line end read from a file?): no Authorization header can carry it"
    return None


def password_problem(password: str) -> str | None:
    """Why ``password`` can't be the basic-auth password (blank, or whitespace at an end), or None.

    Spaces inside are fine; at an end they are most likely a line end read from a file, which
    no browser would send. The message never repeats the password.
    """
    if not password.strip():
        return "is set but blank"
    if password != password.strip():
        return "starts or ends with whitespace (a line end read from a file?): strip it"
    return None


def credentials_from_env(env: dict[str, str] | None = None) -> Credentials:
    """The token or basic-auth credentials of :data:`TOKEN_ENV`, :data:`USER_ENV` and :data:`PASSWORD_ENV`.

    A token or password set but blank counts as set, and is refused: an operator who exported
    it from a file that was empty must learn that nothing guards the console.

    Raises:
        ConfigurationError: only one of user and password is set, the password is blank or
            padded (:func:`password_problem`), or the token is blank, short or holds
            whitespace (:func:`token_problem`; the message says how to make one).

    """
    env = dict(os.environ) if env is None else env
    token = env.get(TOKEN_ENV)
    if PASSWORD_ENV in env and (issue := password_problem(env[PASSWORD_ENV])):
        raise ConfigurationError(f"{PASSWORD_ENV} {issue}: give the basic-auth password, or unset it")
    user, password = env.get(USER_ENV) or None, env.get(PASSWORD_ENV) or None
    if (user is None) != (password is None):
        raise ConfigurationError(f"set both {USER_ENV} and {PASSWORD_ENV} (basic auth), or {TOKEN_ENV}")
    return Credentials(token, user, password)


def root_path_problem(path: str) -> str | None:
    """Why ``path`` can't be the console's root path (``/jobs``, ``/ops/jobs``; "" for none), or None."""
    if path and (not path.startswith("/") or path.endswith("/") or not ROOT_PATH.fullmatch(path)):
        return "is not a path like /jobs: give a leading / and no trailing one, letters, digits and - _ . ~ / only"
    return None


def allowed_host_problem(host: str) -> str | None:
    """Why ``host`` can't be an ``--allowed-host`` (a Host header name: ``jobs.example.com``, an address), or None.

    The Host header is compared without its port (:meth:`ConsoleConfig.host_names`), so a
    scheme, a path or a port would never match any request.
    """
    name = host.strip()
    if not name:
        return "is empty: give a host name such as jobs.example.com, or leave the option out"
    if "://" in name:
        return "has a scheme: give the host name alone, e.g. jobs.example.com for https://jobs.example.com/"
    if "/" in name:
        return "has a path: give the host name alone (the path a proxy serves under is --root-path)"
    if any(c.isspace() for c in name):
        return "holds whitespace: give a host name such as jobs.example.com"
    bracketed_port = name.startswith("[") and "]:" in name  # [2001:db8::1]:8443
    if bracketed_port or (":" in name and not name.startswith("[") and not _is_ip(name)):
        return "has a port: give the host name alone (the Host header is matched without its port)"
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_audit_path() -> Path:
    """``$AMQPJOBS_CONSOLE_AUDIT_LOG``, else ``$XDG_STATE_HOME/amqpjobs/console-audit.jsonl`` (~/.local/state)."""
    if given := os.environ.get(AUDIT_ENV):
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "amqpjobs" / "console-audit.jsonl"


@dataclass(frozen=True)
class ConsoleConfig:
    """One console's settings.

    Attributes:
        broker: The broker and vhost it shows.
        host / port: Where it listens (the Host header must name one of :attr:`allowed_hosts`).
        read_only: Offer no action and refuse every POST.
        credentials: Required beyond loopback (:func:`check_bind`).
        audit_path: The audit log (JSON lines).
        app_ref: ``MODULE:APP``: its topology lists the job queues, its results store answers job lookups.
        allowed_hosts: Host names a request may name besides the loopback ones and ``host``.
        root_path: The path a reverse proxy serves the console under (``/jobs``; "" at the root):
            every URL the pages write starts with it (:func:`root_path_problem`).

    """

    broker: BrokerSettings
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    read_only: bool = False
    credentials: Credentials = field(default_factory=Credentials)
    audit_path: Path = field(default_factory=default_audit_path)
    app_ref: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    root_path: str = ""

    def __post_init__(self) -> None:
        """Refuse a root path no URL can start with, and an allowed host no Host header can name.

        Raises:
            ConfigurationError: names it and the form to give (:func:`root_path_problem`,
                :func:`allowed_host_problem`).

        """
        if issue := root_path_problem(self.root_path):
            raise ConfigurationError(f"--root-path {self.root_path!r} {issue}")
        for host in self.allowed_hosts:
            if issue := allowed_host_problem(host):
                raise ConfigurationError(f"--allowed-host {host!r} {issue}")

    def host_names(self) -> frozenset[str]:
        """Host header names accepted (lower case, without port or brackets)."""
        names = {*LOOPBACK_NAMES, *self.allowed_hosts}
        if self.host not in ("0.0.0.0", "::"):  # a wildcard is no name: give --allowed-host
            names.add(self.host)
        return frozenset(n.strip("[]").lower() for n in names)


def check_bind(config: ConsoleConfig) -> None:
    """Refuse to listen beyond loopback without credentials.

    Raises:
        ConfigurationError: ``host`` is not loopback and neither a token nor basic-auth
            credentials are in the environment.

    """
    if not is_loopback(config.host) and not config.credentials.required:
        raise ConfigurationError(
            f"--host {config.host!r} is not loopback: anyone who reaches it could replay or purge; set "
            f"{TOKEN_ENV} (a token), or {USER_ENV} and {PASSWORD_ENV} (basic auth), in the environment"
        )
