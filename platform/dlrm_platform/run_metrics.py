"""Names of the per-step metrics a job logs to its MLflow run, shared by the writer and the readers.

The training worker (:meth:`dlrm_platform.train.loop.Worker._log_step`) logs
these at every step; the API's progress reader
(:meth:`dlrm_platform.api.mlflow_links.MlflowTracker.progress`) reads the latest
values of the same names, so a status poll costs one ``get_run``.
"""

from __future__ import annotations

__all__ = ["DATA_WAIT_FRACTION", "LOSS", "SAMPLES_PER_S", "STEPS_DONE", "STRAGGLER_WAIT_S"]

LOSS = "loss"  # mean training loss of the step (logged only when the worker had real samples)
SAMPLES_PER_S = "samples_per_s"  # all workers' samples of the step / its wall time
DATA_WAIT_FRACTION = "data_wait_fraction"  # share of the step's wall time spent waiting for data
STEPS_DONE = "steps_done"  # global steps trained so far (the value equals the metric's step)
# Seconds the worker waited at the step's has-batch all-reduce after its own batch was ready:
# the other workers' data (stragglers), plus the collective's own latency.
STRAGGLER_WAIT_S = "straggler_wait_s"
