"""A job's stencil fills in the bytes its message built and encoded in full would have (runtime/job_stencil.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from amqpjobs.jobs.enqueue_args import random_job_id
from amqpjobs.jobs.registry import JobDef
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.runtime.job_stencil import JobStencil
from amqpjobs.runtime.sending import new_message
from amqpjobs.wire.limits import amqp_properties


def _job(name: str) -> JobDef:
    return JobDef(
        name=name, queue="work", handler=lambda p, c: None, payload_model=None, retry=RetryPolicy(), timeout=None
    )


def full(jobdef: JobDef, body: dict[str, Any], job_id: str, now: float) -> tuple[bytes, bytes]:
    message = new_message(jobdef, body, job_id, now, None, None, None)
    return message.body, amqp_properties(message).marshal()


@pytest.mark.parametrize("name", ["orders.confirm", "é" * 127, "x"])
def test_a_stencil_fills_in_what_the_full_path_builds(name: str) -> None:
    rng = random.Random(name)
    jobdef = _job(name)
    stencil = JobStencil.of(jobdef)
    assert stencil is not None
    filled = 0
    for n in range(500):
        job_id = random_job_id() if n % 2 else f"order-{rng.randint(0, 10 ** rng.randint(0, 60))}"
        now = rng.uniform(1_600_000_000, 2_100_000_000)
        body = {"n": n, "x": rng.random(), "s": "é\n", "none": None, "list": [1, {"a": 2}]}
        got = stencil.fill(job_id, now, body)
        if got is None:  # a fraction of a second pamqp may round up: the full path's
            assert now - int(now) >= 0.999
            continue
        assert got == full(jobdef, body, job_id, now)
        filled += 1
    assert filled >= 490


@pytest.mark.parametrize(
    ("job_id", "body"),
    [
        ("x" * 256, {}),  # over a shortstr: the full path refuses it, in its words
        ("\ud800", {}),
        ("id", {"nan": float("nan")}),  # the body refused: the full path names it
        ("id", {"set": {1}}),
    ],
)
def test_what_the_full_path_refuses_is_left_to_it(job_id: str, body: dict[str, Any]) -> None:
    stencil = JobStencil.of(_job("orders.confirm"))
    assert stencil is not None
    assert stencil.fill(job_id, 1_764_650_000.5, body) is None
