"""The room a connection has for a reconnect's channels, and the fix each hard close names."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiormq
import pytest

from amqpjobs.errors import BrokerError
from amqpjobs.runtime import hard_closes
from amqpjobs.runtime.hard_closes import HardCloses, cause_of
from amqpjobs.wire.channel_room import ChannelRoom, channel_room, limit_fix, with_limit_fix


def _connection(open_channels: int, channel_max: int) -> SimpleNamespace:
    channels = {n: object() for n in range(open_channels + 1)}  # 0: the connection's own
    underlay = SimpleNamespace(connection_tune=SimpleNamespace(channel_max=channel_max), channels=channels)
    return SimpleNamespace(transport=SimpleNamespace(connection=underlay),
                           kwargs={"client_properties": {"connection_name": "app-worker"}})  # fmt: skip


@pytest.mark.parametrize(("open_", "most", "short"), [(3, 3, 1), (2, 3, 0), (3, 4, 0), (9, 0, 0), (5, 3, 3)])
def test_short_by_counts_the_channels_missing_for_one_more(open_: int, most: int, short: int):
    assert ChannelRoom("c", open_, most).short_by(1) == short


def test_channel_room_reads_the_open_channels_and_the_negotiated_channel_max():
    assert channel_room(_connection(3, 2047)) == ChannelRoom("app-worker", 3, 2047)
    assert channel_room(SimpleNamespace(transport=None)) is None


USER_LIMIT = (
    "NOT_ALLOWED - number of channels opened for user 'guest' has reached the maximum allowed user limit of (4)"
)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)", "channel_max in"),
        (
            USER_LIMIT,
            "set_user_limits",
        ),
        ("FRAME_ERROR - something else", "look in the broker's log"),
    ],
)
def test_limit_fix_names_the_limit_and_its_fix(text: str, words: str):
    assert words in limit_fix(text)


async def test_a_connection_holding_channel_max_channels_refuses_the_start():
    hard = HardCloses(asyncio.Event().set)
    with pytest.raises(BrokerError, match=r"channel_max is 3 .* connection app-worker of this worker holds 3 channel"):
        hard.watch([_connection(3, 3)])
    assert hard.fatal is not None
    assert hard.fatal.final  # consume --processes stops every child at the first such exit


class Clock:
    """hard_closes' ``time.monotonic``, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(hard_closes, "time", SimpleNamespace(monotonic=lambda: self.now))


async def test_a_hard_close_met_again_within_the_window_stops_the_worker(monkeypatch: pytest.MonkeyPatch):
    clock = Clock(monkeypatch)
    stop = asyncio.Event()
    hard = HardCloses(stop.set)
    hard._closed(RuntimeError("NOT_ALLOWED - ... user limit of (4)"))
    assert not stop.is_set()
    assert hard.after_stop(0) == 0
    clock.now += 5.0  # aio-pika's next reconnect
    hard._closed(RuntimeError("NOT_ALLOWED - ... user limit of (4)"))
    assert stop.is_set()
    with pytest.raises(BrokerError, match=r"of this worker .* again 5s later: .*set_user_limits"):
        hard.after_stop(0)
    assert hard.fatal is not None
    # a restarted child meets it at its next reconnect: --processes stops every child (before: restarted it, and
    # under a user's max-channels the restart was refused 5 times, 'exited before it was ready 5 times within 60s')
    assert hard.fatal.final


def test_two_connections_refused_in_one_reconnect_round_are_one_event(monkeypatch: pytest.MonkeyPatch):
    """Before: the worker's and its publisher's connections refused together stopped it, 'again 0s later'."""
    clock = Clock(monkeypatch)
    stop = asyncio.Event()
    hard = HardCloses(stop.set)
    hard._closed(RuntimeError(USER_LIMIT), connection=1)
    hard._closed(RuntimeError(USER_LIMIT), connection=2)
    clock.now += 0.006
    hard._closed(RuntimeError(USER_LIMIT), connection=1)  # aio-pika's immediate reconnect, 6 ms later: one round
    assert not stop.is_set()
    assert hard.after_stop(0) == 0
    clock.now += 5.0
    hard._closed(RuntimeError(USER_LIMIT.replace("(4)", "(5)")), connection=2)  # its next round: the same refusal
    assert stop.is_set()
    with pytest.raises(BrokerError, match=r"again 5s later"):
        hard.after_stop(0)


def test_two_hard_closes_of_different_causes_stop_nothing():
    stop = asyncio.Event()
    hard = HardCloses(stop.set)
    hard._closed(aiormq.exceptions.ConnectionNotAllowed(USER_LIMIT), connection=1)
    hard._closed(aiormq.exceptions.ConnectionChannelError("CHANNEL_ERROR - expected 'channel.open'"), connection=1)
    hard._closed(aiormq.exceptions.ConnectionFrameError("FRAME_ERROR - type 65, all octets = <<>>"), connection=1)
    assert not stop.is_set()
    assert hard.after_stop(0) == 0
    assert cause_of(RuntimeError(USER_LIMIT)) == cause_of(RuntimeError(USER_LIMIT.replace("(4)", "(12)")))


def test_with_limit_fix_adds_the_fix_naming_the_user_once_and_leaves_other_errors_alone():
    words = "NOT_ALLOWED - number of channels opened for user 'app' has reached the maximum allowed user limit of 2"
    wrapped = with_limit_fix(f"looking for queues and exchanges failed: {words}")  # 4.3: no parentheses
    fix = "(rabbitmqctl set_user_limits app '{\"max-channels\": N}', or clear_user_limits app max-channels)"
    assert f"; fix: raise or clear the user's max-channels limit {fix}, or give each worker" in wrapped
    assert with_limit_fix(wrapped) == wrapped  # said once
    node = (
        "NOT_ALLOWED - number of channels opened for user 'amqpjobs4@localhost' has reached the maximum allowed "
        "user limit (2)"
    )
    assert "set_user_limits USER '" in with_limit_fix(node)  # 4.0.5 names its node where the user goes
    assert "amqpjobs4@localhost max-channels" not in with_limit_fix(node)
    channel_max = "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    assert "; fix: raise channel_max in the broker's rabbitmq.conf" in with_limit_fix(channel_max)
    assert with_limit_fix("NOT_FOUND - no queue 'x'") == "NOT_FOUND - no queue 'x'"


#: aiormq's words for the broker's 530 answer to a reconnect's connection.open (a user's max-connections reached).
REFUSED_OPEN = "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f>"


async def test_a_best_effort_connection_is_said_once_a_minute_and_stops_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The outcome events' connection: no job needs it (before: refused, two WARNING lines every 5 s, no fix)."""
    clock = Clock(monkeypatch)
    stop = asyncio.Event()
    hard = HardCloses(stop.set)
    for _ in range(12):  # a minute of aio-pika's reconnects, 5 s apart
        hard._best_effort(aiormq.exceptions.InvalidFrameError(REFUSED_OPEN), 7, "outcome events", "app-worker-events")
        hard._best_effort(aiormq.exceptions.ConnectionNotAllowed(USER_LIMIT), 7, "outcome events", "app-worker-events")
        await asyncio.sleep(0)
        clock.now += 5.0
    hard._best_effort(aiormq.exceptions.ConnectionNotAllowed(USER_LIMIT), 7, "outcome events", "app-worker-events")
    said = [r.getMessage() for r in caplog.records if "outcome events are off" in r.getMessage()]
    assert len(said) == 2, said
    assert "refuses the reconnect of their connection app-worker-events (530 NOT_ALLOWED" in said[0], said
    assert "closed their connection app-worker-events for what it sent" in said[1], said
    assert "set_user_limits" in said[1], said  # the fix
    assert all("jobs run as usual" in line for line in said), said
    assert not stop.is_set()
    assert hard.after_stop(0) == 0
