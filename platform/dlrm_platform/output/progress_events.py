"""The events rank 0 sends the driver's progress monitor (:mod:`.progress`): one typed model per kind.

They cross a Ray boundary (the worker's sink -> the board actor -> the driver), so the
typed event travels and the monitor validates what arrives with :func:`read_event`
before drawing it (``config.py``'s rule for everything crossing Ray). ``kind`` tells the
events apart (a discriminated union, :data:`ProgressEvent`); ``t`` is when it was sent.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = ["Checkpointed", "EpochFinished", "EpochStarted", "Evaluating", "ProgressEvent", "Restored", "Window",
           "read_event"]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    t: float = Field(default_factory=time.time)  # when the worker sent it (time.time())
    epoch: int


class EpochStarted(_Event):
    """An epoch starts; ``samples_done`` of it were trained already (resumed mid-epoch from a checkpoint)."""

    kind: Literal["epoch_started"] = "epoch_started"
    samples_done: int


class Window(_Event):
    """One log window (all workers): samples of the epoch so far, the window's rate, data wait and loss."""

    kind: Literal["window"] = "window"
    samples_done: int
    samples_per_s: float
    data_wait: float
    loss: float


class EpochFinished(_Event):
    kind: Literal["epoch_finished"] = "epoch_finished"
    samples: int
    seconds: float
    data_wait: float
    loss: float


class Evaluating(_Event):
    kind: Literal["evaluating"] = "evaluating"


class Restored(_Event):
    """Resumed from the checkpoint at ``path``; ``samples_in_epoch`` of ``epoch`` were trained before it."""

    kind: Literal["restored"] = "restored"
    path: str
    global_step: int
    samples_in_epoch: int


class Checkpointed(_Event):
    """A checkpoint saved; at an epoch's end with the held-out figures (None: no eval split)."""

    kind: Literal["checkpointed"] = "checkpointed"
    path: str
    end_of_epoch: bool
    auc: float | None = None
    logloss: float | None = None


ProgressEvent = Annotated[EpochStarted | Window | EpochFinished | Evaluating | Restored | Checkpointed,
                          Field(discriminator="kind")]
_EVENT = TypeAdapter(ProgressEvent)


def read_event(received: Any) -> ProgressEvent:
    """Validate an event that crossed Ray (a model, or its dump); raises pydantic's ValidationError if malformed."""
    if isinstance(received, BaseModel):
        received = received.model_dump(mode="python", warnings=False)
    return _EVENT.validate_python(received)
