"""The scheduler: one thread that moves jobs through their states, and reconciliation with Ray.

It starts queued jobs (priority, per-user limit), follows the running ones on
Ray, retries failures from their last checkpoint, enforces deadlines, and has
progress read from MLflow (:mod:`.mlflow_runs`). On start it reconciles the
records with Ray's job table. Every decision is written to the job's history.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import func, select, update

from dlrm_platform.api import policy
from dlrm_platform.api.backend import BackendJob, BackendUnavailable, JobBackend
from dlrm_platform.api.db import ACTIVE, NOT_TERMINAL, Database, JobHistory, JobRecord, JobStatus
from dlrm_platform.api.job_logs import JobFiles, JobLogs, submission_id
from dlrm_platform.api.prometheus import ServiceMetrics
from dlrm_platform.api.mlflow_runs import MlflowRuns
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.mlflow_links import JOB_ID_TAG, USER_TAG
from dlrm_platform.paths import DATA_ROOTS_ENV, OUTPUT_ROOTS_ENV
from dlrm_platform.redact import redact_text

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Moves jobs from the queue through Ray to a final state; the only writer of a job's status after submit."""

    def __init__(self, settings: ApiSettings, db: Database, backend: JobBackend, metrics: ServiceMetrics, *,
                 files: JobFiles, logs: JobLogs, runs: MlflowRuns, history: JobHistory,
                 clock: Callable[[], datetime], workdir: Path, data_roots: list[Path],
                 writable_roots: list[Path]) -> None:
        self.settings = settings
        self.db = db
        self.backend = backend
        self.metrics = metrics
        self.files = files
        self.logs = logs
        self.runs = runs
        self.history = history
        self.clock = clock
        self.workdir = workdir
        self.data_roots = data_roots
        self.writable_roots = writable_roots  # the output roots and the service's own storage
        self.ray_ok: bool | None = None
        self.reconciled = False
        self.last_tick: float | None = None
        self._stop_sent: dict[str, float] = {}
        self._last_probe = 0.0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="dlrm-job-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.reconciled:
                    self.reconcile()
                self.tick()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                self.metrics.scheduler_errors.inc()
                log.exception("scheduler pass failed")
            self._wake.wait(self.settings.scheduler_interval_s)
            self._wake.clear()

    def tick(self) -> None:
        with self._tick_lock:
            now = self.clock()
            ray_ok = self._poll_active(now)
            self._enforce_deadlines(now)
            self._stop_cancelled_queued(now)
            if ray_ok:
                self._dispatch(now)
            self.runs.refresh_running()
            self.last_tick = time.time()
            self.metrics.last_tick.set(self.last_tick)

    def reconcile(self) -> None:
        """Bring the records in line with Ray's job table after a restart of the API or of the head."""
        try:
            ray_jobs = {j.submission_id: j for j in self.backend.list_jobs()}
        except BackendUnavailable as err:
            self._set_ray_ok(False)
            log.warning("reconcile: Ray unreachable (%s); will retry", err)
            return
        self._set_ray_ok(True)
        with self.db.session() as s:
            jobs = {j.id: j for j in s.scalars(select(JobRecord))}
        # Attempts of our jobs that the records do not expect to run (an older attempt, a job
        # that ended meanwhile): stop them. Jobs these records do not know are left alone
        # (another service may share the cluster).
        for sid, info in ray_jobs.items():
            job_id = info.metadata.get("dlrm_job_id")
            if not job_id or policy.map_ray_status(info.status).terminal:
                continue
            job = jobs.get(job_id)
            if job is None:
                log.warning("reconcile: Ray job %s names job %s, which these records do not know", sid, job_id)
                continue
            if JobStatus(job.status).terminal or job.ray_submission_id != sid:
                log.warning("reconcile: stopping orphaned Ray job %s (job %s)", sid, job_id)
                try:
                    self.backend.stop(sid)
                except BackendUnavailable:
                    return
                with self.db.transaction() as s:
                    self.history.add(s, job, "reconciled", f"stopped orphaned Ray job {sid}")
        n_active = sum(1 for j in jobs.values() if j.status in ACTIVE)
        with self.db.transaction() as s:
            for job in jobs.values():
                if job.status in ACTIVE:
                    known = "known to Ray" if job.ray_submission_id in ray_jobs else "unknown to Ray"
                    self.history.add(s, job, "reconciled", f"service started; {job.ray_submission_id} {known}")
        log.info("reconciled %d records with %d Ray jobs (%d active)", len(jobs), len(ray_jobs), n_active)
        self.reconciled = True
        self._poll_active(self.clock(), ray_jobs)

    def _set_ray_ok(self, ok: bool) -> None:
        self.ray_ok = ok
        self.metrics.ray_up.set(1 if ok else 0)

    def _poll_active(self, now: datetime, known: dict[str, BackendJob] | None = None) -> bool:
        with self.db.session() as s:
            active = list(s.scalars(select(JobRecord).where(JobRecord.status.in_(ACTIVE))))
        for job in active:
            sid = job.ray_submission_id
            if sid is None:
                continue
            try:
                info = known.get(sid) if known is not None else self.backend.info(sid)
            except BackendUnavailable as err:
                self._set_ray_ok(False)
                log.warning("Ray unreachable: %s", err)
                return False
            try:
                self._apply_ray_state(job, info, now)
            except BackendUnavailable as err:
                self._set_ray_ok(False)
                log.warning("Ray unreachable: %s", err)
                return False
        if known is None and not active and (self.ray_ok is not True or time.monotonic() - self._last_probe > 10.0):
            # Nothing to poll: check reachability now and then so health and dispatch know.
            self._last_probe = time.monotonic()
            try:
                self.backend.list_jobs()
            except BackendUnavailable:
                self._set_ray_ok(False)
                return False
        self._set_ray_ok(True)
        return True

    def _apply_ray_state(self, job: JobRecord, info: BackendJob | None, now: datetime) -> None:
        sid = job.ray_submission_id
        assert sid is not None
        if info is None:
            if job.status == JobStatus.STARTING.value and not job.cancel_requested:
                # Recorded before submitting, then lost: the service stopped in between,
                # or the head restarted. Submitting the same id again is idempotent.
                with self.db.transaction() as s:
                    self.history.add(s, job, "resubmitted", f"Ray has no job {sid}; submitting it again")
                self._submit_to_ray(job)
                return
            self._attempt_ended(job, "LOST", f"Ray has no record of {sid} (head restarted?)", now)
            return
        if job.cancel_requested and not policy.map_ray_status(info.status).terminal:
            self.send_stop(job, again_after_s=10.0)
        new = policy.map_ray_status(info.status)
        if new.terminal:
            self._attempt_ended(job, new.value, info.message or "", now)
            return
        if new.value != job.status or (info.ray_job_id and info.ray_job_id != job.ray_job_id):
            with self.db.transaction() as s:
                j = s.get(JobRecord, job.id)
                assert j is not None
                if j.status != new.value:
                    j.status = new.value
                    if new == JobStatus.RUNNING and j.started_at is None:
                        j.started_at = now
                    self.history.add(s, j, "status", f"Ray reports {info.status}", new)
                j.ray_job_id = info.ray_job_id or j.ray_job_id

    def _attempt_ended(self, job: JobRecord, ray_status: str, message: str, now: datetime) -> None:
        """One attempt reached a terminal Ray state (or vanished): finish, or retry."""
        self.logs.archive(job)
        reason_stop = job.stop_reason
        if ray_status == "SUCCEEDED":
            self._finish(job, JobStatus.SUCCEEDED, "succeeded", now)
            self.runs.read_summary(job)
            return
        if reason_stop == "deadline":
            self._finish(job, JobStatus.TIMED_OUT, "deadline exceeded; stopped", now, mlflow_status="KILLED")
            return
        if job.cancel_requested or ray_status == "STOPPED":
            why = "cancelled" if job.cancel_requested else "stopped outside the service"
            self._finish(job, JobStatus.STOPPED, why, now, mlflow_status="KILLED")
            return
        what = "failed" if ray_status == "FAILED" else "was lost"
        detail = f"attempt {job.attempt} {what}: {message}".strip().rstrip(":")
        if policy.should_retry(
            attempt=job.attempt,
            max_retries=job.max_retries,
            cancel_requested=job.cancel_requested,
            deadline_at=job.deadline_at,
            now=now,
        ):
            ckpt = policy.find_latest_checkpoint(self.files.train_storage(job.id))
            resume = str(ckpt) if ckpt is not None else job.resume_from
            with self.db.transaction() as s:
                j = s.get(JobRecord, job.id)
                assert j is not None
                j.status = JobStatus.QUEUED.value
                j.status_reason = detail[:2000]
                j.resume_from = resume
                self.history.add(
                    s,
                    j,
                    "retry_scheduled",
                    f"{detail[:1000]}; retry {j.attempt}/{j.max_retries} queued, "
                    + (f"resuming from checkpoint {resume}" if resume else "no checkpoint yet: starting from zero"),
                    JobStatus.QUEUED,
                )
            self.metrics.retries.inc()
            return
        self._finish(job, JobStatus.FAILED, detail, now, mlflow_status="FAILED")

    def _finish(
        self, job: JobRecord, status: JobStatus, reason: str, now: datetime, mlflow_status: str | None = None
    ) -> None:
        with self.db.transaction() as s:
            j = s.get(JobRecord, job.id)
            assert j is not None
            if JobStatus(j.status).terminal:
                return
            j.status = status.value
            j.status_reason = reason[:2000]
            j.finished_at = now
            self.history.add(s, j, "finished", reason[:2000], status)
        self.metrics.finished.labels(status=status.value).inc()
        if mlflow_status:
            self.runs.terminate(job, mlflow_status)

    def send_stop(self, job: JobRecord, again_after_s: float | None = None) -> None:
        """Ask Ray to stop the job's attempt (at most once per ``again_after_s`` when given)."""
        sid = job.ray_submission_id
        if not sid:
            return
        last = self._stop_sent.get(sid)
        if again_after_s is not None and last is not None and time.monotonic() - last < again_after_s:
            return
        try:
            self.backend.stop(sid)
            self._stop_sent[sid] = time.monotonic()
        except BackendUnavailable as err:
            log.warning("stop %s: Ray unreachable (%s); the scheduler will retry", sid, err)

    def _enforce_deadlines(self, now: datetime) -> None:
        with self.db.session() as s:
            late = list(
                s.scalars(
                    select(JobRecord).where(
                        JobRecord.status.in_(NOT_TERMINAL),
                        JobRecord.deadline_at.is_not(None),
                        JobRecord.deadline_at <= now,
                    )
                )
            )
        for job in late:
            if job.status == JobStatus.QUEUED.value:
                with self.db.transaction() as s:
                    s.info.setdefault("changed_jobs", set()).add(job.id)
                    res = s.execute(
                        update(JobRecord)
                        .where(JobRecord.id == job.id, JobRecord.status == JobStatus.QUEUED.value)
                        .values(
                            status=JobStatus.TIMED_OUT.value,
                            stop_reason="deadline",
                            status_reason="deadline exceeded while queued",
                            finished_at=now,
                        )
                    )
                    if res.rowcount:
                        self.history.add(s, job, "finished", "deadline exceeded while queued", JobStatus.TIMED_OUT)
                if res.rowcount:
                    self.metrics.finished.labels(status=JobStatus.TIMED_OUT.value).inc()
                    self.runs.terminate(job, "KILLED")
            elif job.stop_reason is None:
                with self.db.transaction() as s:
                    j = s.get(JobRecord, job.id)
                    assert j is not None
                    j.stop_reason = "deadline"
                    self.history.add(s, j, "deadline", "deadline exceeded; stopping the Ray job")
                self.send_stop(job)

    def _stop_cancelled_queued(self, now: datetime) -> None:
        with self.db.session() as s:
            jobs = list(
                s.scalars(
                    select(JobRecord).where(
                        JobRecord.status == JobStatus.QUEUED.value, JobRecord.cancel_requested.is_(True)
                    )
                )
            )
        for job in jobs:
            self._finish(job, JobStatus.STOPPED, "cancelled", now, mlflow_status="KILLED")

    def _dispatch(self, now: datetime) -> None:
        with self.db.session() as s:
            running = dict(
                s.execute(
                    select(JobRecord.owner, func.count())
                    .where(JobRecord.status.in_(ACTIVE))
                    .group_by(JobRecord.owner)
                ).all()
            )
            queued = [
                policy.QueuedJob(id=r.id, owner=r.owner, priority=r.priority, created_at=r.created_at)
                for r in s.execute(
                    select(JobRecord.id, JobRecord.owner, JobRecord.priority, JobRecord.created_at).where(
                        JobRecord.status == JobStatus.QUEUED.value, JobRecord.cancel_requested.is_(False)
                    )
                )
            ]
        self.metrics.queue_depth.set(len(queued))
        chosen = policy.select_jobs_to_start(
            queued,
            running,
            max_running=self.settings.max_running_jobs,
            max_running_per_user=self.settings.max_running_per_user,
        )
        for q in chosen:
            self._start_attempt(q.id, now)

    def _start_attempt(self, job_id: str, now: datetime) -> None:
        with self.db.transaction() as s:
            job = s.get(JobRecord, job_id)
            if job is None or job.status != JobStatus.QUEUED.value or job.cancel_requested:
                return
            attempt = job.attempt + 1
            sid = submission_id(job.id, attempt)
            s.info.setdefault("changed_jobs", set()).add(job_id)
            res = s.execute(
                update(JobRecord)
                .where(JobRecord.id == job_id, JobRecord.status == JobStatus.QUEUED.value)
                .values(
                    status=JobStatus.STARTING.value,
                    attempt=attempt,
                    ray_submission_id=sid,
                    ray_job_id=None,
                    started_at=job.started_at or now,
                )
            )
            if res.rowcount != 1:
                return
        job = self.db.get_job(job_id)
        self.runs.ensure_run(job)
        job = self.db.get_job(job_id)
        with self.db.transaction() as s:
            self.history.add(
                s,
                job,
                "attempt_started",
                f"attempt {job.attempt}: submitted to Ray as {sid}"
                + (f", resuming from {job.resume_from}" if job.resume_from else ""),
                JobStatus.STARTING,
            )
        self.metrics.attempts.inc()
        self._submit_to_ray(job)

    def job_overrides(self, job: JobRecord) -> dict[str, Any]:
        """What the service sets on every attempt: tracking, tags, the run, checkpoint storage, resume."""
        ov: dict[str, Any] = {
            "tracking.tracking_uri": self.settings.mlflow_tracking_uri,
            f"tracking.tags.{JOB_ID_TAG}": job.id,
            f"tracking.tags.{USER_TAG}": job.owner,
            "train.storage_path": str(self.files.train_storage(job.id)),
        }
        if job.mlflow_run_id:
            ov["tracking.run_id"] = job.mlflow_run_id
        if job.resume_from:
            ov["train.resume_from"] = job.resume_from
        return ov

    def _submit_to_ray(self, job: JobRecord) -> None:
        sid = job.ray_submission_id
        assert sid is not None
        job_dir = self.files.job_dir(job.id)
        job_dir.mkdir(parents=True, exist_ok=True)
        config_path = job_dir / "job.yaml"
        if not config_path.exists():
            tmp = config_path.with_suffix(".tmp")
            tmp.write_text(
                f"# job {job.id} of {job.owner}: the resolved config; the service adds --set overrides\n"
                + yaml.safe_dump(job.config, sort_keys=False)
            )
            tmp.replace(config_path)
        entrypoint = policy.build_entrypoint(
            python=self.settings.job_python,
            workdir=self.workdir,
            config_path=config_path,
            overrides=self.job_overrides(job),
            summary_path=self.files.summary_path(job.id, job.attempt),
        )
        runtime_env = {
            "env_vars": {
                "MLFLOW_TRACKING_URI": self.settings.mlflow_tracking_uri,
                "PYTHONUNBUFFERED": "1",
                "DLRM_JOB_ID": job.id,
                # The job checks its paths again before it starts (dlrm_platform.paths).
                DATA_ROOTS_ENV: os.pathsep.join(str(r) for r in self.data_roots),
                OUTPUT_ROOTS_ENV: os.pathsep.join(str(r) for r in self.writable_roots),
            }
        }
        metadata = {"dlrm_job_id": job.id, "owner": job.owner, "attempt": str(job.attempt)}
        try:
            self.backend.submit(
                sid,
                entrypoint,
                runtime_env=runtime_env,
                metadata=metadata,
                entrypoint_num_cpus=self.settings.job_entrypoint_num_cpus,
            )
        except BackendUnavailable as err:
            # Stays STARTING; the next pass finds Ray has no such job and submits again.
            self._set_ray_ok(False)
            log.warning("submit %s: Ray unreachable (%s)", sid, err)
            return
        except Exception as err:  # noqa: BLE001 - Ray refused the job (bad runtime env, ...)
            self._finish(job, JobStatus.FAILED, f"Ray refused the submission: {err}", self.clock())
            return
        log.info("submitted %s: %s", sid, redact_text(entrypoint))
