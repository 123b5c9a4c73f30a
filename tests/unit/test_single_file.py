"""One delivery at a time after a 541, for as many deliveries as the slots, or until the message is moved."""

from __future__ import annotations

from amqpjobs.wire.single_file import SingleFile


def test_it_lasts_as_many_deliveries_as_the_slots_then_gives_them_back() -> None:
    single = SingleFile()
    assert single.begin(3) is True
    assert single.on
    assert [single.came(), single.came(), single.came()] == [None, None, 3]
    assert not single.on
    assert single.came() is None  # off: nothing counted


def test_a_second_541_counts_again_from_the_first_slots() -> None:
    single = SingleFile()
    single.begin(4)
    single.came()
    single.came()
    assert single.begin(1) is False  # the consumer's prefetch is 1 by now: the slots stay 4
    assert [single.came() for _ in range(4)] == [None, None, None, 4]


def test_one_slot_never_begins_and_a_move_ends_it_at_once() -> None:
    single = SingleFile()
    assert single.begin(1) is False
    assert not single.on
    assert single.end() is None
    single.begin(2)
    assert single.end() == 2
    assert not single.on
