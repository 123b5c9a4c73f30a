"""Second review of issue 26: what the console (and the CLI's replay) call things must be true.

A message published straight into a quarantine queue (no evidence of ours, no ``x-death``)
was labelled ``x-death:unknown``; parked pages offered "Park all"; the form's canary timeout
default (30 s) was not the server's (60 s); Stop's note contradicted the README; and a
replay that skipped such a message (no queue to go back to) said "skipped 1" and no more.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.console.forms import action_form
from amqpjobs.jobs.quarantine import describe
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import CSRF, client, wait_done
from tests.integration.helpers import ROOT, cli, depth, raw_channel
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

LABEL = "no-evidence"


async def _publish_straight(broker: BrokerSettings, queue: str, n: int) -> None:
    """``n`` messages published into ``queue`` by hand: no message id, no headers, no origin."""
    async with raw_channel(broker) as channel:
        for i in range(n):
            await channel.default_exchange.publish(aio_pika.Message(f'{{"n": {i}}}'.encode()), routing_key=queue)


@pytest.fixture
def straight(broker: BrokerSettings, tmp_path: Path) -> None:
    """Two messages published straight into work.quarantine, one of them parked (work.parked)."""

    async def fill() -> None:
        app = await make_app(broker, tmp_path)
        await app.close()
        await _publish_straight(broker, "work.quarantine", 1)
        parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "work.quarantine", "--yes")
        assert parked.exit_code == 0, parked.output
        await _publish_straight(broker, "work.quarantine", 1)
        assert (await depth(broker, "work.quarantine"), await depth(broker, "work.parked")) == (1, 1)

    asyncio.run(fill())


def test_a_message_without_evidence_nor_x_death_is_labelled_so() -> None:
    item = describe({}, None, None)
    assert (item.reason, item.broker_side) == (LABEL, False)
    assert describe({"x-death": [{"queue": "q", "reason": "expired"}]}, None, None).reason == "x-death:expired"


def test_the_pages_label_it_and_a_parked_page_offers_no_park(broker: BrokerSettings, tmp_path: Path, straight):
    with client(broker, tmp_path) as c:
        quarantined = c.get("/quarantine", params={"queue": "work.quarantine"})
        parked = c.get("/quarantine", params={"queue": "work.parked"})
        (key,) = re.findall(r'name="job_id" value="([^"]+)"', parked.text)
        one = c.get("/message", params={"queue": "work.parked", "id": key})
    assert quarantined.status_code == parked.status_code == one.status_code == 200
    assert f"<td>{LABEL}</td>" in quarantined.text
    assert "x-death:unknown" not in quarantined.text + parked.text
    assert 'id="park-all"' in quarantined.text  # a quarantine page parks
    assert 'id="replay-all"' in parked.text  # a parked page replays...
    assert 'id="park-all"' not in parked.text  # ...and parks nothing: it is parked already
    assert 'id="park-selected"' not in parked.text
    assert 'id="unpark-all"' in parked.text  # it unparks (back to quarantine, unrun)
    assert 'id="replay-one"' in one.text
    assert 'id="park-one"' not in one.text
    assert 'id="unpark-one"' in one.text


def test_the_forms_canary_timeout_is_the_servers_default(broker: BrokerSettings, tmp_path: Path, straight):
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
    (field,) = re.findall(r'<input type="text" name="canary_timeout"[^>]*>', page.text)
    # the default is a placeholder, not a value: the form sends only what the user typed
    assert re.findall(r'(value|placeholder)="([^"]*)"', field) == [("value", ""), ("placeholder", "60s")]
    default = action_form("replay", _Form(queue="work.quarantine", scope="all", rate="1")).canary_timeout
    assert default == 60.0


def test_an_untouched_form_without_a_canary_replays_and_a_typed_60s_is_refused(
    broker: BrokerSettings, tmp_path: Path, straight
):
    """Before: the form sent the timeout filled with its default, so a typed ``60s`` without a canary passed as
    untouched, where ``replay --canary-timeout 60s`` without ``--canary`` exits 2."""
    with client(broker, tmp_path) as c:
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        sent = dict(re.findall(r'<input type="(?:hidden|text|number)" name="(\w+)" value="([^"]*)"', page.text))
        typed = c.post("/actions/replay", data={**sent, "canary": "", "canary_timeout": "60s", "scope": "all"})
        assert typed.status_code == 400, typed.text
        assert "canary_timeout: a canary timeout needs a canary" in typed.text
        assert 'name="canary_timeout" value="60s"' in typed.text  # shown again as typed
        page = c.get("/quarantine", params={"queue": "work.quarantine"})
        sent = dict(re.findall(r'<input type="(?:hidden|text|number)" name="(\w+)" value="([^"]*)"', page.text))
        untouched = c.post("/actions/replay", data={**sent, "canary": "", "scope": "all"}, follow_redirects=False)
    assert untouched.status_code == 303, untouched.text


class _Form(dict[str, str]):
    def getlist(self, name: str) -> list[str]:
        return [self[name]] if name in self else []


def test_a_replay_says_why_it_skipped_a_message_with_no_origin(broker: BrokerSettings, tmp_path: Path, straight):
    result = cli(broker, "replay", "work.quarantine", "--rate", "100")
    assert result.exit_code == 1, result.output  # partial: a matching message stays
    assert "replayed 0, skipped 1" in result.output
    assert "1 skipped: no queue to go back to" in result.output, result.output
    assert "--to" in result.output
    form = {"csrf_token": CSRF, "queue": "work.parked", "scope": "all", "rate": "100", "canary": ""}
    with client(broker, tmp_path) as c:
        started = c.post("/actions/replay", data=form)
        assert started.status_code == 303, started.text
        progress = wait_done(c, started.headers["location"].replace("http://127.0.0.1:8480", ""))
    assert progress["state"] == "done", progress
    assert "1 skipped: no queue to go back to" in progress["summary"], progress


def test_stop_and_the_readme_say_the_same_about_duplicates() -> None:
    readme = (ROOT / "README.md").read_text()
    template = (ROOT / "amqpjobs/console/templates/action.html").read_text()
    assert "settle" not in template
    assert "the moves under way settle" not in readme
    assert "the moves under way are settled" not in readme
    for text in (readme, template):
        assert "may now be in both" in text
