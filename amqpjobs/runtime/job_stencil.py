"""One job's fresh messages encoded from a stencil: the sync publisher's fast path (:class:`JobStencil`).

An enqueue without ``priority``, ``tenant`` or ``headers`` sends a message that differs from
the job's other such messages only in its job id, its enqueue time (the ``timestamp``
property and the ``amqpjobs-enqueued-at`` header) and its body. Building it as
:func:`~amqpjobs.runtime.sending.new_message` does and encoding its properties each time is
most of the CPU a one-at-a-time confirmed publish spends in Python (bench/RESULTS.md, issue
22); :class:`JobStencil` encodes them once per job and then fills in those values
(:class:`~amqpjobs.wire.property_encoding.PropertyStencil`). The bytes are the ones the
message built and encoded in full would have: the stencil is kept only when it fills in
a second sample exactly, and a value the full path treats otherwise (a timestamp pamqp may
round, a body JSON can't carry) leaves the enqueue to the full path, which sends or refuses it.
"""

from __future__ import annotations

from typing import Any, Final

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import ENQUEUED_AT, encode_payload, iso_utc
from amqpjobs.jobs.registry import JobDef
from amqpjobs.runtime.sending import new_message
from amqpjobs.wire.property_encoding import PropertyStencil

#: The samples' enqueue times (epoch seconds) and job ids: two of each, the ids of different lengths.
_SAMPLES: Final = ((1_767_225_600.25, "5f0c1a2e-7b3d-4c8e-9a61-2d4f8e0b7c93"), (1_798_761_600.5, "sample"))
_SAMPLE_BODY: Final = {"sample": 1}


class JobStencil:
    """The properties of one job's fresh messages (no priority, tenant nor headers), filled in per enqueue.

    Build with :meth:`of` (None: this job's messages are encoded in full).
    """

    def __init__(self, properties: PropertyStencil) -> None:
        self._properties = properties

    @classmethod
    def of(cls, jobdef: JobDef) -> JobStencil | None:
        """The stencil of ``jobdef``'s messages, or None when its samples don't give one that fills in exactly."""
        try:
            samples = [new_message(jobdef, _SAMPLE_BODY, job_id, now, None, None, None) for now, job_id in _SAMPLES]
        except ConfigurationError:  # no sample: the job's enqueues build their messages (and say what is wrong)
            return None
        for (now, _), sample in zip(_SAMPLES, samples, strict=True):  # the values fill() computes are the message's
            if sample.headers.get(ENQUEUED_AT) != iso_utc(now) or sample.body != encode_payload(_SAMPLE_BODY):
                return None
        properties = PropertyStencil.of(samples[0], ENQUEUED_AT, samples[1])
        return None if properties is None else cls(properties)

    def fill(self, job_id: str, now: float, body: dict[str, Any]) -> tuple[bytes, bytes] | None:
        """(body, encoded properties) of the job's message with these values; None: build it in full.

        Args:
            job_id: The job id (``message_id``), checked by the enqueue already.
            now: The enqueue time, epoch seconds.
            body: The payload as JSON-ready values (:meth:`~amqpjobs.jobs.registry.JobDef.payload_body`).
        """
        properties = self._properties.fill(job_id, now, iso_utc(now))
        if properties is None:
            return None
        try:
            data = encode_payload(body)
        except ValueError:  # the full path raises it, in its words
            return None
        return data, properties
