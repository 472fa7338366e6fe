"""Where a job's files live under the service's storage, and its logs: archived, read, followed.

Ray keeps a driver's logs only while it remembers the job; the service copies
each attempt's logs into ``STORAGE/<job>/logs/attempt-N.log`` when the attempt
ends and serves them from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from dlrm_platform.api.backend import BackendUnavailable, JobBackend
from dlrm_platform.api.db import Database, JobRecord, JobStatus

__all__ = ["JobFiles", "JobLogs", "LogSource", "submission_id"]


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of one attempt of a job."""
    return f"{job_id}-{attempt}"


@dataclass(frozen=True)
class JobFiles:
    """The layout of the service's storage: one directory per job."""

    root: Path

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def train_storage(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "train"

    def log_path(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / "logs" / f"attempt-{attempt}.log"

    def summary_path(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"summary-{attempt}.json"


@dataclass
class LogSource:
    attempt: int
    submission_id: str | None
    archived: Path | None


class JobLogs:
    """A job's logs: from Ray while an attempt runs, from the archive once it ended."""

    def __init__(self, db: Database, backend: JobBackend, files: JobFiles) -> None:
        self.db = db
        self.backend = backend
        self.files = files

    def log_source(self, job: JobRecord, attempt: int | None) -> LogSource:
        n = attempt or job.attempt
        if n < 1 or n > max(job.attempt, 0):
            return LogSource(attempt=n, submission_id=None, archived=None)
        archived = self.files.log_path(job.id, n)
        return LogSource(
            attempt=n,
            submission_id=submission_id(job.id, n),
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
            job = await asyncio.to_thread(self.db.get_job, job_id)
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
                async for chunk in self.backend.tail(submission_id(job_id, target)):
                    yield chunk
            except Exception as err:  # noqa: BLE001 - the stream ends with a note, not a 500
                yield f"\n[dlrm-platform] log stream interrupted: {err}\n"
                return

    def archive(self, job: JobRecord) -> None:
        """Copy the current attempt's logs from Ray into the job's directory (Ray forgets them)."""
        if not job.ray_submission_id or job.attempt < 1:
            return
        path = self.files.log_path(job.id, job.attempt)
        try:
            text = self.backend.logs(job.ray_submission_id)
        except BackendUnavailable:
            return
        if text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
