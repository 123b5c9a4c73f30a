"""The publishing connection closes for a refused consuming one only when that makes room (wire/giving_way.py,
by the refusal's words read back in wire/open_refusal.py, where they are written).

Before, it closed on any refusal: at a vhost's ``max-connections`` 0 (``test_rate_limit_reconnect``'s cut)
its rate-limit minting moved for nothing ("now mints its tokens" said twice for a consuming-only cut).
"""

from __future__ import annotations

import pytest

from amqpjobs.wire.open_refusal import LIMIT_WORDS, frees_a_slot

FIX = "raise it (rabbitmqctl set_user_limits app '{\"max-connections\": N}')"


@pytest.mark.parametrize(
    ("why", "frees"),
    [
        (f"user 'app' allows at most 1 connection(s) (max-connections): {FIX}; or run fewer ...", True),
        (f"vhost 'v' allows at most 2 connection(s) (max-connections): {FIX}", True),
        (f"vhost 'v' allows at most 0 connection(s) (max-connections): {FIX}", False),
        (
            f"vhost 'v' allows at most 3 connection(s) (max-connections): {FIX} and user 'app' allows at most 0 "
            f"connection(s) (max-connections): {FIX}",
            False,
        ),
        ("vhost 'v' does not exist: create it (rabbitmqctl add_vhost v) or fix the URL's path", False),
        ("user 'app' has no permissions on vhost 'v': give them (...)", False),
        ("the broker refused the connection (vhost missing, no permissions or a connection limit)", False),
    ],
)
def test_a_close_frees_a_slot_only_under_a_connection_limit_of_one_or_more(why: str, frees: bool) -> None:
    assert frees_a_slot(why) is frees


@pytest.mark.parametrize(("most", "frees"), [(0, False), (1, True), (12, True)])
def test_the_words_written_for_a_limit_are_the_words_read_back(most: int, frees: bool) -> None:
    written = LIMIT_WORDS.format(whose="user 'a (b)'", most=most) + f": {FIX}"
    assert frees_a_slot(written) is frees
