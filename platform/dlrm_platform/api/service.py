"""The job service: requests, the queue, the scheduler loop and reconciliation with Ray.

The database is the source of truth. Request handlers only insert jobs, read
them and set ``cancel_requested``; one scheduler thread moves jobs through
their states: it starts queued jobs (priority, per-user limit), follows the
running ones on Ray, retries failures from their last checkpoint, enforces
deadlines and reads progress from MLflow. On start it reconciles the records
with Ray's job table. Every decision is written to the job's history.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from sqlalchemy import event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlrm_platform.api import policy
from dlrm_platform.api.auth import KeyCache, Principal
from dlrm_platform.api.backend import BackendJob, BackendUnavailable, JobBackend
from dlrm_platform.api.db import (
    Database,
    JobEventRecord,
    JobRecord,
    JobStatus,
    utcnow,
)
from dlrm_platform.api.metrics import ServiceMetrics
from dlrm_platform.api.schemas.requests import JobSubmitRequest
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.tracking import JOB_ID_TAG, USER_TAG, Tracker
from dlrm_platform.config import ConfigError, JobConfig, apply_overrides
from dlrm_platform.paths import DATA_ROOTS_ENV, OUTPUT_ROOTS_ENV, check_job_paths
from dlrm_platform.redact import redact_text

log = logging.getLogger(__name__)

ACTIVE = (JobStatus.STARTING.value, JobStatus.RUNNING.value)
# Fields the service sets on every attempt (job_overrides): a request may not choose them, or a user could
# resume from, or log into, another user's checkpoint or MLflow run.
SERVICE_FIELDS = (("train", "storage_path"), ("train", "resume_from"), ("tracking", "run_id"))
NOT_TERMINAL = (JobStatus.QUEUED.value, *ACTIVE)


# --------------------------------------------------------------------------- errors the routes map to HTTP


class ServiceError(Exception):
    status_code = 400


class NotFound(ServiceError):
    status_code = 404


class Forbidden(ServiceError):
    status_code = 403


class Conflict(ServiceError):
    status_code = 409


class InvalidRequest(ServiceError):
    """422 with FastAPI's validation-error body: ``errors`` are ``{loc, msg, type}``."""

    status_code = 422

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(e["msg"] for e in errors))
        self.errors = errors


@dataclass
class LogSource:
    attempt: int
    submission_id: str | None
    archived: Path | None


class ViewCache:
    """Rendered job views (JSON bytes) by job id, so that polling a job costs no query.

    Every committed change to a job or its history drops its entry (session
    events), and entries expire after ``ttl_s`` whatever happens.
    """

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, str, bytes]] = {}
        self._generations = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> tuple[str, bytes] | None:
        hit = self._entries.get(job_id)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1], hit[2]

    def put(self, job_id: str, owner: str, body: bytes, generation: int) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if generation != self.generation(job_id):
                return  # changed while it was being rendered
            if len(self._entries) > 50_000:
                self._entries.clear()
            self._entries[job_id] = (time.monotonic() + self.ttl_s, owner, body)

    def invalidate(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._entries.pop(job_id, None)
                self._generations[job_id] = self._generations.get(job_id, 0) + 1

    def generation(self, job_id: str) -> int:
        return self._generations.get(job_id, 0)



def new_job_id() -> str:
    return f"job-{secrets.token_hex(8)}"


def _collect_changed_jobs(session: Session, _ctx: Any) -> None:
    changed = session.info.setdefault("changed_jobs", set())
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, JobRecord):
            changed.add(obj.id)
        elif isinstance(obj, JobEventRecord):
            changed.add(obj.job_id)


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
        self.storage_root = settings.storage_dir.resolve()
        self.workdir = settings.job_workdir.resolve()
        self.data_roots = [r if r.is_absolute() else self.workdir / r for r in settings.data_roots]
        self.output_roots = [r if r.is_absolute() else self.workdir / r for r in settings.output_roots]
        self.key_cache = KeyCache(settings.auth_cache_ttl_s)
        self.view_cache = ViewCache(settings.view_cache_ttl_s)
        # (job id, user) -> the render in flight: concurrent polls of one job share one render
        self.view_renders: dict[tuple[str, str], asyncio.Future] = {}
        event.listen(db.session_factory, "after_flush", _collect_changed_jobs)
        event.listen(db.session_factory, "after_commit", self._invalidate_committed)
        self.ray_ok: bool | None = None
        self.reconciled = False
        self.last_tick: float | None = None
        self._progress_read: dict[str, float] = {}
        self._stop_sent: dict[str, float] = {}
        self._last_probe = 0.0
        self._config_files: dict[Path, tuple[int, Any]] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()

    def _invalidate_committed(self, session: Session) -> None:
        changed = session.info.pop("changed_jobs", None)
        if changed:
            self.view_cache.invalidate(changed)

    # ------------------------------------------------------------------ lifecycle

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
    def scheduler_alive(self) -> bool:
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

    # ------------------------------------------------------------------ requests

    def resolve_config(self, req: JobSubmitRequest) -> dict[str, Any]:
        """The validated job config of a request, as a JSON-able dict. Raises InvalidRequest."""
        if req.config_name is not None:
            source = f"configs/{req.config_name}"
            path = self._config_path(req.config_name)
            if path is None:
                raise InvalidRequest(
                    [
                        {
                            "loc": ["body", "config_name"],
                            "msg": f"no config named {req.config_name!r} in {self.settings.configs_dir}",
                            "type": "value_error",
                        }
                    ]
                )
            try:
                raw = self._read_config_file(path)
            except (OSError, yaml.YAMLError) as err:
                raise InvalidRequest(
                    [{"loc": ["body", "config_name"], "msg": f"{source}: unreadable: {err}", "type": "value_error"}]
                ) from None
            if not isinstance(raw, dict):
                raise InvalidRequest(
                    [{"loc": ["body", "config_name"], "msg": f"{source} is not a job config", "type": "value_error"}]
                )
        else:
            source = "config"
            raw = req.config or {}
        try:
            raw = apply_overrides(raw, req.overrides)
        except ConfigError as err:
            raise InvalidRequest([{"loc": ["body", "overrides"], "msg": str(err), "type": "value_error"}]) from None
        try:
            cfg = JobConfig.model_validate(raw)
        except ValidationError as err:
            errors = []
            for e in err.errors():
                path = [str(p) for p in e["loc"]]
                dotted = ".".join(path) or "<root>"
                msg = "unknown key (not a field of this section)" if e["type"] == "extra_forbidden" else e["msg"]
                errors.append(
                    {"loc": ["body", "config", *path], "msg": f"{source}: {dotted}: {msg}", "type": e["type"]}
                )
            raise InvalidRequest(errors) from None
        self._check_request_paths(cfg, raw, source)
        return cfg.model_dump(mode="json")

    def _check_request_paths(self, cfg: JobConfig, raw: dict[str, Any], source: str) -> None:
        """422 for a service-managed field set by the request, or a path outside the data/output roots."""
        errors = []
        for section, name in SERVICE_FIELDS:
            if isinstance(raw.get(section), dict) and raw[section].get(name) is not None:
                errors.append({
                    "loc": ["body", "config", section, name],
                    "msg": f"{source}: {section}.{name}: set by the service for every attempt; not accepted "
                    "in a request",
                    "type": "value_error",
                })
        for problem in check_job_paths(cfg, self.data_roots, [*self.output_roots, self.storage_root], self.workdir):
            errors.append({
                "loc": ["body", "config", *problem.field.split(".")],
                "msg": f"{source}: {problem.message}",
                "type": "path_outside_roots",
            })
        if errors:
            raise InvalidRequest(errors)

    def _read_config_file(self, path: Path) -> Any:
        """YAML of a named config, parsed once per version of the file (submissions are hot)."""
        import copy

        mtime = path.stat().st_mtime_ns
        hit = self._config_files.get(path)
        if hit is None or hit[0] != mtime:
            hit = (mtime, yaml.safe_load(path.read_text()))
            self._config_files[path] = hit
        return copy.deepcopy(hit[1])

    def _config_path(self, name: str) -> Path | None:
        base = self.settings.configs_dir.resolve()
        for suffix in (".yaml", ".yml"):
            p = (base / f"{name}{suffix}").resolve()
            if p.parent == base and p.is_file():
                return p
        return None

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
                self._event(s, job, "submitted", f"queued with priority {job.priority} by {principal.user}")
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
                self._event(s, job, "cancelled", f"cancelled by {principal.user} while queued", JobStatus.STOPPED)
                self.metrics.finished.labels(status=JobStatus.STOPPED.value).inc()
                stopped_queued = True
            else:
                job = s.get(JobRecord, job_id)
                assert job is not None
                if JobStatus(job.status).terminal:
                    raise Conflict(f"job {job_id} already finished ({job.status})")
                job.cancel_requested = True
                job.stop_reason = job.stop_reason or "cancelled"
                self._event(s, job, "cancel_requested", f"cancel requested by {principal.user}")
                stopped_queued = False
        if stopped_queued:
            self._mlflow_terminate(job, "KILLED")
        else:
            self._send_stop(job)
        self.wake()
        return self._reload(job_id)

    def _reload(self, job_id: str) -> JobRecord:
        with self.db.session() as s:
            job = s.get(JobRecord, job_id)
        assert job is not None
        return job

    # ------------------------------------------------------------------ logs

    def log_source(self, job: JobRecord, attempt: int | None) -> LogSource:
        n = attempt or job.attempt
        if n < 1 or n > max(job.attempt, 0):
            return LogSource(attempt=n, submission_id=None, archived=None)
        archived = self._log_path(job.id, n)
        return LogSource(
            attempt=n,
            submission_id=self.submission_id(job.id, n),
            archived=archived if archived.is_file() else None,
        )

    def read_logs(self, job: JobRecord, attempt: int | None) -> str:
        src = self.log_source(job, attempt)
        if src.submission_id is None:
            return ""
        current = src.attempt == job.attempt and not JobStatus(job.status).terminal
        if src.archived is not None and not current:
            return src.archived.read_text(errors="replace")
        try:
            text = self.backend.logs(src.submission_id)
        except BackendUnavailable:
            text = ""
        if not text and src.archived is not None:
            return src.archived.read_text(errors="replace")
        return text

    async def follow_logs(self, job_id: str, attempt: int | None) -> AsyncIterator[str]:
        """Stream the logs of an attempt (by default the current one, then each retry) until it ends."""
        streamed: int | None = None
        while True:
            job = await asyncio.to_thread(self._reload, job_id)
            status = JobStatus(job.status)
            target = attempt or job.attempt
            if target < 1 or target > job.attempt or target == streamed:
                if status.terminal or (target == streamed and attempt is not None):
                    return
                await asyncio.sleep(1.0)  # queued, or waiting for the next attempt
                continue
            if target == job.attempt and status == JobStatus.STARTING:
                await asyncio.sleep(0.5)  # Ray has not started the driver yet
                continue
            streamed = target
            if status.terminal or target < job.attempt:
                yield await asyncio.to_thread(self.read_logs, job, target)
                continue
            try:
                async for chunk in self.backend.tail(self.submission_id(job_id, target)):
                    yield chunk
            except Exception as err:  # noqa: BLE001 - the stream ends with a note, not a 500
                yield f"\n[dlrm-platform] log stream interrupted: {err}\n"
                return

    # ------------------------------------------------------------------ scheduler

    def tick(self) -> None:
        with self._tick_lock:
            now = self.clock()
            ray_ok = self._poll_active(now)
            self._enforce_deadlines(now)
            self._stop_cancelled_queued(now)
            if ray_ok:
                self._dispatch(now)
            self._refresh_progress()
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
                    self._event(s, job, "reconciled", f"stopped orphaned Ray job {sid}")
        n_active = sum(1 for j in jobs.values() if j.status in ACTIVE)
        with self.db.transaction() as s:
            for job in jobs.values():
                if job.status in ACTIVE:
                    known = "known to Ray" if job.ray_submission_id in ray_jobs else "unknown to Ray"
                    self._event(s, job, "reconciled", f"service started; {job.ray_submission_id} {known}")
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
                    self._event(s, job, "resubmitted", f"Ray has no job {sid}; submitting it again")
                self._submit_to_ray(job)
                return
            self._attempt_ended(job, "LOST", f"Ray has no record of {sid} (head restarted?)", now)
            return
        if job.cancel_requested and not policy.map_ray_status(info.status).terminal:
            self._send_stop(job, again_after_s=10.0)
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
                    self._event(s, j, "status", f"Ray reports {info.status}", new)
                j.ray_job_id = info.ray_job_id or j.ray_job_id

    def _attempt_ended(self, job: JobRecord, ray_status: str, message: str, now: datetime) -> None:
        """One attempt reached a terminal Ray state (or vanished): finish, or retry."""
        self._archive_logs(job)
        reason_stop = job.stop_reason
        if ray_status == "SUCCEEDED":
            self._finish(job, JobStatus.SUCCEEDED, "succeeded", now)
            self._read_summary(job)
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
            ckpt = policy.find_latest_checkpoint(self._train_storage(job.id))
            resume = str(ckpt) if ckpt is not None else job.resume_from
            with self.db.transaction() as s:
                j = s.get(JobRecord, job.id)
                assert j is not None
                j.status = JobStatus.QUEUED.value
                j.status_reason = detail[:2000]
                j.resume_from = resume
                self._event(
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
            self._event(s, j, "finished", reason[:2000], status)
        self.metrics.finished.labels(status=status.value).inc()
        if mlflow_status:
            self._mlflow_terminate(job, mlflow_status)

    def _mlflow_terminate(self, job: JobRecord, status: str) -> None:
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

    def _send_stop(self, job: JobRecord, again_after_s: float | None = None) -> None:
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
                        self._event(s, job, "finished", "deadline exceeded while queued", JobStatus.TIMED_OUT)
                if res.rowcount:
                    self.metrics.finished.labels(status=JobStatus.TIMED_OUT.value).inc()
                    self._mlflow_terminate(job, "KILLED")
            elif job.stop_reason is None:
                with self.db.transaction() as s:
                    j = s.get(JobRecord, job.id)
                    assert j is not None
                    j.stop_reason = "deadline"
                    self._event(s, j, "deadline", "deadline exceeded; stopping the Ray job")
                self._send_stop(job)

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

    @staticmethod
    def submission_id(job_id: str, attempt: int) -> str:
        return f"{job_id}-{attempt}"

    def _job_dir(self, job_id: str) -> Path:
        return self.storage_root / job_id

    def _train_storage(self, job_id: str) -> Path:
        return self._job_dir(job_id) / "train"

    def _log_path(self, job_id: str, attempt: int) -> Path:
        return self._job_dir(job_id) / "logs" / f"attempt-{attempt}.log"

    def _summary_path(self, job_id: str, attempt: int) -> Path:
        return self._job_dir(job_id) / f"summary-{attempt}.json"

    def _start_attempt(self, job_id: str, now: datetime) -> None:
        with self.db.transaction() as s:
            job = s.get(JobRecord, job_id)
            if job is None or job.status != JobStatus.QUEUED.value or job.cancel_requested:
                return
            attempt = job.attempt + 1
            sid = self.submission_id(job.id, attempt)
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
        job = self._reload(job_id)
        self._ensure_mlflow_run(job)
        job = self._reload(job_id)
        with self.db.transaction() as s:
            self._event(
                s,
                job,
                "attempt_started",
                f"attempt {job.attempt}: submitted to Ray as {sid}"
                + (f", resuming from {job.resume_from}" if job.resume_from else ""),
                JobStatus.STARTING,
            )
        self.metrics.attempts.inc()
        self._submit_to_ray(job)

    def _ensure_mlflow_run(self, job: JobRecord) -> None:
        if job.mlflow_run_id or self.tracker is None:
            return
        tracking = job.config.get("tracking") or {}
        try:
            run_id, exp_id = self.tracker.create_run(
                str(tracking.get("experiment") or "dlrm-platform"),
                str(tracking.get("run_name") or f"{job.name}-{job.id}"),
                {**(tracking.get("tags") or {}), JOB_ID_TAG: job.id, USER_TAG: job.owner},
            )
        except Exception as err:  # noqa: BLE001 - the job can create its own run; found later by tag
            log.warning("MLflow run for %s not created: %s", job.id, err)
            with self.db.transaction() as s:
                self._event(s, job, "warning", f"MLflow run not created by the service: {err}"[:1000])
            return
        with self.db.transaction() as s:
            j = s.get(JobRecord, job.id)
            assert j is not None
            j.mlflow_run_id, j.mlflow_experiment_id = run_id, exp_id

    def job_overrides(self, job: JobRecord) -> dict[str, Any]:
        """What the service sets on every attempt: tracking, tags, the run, checkpoint storage, resume."""
        ov: dict[str, Any] = {
            "tracking.tracking_uri": self.settings.mlflow_tracking_uri,
            f"tracking.tags.{JOB_ID_TAG}": job.id,
            f"tracking.tags.{USER_TAG}": job.owner,
            "train.storage_path": str(self._train_storage(job.id)),
        }
        if job.mlflow_run_id:
            ov["tracking.run_id"] = job.mlflow_run_id
        if job.resume_from:
            ov["train.resume_from"] = job.resume_from
        return ov

    def _submit_to_ray(self, job: JobRecord) -> None:
        sid = job.ray_submission_id
        assert sid is not None
        job_dir = self._job_dir(job.id)
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
            summary_path=self._summary_path(job.id, job.attempt),
        )
        runtime_env = {
            "env_vars": {
                "MLFLOW_TRACKING_URI": self.settings.mlflow_tracking_uri,
                "PYTHONUNBUFFERED": "1",
                "DLRM_JOB_ID": job.id,
                # The job checks its paths again before it starts (dlrm_platform.paths).
                DATA_ROOTS_ENV: os.pathsep.join(str(r) for r in self.data_roots),
                OUTPUT_ROOTS_ENV: os.pathsep.join(str(r) for r in [*self.output_roots, self.storage_root]),
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

    def _archive_logs(self, job: JobRecord) -> None:
        if not job.ray_submission_id or job.attempt < 1:
            return
        path = self._log_path(job.id, job.attempt)
        try:
            text = self.backend.logs(job.ray_submission_id)
        except BackendUnavailable:
            return
        if text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def _read_summary(self, job: JobRecord) -> None:
        import json

        path = self._summary_path(job.id, job.attempt)
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = {}
        self._refresh_one(job, force=True)
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

    def _refresh_progress(self) -> None:
        if self.tracker is None:
            return
        with self.db.session() as s:
            running = list(s.scalars(select(JobRecord).where(JobRecord.status == JobStatus.RUNNING.value)))
        for job in running:
            self._refresh_one(job)

    def _refresh_one(self, job: JobRecord, force: bool = False) -> None:
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

    # ------------------------------------------------------------------ history

    def _event(
        self, s: Session, job: JobRecord, kind: str, message: str, status: JobStatus | None = None
    ) -> None:
        s.add(
            JobEventRecord(
                job_id=job.id,
                at=self.clock(),
                attempt=job.attempt,
                kind=kind,
                status=status.value if status else None,
                message=message,
            )
        )

    # ------------------------------------------------------------------ counts for /metrics

    def status_counts(self) -> dict[str, int]:
        with self.db.session() as s:
            return {str(k): int(v) for k, v in s.execute(select(JobRecord.status, func.count()).group_by(JobRecord.status))}

    def running_users(self) -> Sequence[str]:
        with self.db.session() as s:
            return list(s.scalars(select(JobRecord.owner).where(JobRecord.status.in_(ACTIVE)).distinct()))
