"""Stack fingerprints and the console's failure groups (issue 26): a table of tracebacks."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from amqpjobs.jobs import evidence
from amqpjobs.jobs.fingerprint import failure_groups, frames, group_id, stack_fingerprint
from amqpjobs.jobs.quarantine import Selection, describe

TB_MAIL = """Traceback (most recent call last):
  File "/srv/venv/lib/python3.11/site-packages/amqpjobs/runtime/deliveries.py", line 210, in run_handler
    result = await handler(payload, ctx)
  File "/srv/app/billing/mail.py", line 12, in send
    raise ValueError("bad address: x@y")
ValueError: bad address: x@y
"""
# the same code path after an edit above the failing line, on a host with another install folder
TB_MAIL_MOVED = TB_MAIL.replace("line 210", "line 233").replace("line 12", "line 19").replace("/srv/venv", "/opt/v")
TB_OTHER_PATH = TB_MAIL.replace("in send", "in send_later")
TB_PACKAGE_INIT = '  File "/srv/app/billing/__init__.py", line 3, in charge\nKeyError: 1\n'
TB_WINDOWS = '  File "C:\\\\app\\\\billing\\\\mail.py", line 4, in send\n'
TB_CHAINED = TB_MAIL + "\nDuring handling of the above exception, another exception occurred:\n\n" + TB_PACKAGE_INIT

RUN = "amqpjobs.runtime.deliveries:run_handler"
FINGERPRINTS = [
    pytest.param("builtins.ValueError", TB_MAIL, "exhausted",
                 f"builtins.ValueError @ {RUN} > billing.mail:send", id="frames"),
    pytest.param("builtins.ValueError", TB_MAIL_MOVED, "exhausted",
                 f"builtins.ValueError @ {RUN} > billing.mail:send", id="no-line-numbers"),
    pytest.param("builtins.ValueError", TB_OTHER_PATH, "exhausted",
                 f"builtins.ValueError @ {RUN} > billing.mail:send_later", id="other-function"),
    pytest.param("KeyError", TB_PACKAGE_INIT, "permanent", "KeyError @ billing:charge", id="package-init"),
    pytest.param("OSError", TB_WINDOWS, "exhausted", "OSError @ billing.mail:send", id="windows-path"),
    pytest.param("KeyError", TB_CHAINED, "exhausted",
                 f"KeyError @ {RUN} > billing.mail:send > billing:charge", id="chained"),
    pytest.param("amqpjobs.Reject", "", "rejected", "amqpjobs.Reject", id="no-traceback"),
    pytest.param("", "", "x-death:expired", "x-death: expired", id="broker-expired"),
    pytest.param("", "", "x-death:delivery_limit", "x-death: delivery_limit", id="broker-delivery-limit"),
    pytest.param("", "", "timeout", "timeout", id="no-type-no-trace"),
]  # fmt: skip


@pytest.mark.parametrize(("error_type", "traceback", "reason", "expected"), FINGERPRINTS)
def test_stack_fingerprint(error_type: str, traceback: str, reason: str, expected: str) -> None:
    assert stack_fingerprint(error_type, traceback, reason) == expected


def test_frames_keep_the_order_outermost_first() -> None:
    assert frames(TB_MAIL) == ["amqpjobs.runtime.deliveries:run_handler", "billing.mail:send"]
    assert frames("no traceback here") == []


T1 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
T2 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def quarantined(job: str, tb: str, at: str, first: str, error_type: str = "builtins.ValueError") -> dict[str, str]:
    return {
        evidence.JOB: job, evidence.REASON: "exhausted", evidence.ERROR_TYPE: error_type,
        evidence.ERROR_MESSAGE: f"{error_type} in {job}", evidence.TRACEBACK: tb,
        evidence.LAST_FAILURE_AT: at, evidence.FIRST_FAILURE_AT: first,
    }  # fmt: skip


def test_failure_groups_count_and_span_each_code_path() -> None:
    items = [
        describe(quarantined("mail", TB_MAIL, "2026-11-29T08:30:00Z", "2026-11-29T08:00:00Z"), "a", None),
        describe(quarantined("mail", TB_MAIL_MOVED, "2026-11-29T09:00:00Z", "2026-11-29T08:40:00Z"), "b", None),
        describe(quarantined("mail", TB_OTHER_PATH, "2026-11-29T08:10:00Z", "2026-11-29T08:05:00Z"), "c", None),
        describe(quarantined("sms", TB_MAIL, "2026-11-29T08:20:00Z", "2026-11-29T08:20:00Z"), "d", None),
        describe({"x-death": [{"reason": "expired", "queue": "mail", "time": T1}]}, "e", "mail"),
    ]
    groups = failure_groups(items)
    rows = [(g.job, g.reason, g.count, g.fingerprint.split(" @ ")[-1], g.first_failure, g.last_failure) for g in groups]
    assert rows == [
        ("mail", "exhausted", 2, "amqpjobs.runtime.deliveries:run_handler > billing.mail:send", T1, T2),
        ("mail", "exhausted", 1, "amqpjobs.runtime.deliveries:run_handler > billing.mail:send_later",
         datetime(2026, 11, 29, 8, 5, tzinfo=UTC), datetime(2026, 11, 29, 8, 10, tzinfo=UTC)),
        ("mail", "x-death:expired", 1, "x-death: expired", T1, T1),
        ("sms", "exhausted", 1, "amqpjobs.runtime.deliveries:run_handler > billing.mail:send",
         datetime(2026, 11, 29, 8, 20, tzinfo=UTC), datetime(2026, 11, 29, 8, 20, tzinfo=UTC)),
    ]  # fmt: skip
    assert groups[0].sample == "builtins.ValueError in mail"
    assert len({g.id for g in groups}) == 4
    # the group id selects exactly its members: a selection the replay, park and purge take
    chosen = Selection(group=groups[0].id)
    assert [i.job_id for i in items if chosen.matches(i)] == ["a", "b"]
    assert groups[0].id == group_id("mail", "exhausted", "builtins.ValueError", groups[0].fingerprint)


SEARCHES = [
    pytest.param(Selection(search="IN SMS"), ["x-42"], id="search-error-message-case-insensitive"),
    pytest.param(Selection(search="x-23"), ["x-23"], id="search-job-id"),
    pytest.param(Selection(job_ids=frozenset({"x-17", "x-31"})), ["x-17", "x-31"], id="job-ids"),
    pytest.param(Selection(job="mail", search="nothing like it"), [], id="no-match"),
]


@pytest.mark.parametrize(("chosen", "expected"), SEARCHES)
def test_selection_search_and_ids(chosen: Selection, expected: list[str]) -> None:
    items = [
        describe(quarantined("mail", TB_MAIL, "2026-11-29T08:30:00Z", "2026-11-29T08:00:00Z"), "x-17", None),
        describe(quarantined("mail", TB_MAIL, "2026-11-29T08:30:00Z", "2026-11-29T08:00:00Z"), "x-23", None),
        describe(quarantined("mail", TB_MAIL, "2026-11-29T08:30:00Z", "2026-11-29T08:00:00Z"), "x-31", None),
        describe(quarantined("sms", TB_MAIL, "2026-11-29T08:30:00Z", "2026-11-29T08:00:00Z"), "x-42", None),
    ]
    assert [i.job_id for i in items if chosen.matches(i)] == expected


def _frame(path: str) -> str:
    return f'Traceback (most recent call last):\n  File "{path}", line 7, in send\nValueError: x\n'


RELEASES = [
    pytest.param("/srv/app/releases/20261130/app.py", "/srv/app/releases/20261201/app.py", "app:send",
                 id="timestamped-release-folder"),
    pytest.param("/srv/app/releases/20261130120501/billing/mail.py", "/srv/app/releases/20261201093000/billing/mail.py",
                 "billing.mail:send", id="timestamped-release-above-a-package"),
    pytest.param("/opt/deploy/v1.4.2/app.py", "/opt/deploy/v1.5.0/app.py", "app:send", id="version-folder"),
    pytest.param("/srv/builds/3f9a2c1e7b/app.py", "/srv/builds/a91c0d4e22/app.py", "app:send", id="git-sha-folder"),
    pytest.param("/srv/r/2026-11-30_12-00/app.py", "/srv/r/2026-12-01_08-30/app.py", "app:send", id="dated-folder"),
    pytest.param("/srv/releases/20261130/venv/lib/python3.11/site-packages/billing/mail.py",
                 "/srv/releases/20261201/venv/lib/python3.12/site-packages/billing/mail.py",
                 "billing.mail:send", id="site-packages-in-a-release"),
    pytest.param("/usr/lib/python3/dist-packages/acme/billing/mail.py",
                 "/home/ops/.venv/lib/python3.11/site-packages/acme/billing/mail.py",
                 "acme.billing.mail:send", id="installed-module-named-in-full"),
    pytest.param("/usr/lib/python3.11/socket.py", "/usr/local/lib/python3.12/socket.py", "socket:send",
                 id="standard-library-of-another-python"),
    pytest.param("C:\\deploy\\20261130\\app.py", "C:\\deploy\\20261201\\app.py", "app:send", id="windows-release"),
]  # fmt: skip


@pytest.mark.parametrize(("one", "other", "frame"), RELEASES)
def test_a_release_or_install_folder_does_not_split_a_group(one: str, other: str, frame: str) -> None:
    """Two paths differing only by the deploy (release) folder or install prefix: one fingerprint, one group."""
    assert frames(_frame(one)) == frames(_frame(other)) == [frame]
    assert stack_fingerprint("builtins.ValueError", _frame(one), "exhausted") == stack_fingerprint(
        "builtins.ValueError", _frame(other), "exhausted"
    )


def test_package_folders_with_digits_are_kept() -> None:
    """A package named with a few digits (``oauth2``, ``py3``) is code, not a release folder."""
    assert frames(_frame("/srv/app/oauth2/client.py")) == ["oauth2.client:send"]
    assert frames(_frame("/srv/app/api/v2.py")) == ["api.v2:send"]


# A traceback header comes from whoever published into the quarantine (another stack's worker, a
# hand-made message): up to frame_max (128 KiB). Its reading must take time in proportion to its
# size: `^\s*File` tried at each of 120,000 line starts of blank lines, or a release-folder rule
# trying every split of a 120 KB folder name, took 20-40 s per message, in every browse (list,
# show, replay, park, each console page).
@pytest.mark.serial  # a wall-clock bound (2 s, for work of milliseconds; the old rules took 20 s and more)
@pytest.mark.parametrize(
    ("traceback", "expected"),
    [
        pytest.param("\n" * 120_000, "ValueError", id="blank-lines"),
        pytest.param("\n \n" * 40_000 + TB_PACKAGE_INIT, "ValueError @ billing:charge", id="blank-lines-then-a-frame"),
        pytest.param(f'  File "/srv/{"1." * 60_000}x!/app/mail.py", line 1, in send\n', "ValueError @ app.mail:send",
                     id="folder-name-like-a-version"),
        pytest.param(f'  File "/srv/{"1." + "1" * 120_000}x!/app/mail.py", line 1, in send\n',
                     "ValueError @ app.mail:send", id="folder-name-of-digits"),
    ],
)  # fmt: skip
def test_a_hostile_traceback_is_read_in_time_proportional_to_its_size(traceback: str, expected: str) -> None:
    started = time.perf_counter()
    assert stack_fingerprint("ValueError", traceback, "exhausted") == expected
    assert time.perf_counter() - started < 2.0
