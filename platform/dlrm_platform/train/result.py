"""What a training worker reports with each checkpoint, and what the driver reads back: one typed result.

The worker builds a :class:`TrainReport` (``loop.Worker.report``) and reports it
with its checkpoint; the driver validates it into a :class:`TrainingResult` (the
report plus what only the driver knows). Every figure is named once, here, and
keeps its name from the worker to the job's summary. Ray Train V2 takes a
report's metrics as a dict and keeps them as JSON beside the checkpoint, so the
dict it gets is ``{REPORT_KEY: report.model_dump()}``: the typed report under
one key, validated again on the driver (:meth:`TrainingResult.from_ray`), as
every typed object that crosses a Ray boundary is (``config.revalidate``).

MLflow names are another namespace: the run's final ``auc``/``logloss``
(``job._log_summary``) and the per-epoch ``eval_auc``/``eval_logloss``
(``loop._train_epochs``) are logged from these fields.

No torch here: the driver reads results without the model's imports.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dlrm_platform.ingest.feed_report import FeedReport

__all__ = ["REPORT_KEY", "CacheStats", "EpochEnd", "EpochRecord", "FeederPass", "FeederReport", "TrainReport",
           "TrainingResult"]

REPORT_KEY = "report"  # the one key of the metrics dict a worker hands ray.train.report


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EpochRecord(_Result):
    """One epoch of this run, as the job summary lists it."""

    epoch: int
    data_wait_fraction: float
    first_batch_latency_s: float
    samples_per_s: float
    source: str  # where the epoch's train batches came from: "pipeline" or "cache"


class EpochEnd(_Result):
    """The epoch a report closes (end-of-epoch reports only)."""

    train_loss: float
    samples: int
    eval_samples: int
    data_wait_fraction: float
    source: str


class CacheStats(_Result):
    """One dataset's epoch cache on a worker (``train.feed.EpochCache.describe``)."""

    state: Literal["complete", "off", "filling"]
    batches: int
    samples: int
    memory_mb: float
    disk_mb: float
    reason: str = ""  # why it is off ("" otherwise)
    replayed: bool = False  # later passes of the dataset replay it


class FeederPass(_Result):
    """How one pass reached a worker (``train.feed.PassStats``): from the pipeline or the cache, and how fast."""

    name: str
    epoch: int
    source: str  # "pipeline" or "cache"
    batches: int
    samples: int
    skipped: int  # batches a restored checkpoint had already trained in this pass
    first_batch_s: float | None  # seconds from opening the source to its first batch
    source_s: float | None  # seconds until the source was exhausted


class FeederReport(_Result):
    """A worker's feeder: its epoch caches and the passes it fed (``train.feed.ShardFeeder.describe``)."""

    caches: dict[str, CacheStats] = Field(default_factory=dict)
    passes: list[FeederPass] = Field(default_factory=list)


class TrainReport(_Result):
    """The run's figures at a checkpoint, summed over workers.

    ``samples_per_s``: trained samples per second of training time (evaluation
    and checkpointing excluded); ``data_wait_fraction``: wait / (wait +
    compute) over all steps of all workers; ``auc``/``logloss``: held-out, after
    the last evaluated epoch (NaN without an eval split); ``steps``: lockstep
    steps; ``samples``: samples trained on (replays after a failure included).
    """

    epoch: int
    start_epoch: int = 0  # the epoch this run (after a restore: this attempt) started from
    samples_per_s: float
    data_wait_fraction: float
    auc: float = math.nan
    logloss: float = math.nan
    steps: int
    samples: int
    train_time_s: float
    precision: str
    intra_op_threads: int
    epochs: list[EpochRecord] = Field(default_factory=list)
    epoch_end: EpochEnd | None = None
    feed: FeederReport = Field(default_factory=FeederReport)  # rank 0's feeder

    def to_ray(self) -> dict[str, Any]:
        """The metrics dict for ``ray.train.report``."""
        return {REPORT_KEY: self.model_dump(mode="python")}


class TrainingResult(TrainReport):
    """A finished training run: the last report, where its checkpoint is, and the feed service's passes."""

    checkpoint_path: str | None = None  # the last checkpoint (DCP directory)
    feed_service: FeedReport | None = None  # the feed service's report on the job; None: it gave none

    @classmethod
    def from_ray(cls, metrics: dict[str, Any], checkpoint_path: str | None,
                 feed_service: FeedReport | None = None) -> TrainingResult:
        """Validate what Ray Train kept of the last report (``Result.metrics``); ``feed_service``: validated
        already (``ingest.feed_client.read_feed_report``)."""
        if REPORT_KEY not in metrics:
            raise RuntimeError(f"the training run's last report has no {REPORT_KEY!r}: {sorted(metrics)}")
        return cls.model_validate({**metrics[REPORT_KEY], "checkpoint_path": checkpoint_path,
                                   "feed_service": feed_service})
