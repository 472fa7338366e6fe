"""Worker-side MLflow logging: rank 0 logs into the run the driver created.

The driver (``dlrm_platform.mlflow_run``) creates the store and the run and
passes its id and URI to the workers. Here, per-step metrics are buffered and
sent in one ``MlflowClient.log_batch`` request every ``log_every_steps``
steps; per-epoch metrics are sent at once. Without a run id (or on ranks
other than 0) :class:`NullTracker` keeps the loop free of conditionals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

__all__ = ["MlflowTracker", "NullTracker", "Tracker", "make_tracker"]

log = logging.getLogger(__name__)

# MLflow accepts at most 1000 metrics per log_batch request.
_MAX_METRICS_PER_BATCH = 1000


class NullTracker:
    """Accepts everything, logs nothing."""

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass


class MlflowTracker(NullTracker):
    """Logs to an existing MLflow run; step metrics are buffered until :meth:`flush`."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri)
        self._run_id = run_id
        self._pending: list = []

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.flush()
        self.log_step(epoch, metrics)
        self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            for i in range(0, len(pending), _MAX_METRICS_PER_BATCH):
                self._client.log_batch(self._run_id, metrics=pending[i : i + _MAX_METRICS_PER_BATCH])
        except Exception:  # tracking must never kill training
            log.exception("MLflow logging failed; %d metrics dropped", len(pending))


Tracker = NullTracker


def make_tracker(tracking_uri: str | None, run_id: str | None, rank: int) -> Tracker:
    """An :class:`MlflowTracker` on rank 0 when a run is given, else a :class:`NullTracker`."""
    if rank != 0 or not run_id or not tracking_uri:
        return NullTracker()
    return MlflowTracker(tracking_uri, run_id)
