"""Bodies the service returns."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from dlrm_platform.api.db import JobStatus


class JobProgress(BaseModel):
    """Training progress, read from the job's MLflow run."""

    steps_done: int | None = None
    samples_per_s: float | None = None
    data_wait_fraction: float | None = None
    updated_at: datetime | None = None


class JobEvent(BaseModel):
    at: datetime
    attempt: int
    kind: str
    status: JobStatus | None = None
    message: str


class JobSummary(BaseModel):
    """A job as listed."""

    id: str
    owner: str
    name: str
    status: JobStatus
    status_reason: str | None = None
    priority: int
    config_name: str | None = None
    attempt: int = Field(description="attempts started so far (1 + retries)")
    max_retries: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    ray_submission_id: str | None = None
    mlflow_run_id: str | None = None


class JobDetail(JobSummary):
    """One job in full: links, progress, config and history."""

    updated_at: datetime
    overrides: dict[str, Any]
    config: dict[str, Any] = Field(description="the resolved job config")
    ray_job_id: str | None = None
    ray_dashboard_url: str | None = None
    mlflow_experiment_id: str | None = None
    mlflow_run_url: str | None = None
    resume_from: str | None = Field(default=None, description="checkpoint the current attempt resumed from")
    progress: JobProgress
    events: list[JobEvent]


class JobList(BaseModel):
    items: list[JobSummary]
    total: int
    limit: int
    offset: int


class SubmitResponse(BaseModel):
    id: str
    status: JobStatus
    created: bool = Field(description="false when an idempotency key matched an existing job")


class Health(BaseModel):
    status: str
    database: bool
    ray: bool | None = Field(default=None, description="last known reachability of the Ray Jobs API")
    scheduler: bool


class ErrorBody(BaseModel):
    detail: str
