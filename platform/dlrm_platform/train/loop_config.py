"""What the driver hands every training worker across the Ray Train boundary: :class:`LoopConfig`.

Its own module, free of torch and TorchRec, because Ray Train's controller (a fresh process per
``fit``) unpickles ``train_loop_config`` too: defined beside the train loop, the class dragged
TorchRec and FBGEMM into the controller (seconds of imports on a small machine, before the controller
could ask for the workers). The workers, which need both, import them with the loop.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dlrm_platform.config import JobConfig, revalidate

__all__ = ["LOOP_KEY", "LoopConfig"]

LOOP_KEY = "loop"  # Ray Train's train_loop_config must be a dict: it holds the LoopConfig under this key


class LoopConfig(BaseModel):
    """What the driver hands every worker: ``{LOOP_KEY: LoopConfig}`` as Ray Train's ``train_loop_config``.

    Crosses the Ray boundary as this object; :func:`train_loop_per_worker` re-validates it
    (and the :class:`JobConfig` in it) before anything else.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    job: JobConfig
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    has_eval: bool = True
    dataset_files: dict[str, list[str]] = Field(default_factory=dict)  # what each pipeline reads (cache keys)
    cache_dir: str | None = None  # where epoch caches spill; None: ingest.cache.spill_dir or a temp dir
    feed_service: Any = None  # the job's ingest.feed_service.FeedService actor; None: Ray Train's dataset shards

    def to_ray(self) -> dict[str, LoopConfig]:
        """Ray Train's ``train_loop_config``."""
        return {LOOP_KEY: self}

    @classmethod
    def received(cls, train_loop_config: dict[str, Any]) -> LoopConfig:
        """The worker's side of :meth:`to_ray`: the LoopConfig, re-validated (``config.ConfigError`` names the field)."""
        loop = train_loop_config.get(LOOP_KEY) if isinstance(train_loop_config, dict) else None
        if not isinstance(loop, cls):
            raise TypeError(f"train_loop_config must be {{{LOOP_KEY!r}: LoopConfig}}, got {train_loop_config!r:.200}")
        # Re-validating dumps the model: a dataclass handle (a shared service's JobFeed) would come back a
        # dict, and the workers would call .open on it. The handle is opaque: keep the object itself.
        return revalidate(loop).model_copy(update={"feed_service": loop.feed_service})
