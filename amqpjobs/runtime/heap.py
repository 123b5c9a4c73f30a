"""A worker process's heap after its start: collected once, then kept out of later collections."""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect the start-up's garbage, then keep what survives out of later collections (:func:`gc.freeze`).

    After the imports and the start, CPython's full collection walks the whole heap: 12-28 ms with
    the event loop stopped, on the bench machine, which delayed the deliveries of that moment
    (bench/RESULTS.md, section 5's notes). Frozen objects are never collected again: only for a
    process that is the worker's alone (``run(own_process=True)``: ``amqpjobs consume`` and its
    children). Python docs, "gc.freeze".
    """
    gc.collect()
    gc.freeze()
