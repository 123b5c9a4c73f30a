"""The worker's start line and its /readyz answer word the slots alike (an outsider saw 1 per queue vs 2)."""

from __future__ import annotations

from amqpjobs.runtime.source_control import consuming_words


def test_one_queue_its_slots():
    assert consuming_words(["work"], 4) == "work with 4 slot(s)"


def test_several_queues_the_slots_of_each():
    assert consuming_words(["qwork", "work"], 1) == "qwork, work with 1 slot(s) per queue"


def test_none():
    assert consuming_words([], 3) == "nothing with 0 slot(s)"
