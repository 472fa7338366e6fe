"""The service's bookkeeping of its jobs' MLflow runs: create, close, and read progress from them.

The service creates a job's run before the first attempt (the job logs into
it, ``tracking.run_id``), closes it when the job ends where the job could not,
and copies the run's latest step metrics (:mod:`dlrm_platform.run_metrics`)
into the job's record for status polls.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select

from dlrm_platform.api.db import Database, JobHistory, JobRecord, JobStatus
from dlrm_platform.api.job_logs import JobFiles
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.mlflow_links import JOB_ID_TAG, USER_TAG, Tracker

__all__ = ["MlflowRuns"]

log = logging.getLogger(__name__)


class MlflowRuns:
    """Runs of the service's jobs through ``tracker`` (None: MLflow is not used, every call does nothing)."""

    def __init__(self, settings: ApiSettings, db: Database, tracker: Tracker | None, files: JobFiles,
                 history: JobHistory, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.db = db
        self.tracker = tracker
        self.files = files
        self.history = history
        self.clock = clock
        self._progress_read: dict[str, float] = {}

    def ensure_run(self, job: JobRecord) -> None:
        """Create the job's run, tagged with its id and owner, before its first attempt.

        A run already tagged with the job's id is adopted instead: a service that
        stopped between creating the run and saving its id would otherwise leave
        that run behind, empty, next to a second one.
        """
        if job.mlflow_run_id or self.tracker is None:
            return
        tracking = job.config.get("tracking") or {}
        try:
            found = self.tracker.find_run(job.id)
            run_id, exp_id = found if found is not None else self.tracker.create_run(
                str(tracking.get("experiment") or "dlrm-platform"),
                str(tracking.get("run_name") or f"{job.name}-{job.id}"),
                {**(tracking.get("tags") or {}), JOB_ID_TAG: job.id, USER_TAG: job.owner},
            )
        except Exception as err:  # noqa: BLE001 - the job can create its own run; found later by tag
            log.warning("MLflow run for %s not created: %s", job.id, err)
            with self.db.transaction() as s:
                self.history.add(s, job, "warning", f"MLflow run not created by the service: {err}"[:1000])
            return
        with self.db.transaction() as s:
            j = s.get(JobRecord, job.id)
            assert j is not None
            j.mlflow_run_id, j.mlflow_experiment_id = run_id, exp_id

    def terminate(self, job: JobRecord, status: str) -> None:
        """Close the job's run with ``status`` (FINISHED, FAILED, KILLED)."""
        run_id = job.mlflow_run_id
        if not run_id or self.tracker is None:
            return
        try:
            if status == "FAILED":
                # Leave a run the job itself closed alone; close one it could not (killed).
                getter = getattr(self.tracker, "run_status", None)
                if getter is not None and getter(run_id) not in (None, "RUNNING", "SCHEDULED"):
                    return
            self.tracker.set_terminated(run_id, status)
        except Exception as err:  # noqa: BLE001 - MLflow down must not break the scheduler
            log.warning("could not mark MLflow run %s %s: %s", run_id, status, err)

    def read_summary(self, job: JobRecord) -> None:
        """The figures of a finished attempt: its summary file, then the run's last metrics."""
        path = self.files.summary_path(job.id, job.attempt)
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = {}
        self.refresh(job, force=True)
        if not summary:
            return
        with self.db.transaction() as s:
            j = s.get(JobRecord, job.id)
            assert j is not None
            for key in ("samples_per_s", "data_wait_fraction"):
                v = summary.get(key)
                if isinstance(v, int | float) and v == v and abs(v) != float("inf"):
                    setattr(j, key, float(v))
            run_id = summary.get("mlflow_run_id")
            if run_id and not j.mlflow_run_id:
                j.mlflow_run_id = str(run_id)
            j.progress_at = self.clock()

    def refresh_running(self) -> None:
        """Progress of every running job, each at most once per ``progress_interval_s``."""
        if self.tracker is None:
            return
        with self.db.session() as s:
            running = list(s.scalars(select(JobRecord).where(JobRecord.status == JobStatus.RUNNING.value)))
        for job in running:
            self.refresh(job)

    def refresh(self, job: JobRecord, force: bool = False) -> None:
        if self.tracker is None:
            return
        last = self._progress_read.get(job.id, 0.0)
        if not force and time.monotonic() - last < self.settings.progress_interval_s:
            return
        self._progress_read[job.id] = time.monotonic()
        try:
            run_id, exp_id = job.mlflow_run_id, job.mlflow_experiment_id
            if run_id is None:
                found = self.tracker.find_run(job.id)
                if found is None:
                    return
                run_id, exp_id = found
            p = self.tracker.progress(run_id)
        except Exception as err:  # noqa: BLE001 - progress is best effort
            log.debug("progress of %s: %s", job.id, err)
            return
        with self.db.transaction() as s:
            j = s.get(JobRecord, job.id)
            assert j is not None
            j.mlflow_run_id, j.mlflow_experiment_id = run_id, exp_id
            if p is not None:
                if p.steps_done is not None:
                    j.steps_done = p.steps_done
                if p.samples_per_s is not None:
                    j.samples_per_s = p.samples_per_s
                if p.data_wait_fraction is not None:
                    j.data_wait_fraction = p.data_wait_fraction
                j.progress_at = self.clock()
