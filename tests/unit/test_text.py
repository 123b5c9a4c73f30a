"""The one rule for shortening text in log lines (:func:`amqpjobs.text.shorten`, :func:`amqpjobs.text.one_line`)."""

from __future__ import annotations

import pytest

from amqpjobs.text import one_line, shorten


@pytest.mark.parametrize(
    ("text", "limit", "short"),
    [
        ("short enough", 20, "short enough"),
        ("exactly twenty chars", 20, "exactly twenty chars"),
        ("cut at a word boundary please", 20, "cut at a word …"),
        ("a (bracket opened before the cut) end", 20, "a (bracket opened …)"),
        ("nested [a (b c d e f g h", 20, "nested [a (b c d e …)]"),
        ("closed (x) then more words here", 20, "closed (x) then …"),
        ("averyveryverylongwordwithoutspaces", 10, "averyvery…"),
        ("a {b: 'c d e f g h'}", 12, "a {b: 'c d …}"),
    ],
)
def test_shorten_cuts_at_a_word_with_an_ellipsis_and_balances_brackets(text: str, limit: int, short: str) -> None:
    assert shorten(text, limit) == short


def test_one_line_is_the_type_and_the_message_on_one_line_cut_at_a_word() -> None:
    exc = ConnectionError("server closed\n  the connection " + "x" * 300)
    assert one_line(exc) == "ConnectionError: server closed the connection …"
    assert one_line(ValueError("a\nb")) == "ValueError: a b"
