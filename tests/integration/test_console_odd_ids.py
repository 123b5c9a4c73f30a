"""The console acts on a job whose id it can only show escaped (a control character, a right-to-left override).

The pages write such an id escaped (``\\u202e``), never raw. Before, its forms sent that escaped
text as the id too (``value="\\u202eevil"``), so "Park this job" and a checked box parked nothing
(``parked 0 message(s)``): the job could be seen and never acted on from the page.
"""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import BASE, Handler, client, quarantine_six, wait_done
from tests.integration.helpers import depth
from tests.integration.test_console_message import publish

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]
ODD = ["rtl\u202eevil", "esc\x1b[31mred", "nl\nline", 'q"><b>x</b>', "plain id "]


@pytest.fixture
def quarantined(broker: BrokerSettings, tmp_path: Path) -> Handler:
    handler = quarantine_six(broker, tmp_path)
    for job_id in ODD:
        publish(broker, b"{}", {"message_id": job_id, "headers": {
            "amqpjobs-reason": "exhausted", "amqpjobs-original-queue": "work", "amqpjobs-job": "odd",
            "amqpjobs-job-id": job_id, "amqpjobs-error-type": "OSError"}})  # fmt: skip
    return handler


def _data(fields: list[tuple[str, str]]) -> dict[str, list[str]]:
    data: dict[str, list[str]] = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    return data


def _form_fields(page: str, form_action: str) -> list[tuple[str, str]]:
    """The hidden inputs of the form posting to ``form_action``, as a browser sends them."""
    found = re.search(rf'<form[^>]*action="{re.escape(form_action)}"[^>]*>(.*?)</form>', page, re.S)
    assert found is not None, page[:2000]
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', found.group(1))
    return [(name, html.unescape(value)) for name, value in fields]


def test_message_page_parks_a_job_whose_id_is_shown_escaped(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        for job_id in ODD:
            page = c.get(f"/message?queue=work.quarantine&id={quote(job_id, safe='')}")
            assert page.status_code == 200, job_id
            for raw in ("\u202e", "\x1b"):
                assert raw not in page.text
            form = [*_form_fields(page.text, "/actions/replay"), ("rate", "10")]
            started = c.post("/actions/park", data=_data(form))
            assert started.status_code == 303, started.text[:500]
            done = wait_done(c, started.headers["location"].replace(BASE, ""))
            assert done["state"] == "done", done
            assert done["moved"] == 1, (job_id, done)
    assert asyncio.run(depth(broker, "work.parked")) == len(ODD)
    assert asyncio.run(depth(broker, "work.quarantine")) == 6


def test_a_checked_box_of_such_a_job_parks_it(broker: BrokerSettings, tmp_path: Path, quarantined):
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine?queue=work.quarantine&job=odd").text
        boxes = re.findall(r'<input type="checkbox" name="([^"]+)" value="([^"]*)" form="act"', page)
        assert len(boxes) == len(ODD), boxes
        assert "\u202e" not in page
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None
        form = [("csrf_token", token.group(1)), ("queue", "work.quarantine"), ("scope", "selected"), ("rate", "10"),
                *((name, html.unescape(value)) for name, value in boxes)]  # fmt: skip
        started = c.post("/actions/park", data=_data(form))
        assert started.status_code == 303, started.text[:500]
        done = wait_done(c, started.headers["location"].replace(BASE, ""))
    assert (done["state"], done["moved"]) == ("done", len(ODD)), done
    assert asyncio.run(depth(broker, "work.quarantine")) == 6


def test_a_form_sent_again_by_the_back_button_does_nothing(broker: BrokerSettings, tmp_path: Path, quarantined):
    """The CSRF token is one per process, so a form re-sent (back button, reload) passed it. Before, a re-sent
    "Purge all matching" deleted a failure that came after the first purge, one no page had shown
    (measured: the audit's second purge named ``a/b-new``, published between the two posts)."""
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine?queue=work.quarantine&job=odd").text
        fields = _form_fields(page, "/actions/replay")
        form = _data([*fields, ("scope", "all"), ("confirm", "work.quarantine"), ("job", "odd")])
        first = c.post("/actions/purge", data=form)
        assert first.status_code == 303, first.text[:500]
        assert wait_done(c, first.headers["location"].replace(BASE, ""))["moved"] == len(ODD)
        publish(
            broker,
            b"{}",
            {
                "message_id": "late",
                "headers": {"amqpjobs-reason": "exhausted", "amqpjobs-job": "odd", "amqpjobs-job-id": "late"},
            },
        )
        again = c.post("/actions/purge", data=form)
        assert again.status_code == 409, again.text[:500]
        assert "this form was sent already" in again.text, again.text
    assert asyncio.run(depth(broker, "work.quarantine")) == 7  # the six, and the late one, kept


def test_another_button_of_the_same_form_still_acts(broker: BrokerSettings, tmp_path: Path, quarantined):
    """The drill from the page: Replay all matching, back, Park all matching (one form, two buttons)."""
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine?queue=work.quarantine&job=odd").text
        form = _data([*_form_fields(page, "/actions/replay"), ("scope", "all"), ("job", "odd"), ("rate", "100")])
        parked = c.post("/actions/park", data=form)
        assert parked.status_code == 303, parked.text[:500]
        assert wait_done(c, parked.headers["location"].replace(BASE, ""))["moved"] == len(ODD)
        assert c.post("/actions/park", data=form).status_code == 409  # the same button again
        unparked = c.post("/actions/unpark", data={**form, "queue": ["work.parked"]})
        assert unparked.status_code == 303, unparked.text[:500]
        assert wait_done(c, unparked.headers["location"].replace(BASE, ""))["moved"] == len(ODD)
    assert asyncio.run(depth(broker, "work.quarantine")) == 6 + len(ODD)
