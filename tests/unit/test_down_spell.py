"""The one rule of the down-node lines (:class:`amqpjobs.wire.failover_lines.DownSpell`) and our words for a
connection that is down (:func:`amqpjobs.wire.errors.in_our_words`)."""

from __future__ import annotations

from amqpjobs.wire.errors import NOT_CONNECTED, in_our_words
from amqpjobs.wire.failover_lines import DownSpell


def test_said_at_once_then_once_a_minute_with_how_long_then_back() -> None:
    spell = DownSpell()
    said = [(t, tail) for t in range(0, 151, 30) if (tail := spell.failed(100.0 + t)) is not None]
    assert said == [
        (0, " (said again in 60s while it lasts)"),
        (60, " (said again in 60s while it lasts; down 60s, 3 failed attempt(s))"),
        (120, " (said again in 60s while it lasts; down 120s, 5 failed attempt(s))"),
    ]  # 3 lines for 6 failures 30 s apart (before: 6)
    assert spell.worked(100.0 + 165) == " (back after 165s, 6 failed attempt(s))"
    assert spell.worked(100.0 + 166) is None  # once
    assert spell.failed(300.0) == " (said again in 60s while it lasts)"  # a new spell: at once again


def test_a_read_that_always_worked_says_nothing() -> None:
    assert DownSpell().worked(5.0) is None


def test_a_spell_begun_at_a_loss_says_its_first_failure_at_once_and_counts_from_the_loss() -> None:
    spell = DownSpell()
    spell.began(100.0)  # the connection lost at 100 s
    assert spell.failed(105.0) == " (said again in 60s while it lasts)"
    assert spell.lasting(105.0) == ""  # one failed try: no "down" yet
    assert spell.failed(110.0) is None
    assert spell.lasting(110.0) == "; down 10s, 2 failed attempt(s)"  # from the loss, not the first failure
    assert spell.failed(166.0) == " (said again in 60s while it lasts; down 66s, 3 failed attempt(s))"
    assert spell.worked(170.0, "having waited") == " (back after 70s, 3 failed attempt(s))"
    assert spell.worked(171.0) is None  # once


def test_a_spell_with_no_failed_try_is_said_back_only_with_what_it_held_instead() -> None:
    spell = DownSpell()
    spell.began(10.0)  # a connection gave way, then waited its turn with no failed attempt
    assert spell.worked(85.0, "having waited for those it gives way to") == (
        " (back after 75s, having waited for those it gives way to)"
    )
    spell.began(100.0)
    assert spell.worked(101.0) is None  # lost and back at its first attempt: nothing to say
    assert spell.worked(102.0, "having waited") is None  # once


def test_the_libraries_words_for_a_connection_down_are_ours() -> None:
    assert in_our_words(RuntimeError("Connection was not opened")) == NOT_CONNECTED
    assert in_our_words(RuntimeError("Connection is not ready")) == NOT_CONNECTED
    assert in_our_words(RuntimeError('<Connection: "amqp://u:secret@h:5672/v"> closed')) == NOT_CONNECTED
    assert in_our_words(RuntimeError("something else")) == "something else"
    assert in_our_words(ValueError()) == "ValueError"
