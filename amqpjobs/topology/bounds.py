"""How full a job queue's work queue may get before enqueue refuses a job (issue 25)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class QueueBounds(BaseModel):
    """How full a work queue may get before enqueue refuses a job (``QueueFullError``).

    Attributes:
        max_depth: Ready messages at which enqueue refuses (publisher-side), or None.
        max_age: Seconds the oldest ready message may wait before enqueue refuses, or None.
        max_length: The broker's ``x-max-length`` when it nacks publishes over it
            (``reject-publish``), or None.

    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int | None = None
    max_age: float | None = None
    max_length: int | None = None

    @property
    def checked(self) -> bool:
        """True when enqueue reads the queue's figures before publishing (``max_depth`` or ``max_age``)."""
        return self.max_depth is not None or self.max_age is not None
