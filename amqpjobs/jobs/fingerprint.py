"""A failure's stack fingerprint, and quarantine groups by it (no I/O).

Two failures share a fingerprint when they raised the same exception type through the same
code path: the exception type plus each frame's module and function, outermost first, with
no line numbers (an edit above the failing line must not split a group) and no paths (two
hosts with other install folders must not either, nor a new release deployed to a folder
named by its date, version or commit: :func:`module_of`). A broker-side dead-letter has no
traceback: its fingerprint is ``x-death: <reason>`` (RabbitMQ "Dead Letter Exchanges" ->
"Dead-Lettered Messages"). The console groups quarantined jobs by (job, reason, error type,
fingerprint) with :func:`failure_groups`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath, PureWindowsPath
from typing import Final, Protocol

#: A frame line of a Python traceback: ``  File "/srv/app/mail.py", line 12, in send``. Its blanks are
#: spaces and tabs (a ``\r`` at its end): ``\s*`` at the start also ran over line feeds, so each line
#: start of a run of blank lines was tried to its end (120,000 blank lines: 20 s).
_FRAME: Final = re.compile(r'^[ \t]*File "(?P<path>[^"\n]*)", line \d+, in (?P<func>\S+)[ \t\r]*$', re.MULTILINE)
#: Length of :func:`fingerprint_id` (hex digits of a SHA-256).
ID_LENGTH: Final = 12


#: Folders a module's dotted name starts after: an install prefix (``.../site-packages/acme/mail.py`` is
#: ``acme.mail``) or the standard library's (``/usr/lib/python3.11/socket.py`` is ``socket``).
_IMPORT_ROOT: Final = re.compile(r"^(?:site-packages|dist-packages|python\d+(?:\.\d+)*)$")
#: A release (deploy) folder: a timestamp or build number (6+ digits), a date, a version, a commit id.
_RELEASE: Final = re.compile(
    r"""^(?:
        .*\d{6,}.*                               # 20261130, 20261130120501, build-1234567
      | .*\d{4}-\d{2}-\d{2}.*                     # 2026-11-30_12-00
      | v?\d+[._-]\d[\w.+-]*                     # v1.4.2, 1.5.0rc1 (one way to match: no backtracking over splits)
      | (?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]{7,40}   # a commit id: 3f9a2c1e7b
    )$""",
    re.IGNORECASE | re.VERBOSE,
)


def module_of(path: str) -> str:
    """The module of a traceback's file path, without the folders a host or a release put it in.

    The dotted name after the last install root (``site-packages``, ``dist-packages``,
    ``python3.11``: there the module's name is known in full) or release folder (:data:`_RELEASE`: a timestamp, date,
    version or commit id, as deploy tools name them); with neither, the file and its folder.
    ``/srv/releases/20261130/app.py`` -> ``app``; ``.../site-packages/acme/mail.py`` ->
    ``acme.mail``; ``/srv/app/billing/mail.py`` -> ``billing.mail``; ``pkg/__init__.py`` ->
    ``pkg``; ``<string>`` as is.
    """
    if path.startswith("<"):
        return path
    pure = PureWindowsPath(path) if "\\" in path else PurePosixPath(path)
    parts = [p for p in pure.parts if p not in ("/", "\\") and not p.endswith((":\\", ":"))]
    if not parts:
        return path
    folders = parts[:-1]
    roots = [i for i, p in enumerate(folders) if _IMPORT_ROOT.match(p) or _RELEASE.match(p)]
    names = parts[roots[-1] + 1 :] if roots else parts[-2:]
    names[-1] = names[-1].removesuffix(".py")
    if names[-1] == "__init__" and len(names) > 1:
        names.pop()
    return ".".join(names)


def frames(traceback: str) -> list[str]:
    """The ``module:function`` of each frame of ``traceback``, outermost first (its line numbers dropped)."""
    return [f"{module_of(m['path'])}:{m['func']}" for m in _FRAME.finditer(traceback)]


def stack_fingerprint(error_type: str, traceback: str, reason: str) -> str:
    """The fingerprint text of one failure.

    Args:
        error_type: The exception's type (``builtins.ValueError``); "" for a broker-side dead-letter.
        traceback: The traceback text (evidence header ``amqpjobs-traceback``), "" when none.
        reason: The quarantine reason (``exhausted``, ``x-death:expired`` ...).

    Returns:
        ``x-death: <reason>`` for a broker-side dead-letter; else the error type and the frames,
        ``ValueError @ worker:run > mail:send``, or the type alone without a traceback.

    """
    if reason.startswith("x-death:") and not error_type:
        return f"x-death: {reason.removeprefix('x-death:')}"
    kind = error_type or reason or "?"
    stack = frames(traceback)
    return f"{kind} @ {' > '.join(stack)}" if stack else kind


def group_id(job: str, reason: str, error_type: str, fingerprint: str) -> str:
    """A short stable id of a group's key, for links and filters (12 hex digits of a SHA-256)."""
    key = "\x00".join((job, reason, error_type, fingerprint))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:ID_LENGTH]


class Failure(Protocol):
    """What :func:`failure_groups` reads of a quarantined job (a :class:`~amqpjobs.jobs.quarantine.QuarantinedJob`)."""

    @property
    def job(self) -> str: ...  # noqa: D102
    @property
    def reason(self) -> str: ...  # noqa: D102
    @property
    def error_type(self) -> str: ...  # noqa: D102
    @property
    def fingerprint(self) -> str: ...  # noqa: D102
    @property
    def error_message(self) -> str: ...  # noqa: D102
    @property
    def first_failed_at(self) -> datetime | None: ...  # noqa: D102
    @property
    def failed_at(self) -> datetime | None: ...  # noqa: D102


class Tally(Protocol):
    """A group's count and span (:class:`FailureGroup`, :class:`~amqpjobs.jobs.quarantine.Group`)."""

    count: int
    first_failure: datetime | None
    last_failure: datetime | None


def count_in(group: Tally, item: Failure) -> None:
    """Count ``item`` in ``group``: one more, and its failure times widen the group's first/last seen."""
    group.count += 1
    first = item.first_failed_at or item.failed_at
    if first is not None and (group.first_failure is None or first < group.first_failure):
        group.first_failure = first
    if item.failed_at is not None and (group.last_failure is None or item.failed_at > group.last_failure):
        group.last_failure = item.failed_at


@dataclass
class FailureGroup:
    """Quarantined jobs sharing job, reason, error type and stack fingerprint.

    Attributes:
        id: :func:`group_id` of the group's key (used in links and filters).
        count: Jobs in the group.
        first_failure / last_failure: Earliest first failure and latest last failure (UTC).
        sample: One error message of the group (the first seen).

    """

    job: str
    reason: str
    error_type: str
    fingerprint: str
    count: int = 0
    first_failure: datetime | None = None
    last_failure: datetime | None = None
    sample: str = ""

    @property
    def id(self) -> str:
        """The group's id (:func:`group_id`)."""
        return group_id(self.job, self.reason, self.error_type, self.fingerprint)


def failure_groups(items: Iterable[Failure]) -> list[FailureGroup]:
    """Group ``items`` by (job, reason, error type, fingerprint), biggest first, then by job and reason."""
    groups: dict[tuple[str, str, str, str], FailureGroup] = {}
    for item in items:
        key = (item.job, item.reason, item.error_type, item.fingerprint)
        group = groups.get(key)
        if group is None:
            group = groups[key] = FailureGroup(*key, sample=item.error_message)
        count_in(group, item)
    return sorted(groups.values(), key=lambda g: (-g.count, g.job, g.reason, g.error_type, g.fingerprint))
