"""The job service: what the API's routes call. Requests insert, read and cancel jobs.

The database is the source of truth. Request handlers only insert jobs, read
them and set ``cancel_requested``; the scheduler (:mod:`.scheduler`) moves jobs
through their states. The parts, one concern each:

* :mod:`.job_configs`: a request's config (named or inline, overrides, validation, paths);
* :mod:`.scheduler`: the queue, Ray, retries, deadlines, reconciliation;
* :mod:`.job_logs`: the job's files and its logs (archived when an attempt ends);
* :mod:`.mlflow_runs`: the job's MLflow run and the progress read from it;
* :mod:`.view_cache`: rendered job views; :mod:`.errors`: what the routes map to HTTP.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from dlrm_platform.api.auth import KeyCache, Principal
from dlrm_platform.api.backend import JobBackend
from dlrm_platform.api.db import (
    ACTIVE,
    Database,
    JobEventRecord,
    JobHistory,
    JobRecord,
    JobStatus,
    utcnow,
)
from dlrm_platform.api.errors import Conflict, Forbidden, InvalidRequest, NotFound
from dlrm_platform.api.job_configs import ConfigResolver
from dlrm_platform.api.job_logs import JobFiles, JobLogs
from dlrm_platform.api.prometheus import ServiceMetrics
from dlrm_platform.api.mlflow_runs import MlflowRuns
from dlrm_platform.api.schemas.requests import JobSubmitRequest
from dlrm_platform.api.scheduler import Scheduler
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.mlflow_links import Tracker
from dlrm_platform.api.view_cache import ViewCache

__all__ = ["JobService", "new_job_id"]


def new_job_id() -> str:
    return f"job-{secrets.token_hex(8)}"


class JobService:
    def __init__(
        self,
        settings: ApiSettings,
        db: Database,
        backend: JobBackend,
        tracker: Tracker | None,
        metrics: ServiceMetrics,
        clock: Callable[[], datetime] = utcnow,
    ):
        self.settings = settings
        self.db = db
        self.backend = backend
        self.tracker = tracker
        self.metrics = metrics
        self.clock = clock
        workdir = settings.job_workdir.resolve()
        storage_root = settings.storage_dir.resolve()
        data_roots = [r if r.is_absolute() else workdir / r for r in settings.data_roots]
        writable_roots = [*(r if r.is_absolute() else workdir / r for r in settings.output_roots), storage_root]
        self.key_cache = KeyCache(settings.auth_cache_ttl_s)
        self.view_cache = ViewCache(settings.view_cache_ttl_s)
        self.view_cache.watch(db.session_factory)
        # (job id, user) -> the render in flight: concurrent polls of one job share one render
        self.view_renders: dict[tuple[str, str], asyncio.Future] = {}
        self.history = JobHistory(self.now)
        self.configs = ConfigResolver(settings, data_roots, writable_roots, workdir)
        files = JobFiles(storage_root)
        self.logs = JobLogs(db, backend, files)
        self.runs = MlflowRuns(settings, db, tracker, files, self.history, self.now)
        self.scheduler = Scheduler(settings, db, backend, metrics, files=files, logs=self.logs, runs=self.runs,
                                   history=self.history, clock=self.now, workdir=workdir, data_roots=data_roots,
                                   writable_roots=writable_roots)

    def now(self) -> datetime:
        """The service's clock (``clock``, replaceable in tests)."""
        return self.clock()

    # ------------------------------------------------------------------ the scheduler

    def start(self) -> None:
        self.scheduler.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.scheduler.stop(timeout)

    def wake(self) -> None:
        self.scheduler.wake()

    def tick(self) -> None:
        self.scheduler.tick()

    def reconcile(self) -> None:
        self.scheduler.reconcile()

    @property
    def scheduler_alive(self) -> bool:
        return self.scheduler.alive

    @property
    def ray_ok(self) -> bool | None:
        return self.scheduler.ray_ok

    # ------------------------------------------------------------------ requests

    def resolve_config(self, req: JobSubmitRequest) -> dict[str, Any]:
        """The validated job config of a request, as a JSON-able dict. Raises InvalidRequest."""
        return self.configs.resolve(req)

    def submit(self, principal: Principal, req: JobSubmitRequest) -> tuple[JobRecord, bool]:
        fingerprint = req.fingerprint()
        if req.idempotency_key is not None:
            existing = self._by_idempotency_key(principal.user, req.idempotency_key)
            if existing is not None:
                return self._idempotent_match(existing, fingerprint), False
        config = self.resolve_config(req)
        now = self.clock()
        job = JobRecord(
            id=new_job_id(),
            owner=principal.user,
            status=JobStatus.QUEUED.value,
            priority=req.priority,
            name=str(config.get("name") or "dlrm"),
            config_name=req.config_name,
            overrides=req.overrides,
            config=config,
            request_hash=fingerprint,
            idempotency_key=req.idempotency_key,
            max_retries=(
                req.max_retries if req.max_retries is not None else self.settings.default_max_retries
            ),
            deadline_at=now + timedelta(seconds=req.deadline_s) if req.deadline_s else None,
            created_at=now,
            updated_at=now,
        )
        if job.max_retries > self.settings.max_retries_limit:
            raise InvalidRequest(
                [
                    {
                        "loc": ["body", "max_retries"],
                        "msg": f"at most {self.settings.max_retries_limit} retries",
                        "type": "less_than_equal",
                    }
                ]
            )
        try:
            with self.db.transaction() as s:
                s.add(job)
                s.flush()
                self.history.add(s, job, "submitted", f"queued with priority {job.priority} by {principal.user}")
        except IntegrityError:
            # The same idempotency key raced in from another request.
            existing = self._by_idempotency_key(principal.user, req.idempotency_key or "")
            if existing is None:
                raise
            return self._idempotent_match(existing, fingerprint), False
        self.metrics.submitted.inc()
        self.wake()
        return job, True

    def _by_idempotency_key(self, user: str, key: str) -> JobRecord | None:
        with self.db.session() as s:
            return s.scalar(select(JobRecord).where(JobRecord.owner == user, JobRecord.idempotency_key == key))

    @staticmethod
    def _idempotent_match(existing: JobRecord, fingerprint: str) -> JobRecord:
        if existing.request_hash != fingerprint:
            raise Conflict(
                f"idempotency key already used for job {existing.id} with a different request body"
            )
        return existing

    def get(self, principal: Principal, job_id: str) -> JobRecord:
        with self.db.session() as s:
            job = s.get(JobRecord, job_id)
        if job is None or (job.owner != principal.user and not principal.is_admin):
            raise NotFound(f"no job {job_id}")  # another user's job is not even acknowledged
        return job

    def get_with_events(self, principal: Principal, job_id: str) -> tuple[JobRecord, list[JobEventRecord]]:
        with self.db.session() as s:
            job = s.get(JobRecord, job_id)
            if job is None or (job.owner != principal.user and not principal.is_admin):
                raise NotFound(f"no job {job_id}")
            events = list(
                s.scalars(
                    select(JobEventRecord).where(JobEventRecord.job_id == job_id).order_by(JobEventRecord.id)
                )
            )
        return job, events

    def events(self, job_id: str) -> list[JobEventRecord]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(JobEventRecord).where(JobEventRecord.job_id == job_id).order_by(JobEventRecord.id)
                )
            )

    def list(
        self,
        principal: Principal,
        *,
        status: JobStatus | None,
        owner: str | None,
        limit: int,
        offset: int,
    ) -> tuple[list[JobRecord], int]:
        if not principal.is_admin:
            if owner is not None and owner != principal.user:
                raise Forbidden("only admins can list other users' jobs")
            owner = principal.user
        conds = []
        if owner is not None:
            conds.append(JobRecord.owner == owner)
        if status is not None:
            conds.append(JobRecord.status == status.value)
        with self.db.session() as s:
            total = s.scalar(select(func.count()).select_from(JobRecord).where(*conds)) or 0
            rows = list(
                s.scalars(
                    select(JobRecord)
                    .where(*conds)
                    .order_by(JobRecord.created_at.desc(), JobRecord.id.desc())
                    .limit(limit)
                    .offset(offset)
                )
            )
        return rows, int(total)

    def cancel(self, principal: Principal, job_id: str) -> JobRecord:
        job = self.get(principal, job_id)
        if JobStatus(job.status).terminal:
            raise Conflict(f"job {job_id} already finished ({job.status})")
        now = self.clock()
        with self.db.transaction() as s:
            # A queued job stops here and now, unless the scheduler just started it.
            s.info.setdefault("changed_jobs", set()).add(job_id)
            res = s.execute(
                update(JobRecord)
                .where(JobRecord.id == job_id, JobRecord.status == JobStatus.QUEUED.value)
                .values(
                    status=JobStatus.STOPPED.value,
                    cancel_requested=True,
                    stop_reason="cancelled",
                    status_reason=f"cancelled by {principal.user} while queued",
                    finished_at=now,
                    updated_at=now,
                )
            )
            if res.rowcount == 1:
                job = s.get(JobRecord, job_id)
                assert job is not None
                self.history.add(s, job, "cancelled", f"cancelled by {principal.user} while queued", JobStatus.STOPPED)
                self.metrics.finished.labels(status=JobStatus.STOPPED.value).inc()
                stopped_queued = True
            else:
                job = s.get(JobRecord, job_id)
                assert job is not None
                if JobStatus(job.status).terminal:
                    raise Conflict(f"job {job_id} already finished ({job.status})")
                job.cancel_requested = True
                job.stop_reason = job.stop_reason or "cancelled"
                self.history.add(s, job, "cancel_requested", f"cancel requested by {principal.user}")
                stopped_queued = False
        if stopped_queued:
            self.runs.terminate(job, "KILLED")
        else:
            self.scheduler.send_stop(job)
        self.wake()
        return self.db.get_job(job_id)

    # ------------------------------------------------------------------ logs

    def read_logs(self, job: JobRecord, attempt: int | None) -> str:
        return self.logs.read_logs(job, attempt)

    def follow_logs(self, job_id: str, attempt: int | None) -> AsyncIterator[str]:
        """Stream the logs of an attempt (by default the current one, then each retry) until it ends."""
        return self.logs.follow_logs(job_id, attempt)

    # ------------------------------------------------------------------ counts for /metrics

    def status_counts(self) -> dict[str, int]:
        with self.db.session() as s:
            return {str(k): int(v) for k, v in s.execute(select(JobRecord.status, func.count()).group_by(JobRecord.status))}

    def running_users(self) -> Sequence[str]:
        with self.db.session() as s:
            return list(s.scalars(select(JobRecord.owner).where(JobRecord.status.in_(ACTIVE)).distinct()))
