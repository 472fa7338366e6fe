"""/v1/jobs: submit, list, inspect, follow logs, cancel."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Query, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from dlrm_platform.api.auth import Principal

from dlrm_platform.api.db import JobEventRecord, JobRecord, JobStatus
from dlrm_platform.api.deps import PrincipalDep, ServiceDep, SettingsDep
from dlrm_platform.api.errors import NotFound
from dlrm_platform.api.schemas.requests import JobSubmitRequest
from dlrm_platform.api.schemas.responses import (
    ErrorBody,
    JobDetail,
    JobEvent,
    JobList,
    JobProgress,
    JobSummary,
    SubmitResponse,
)
from dlrm_platform.api.service import JobService
from dlrm_platform.api.settings import ApiSettings

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
# Writes run one at a time in their own thread: SQLite takes one writer at a time anyway, and a burst
# of submissions in the shared pool would be N threads contending for the GIL with the event loop
# that answers the (cached) status polls.
_WRITERS = anyio.CapacityLimiter(1)

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody, "description": "no valid API key"}}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "no such job (or not yours)"}}
JobId = Annotated[str, Path(description="the job id returned by POST /v1/jobs", max_length=64)]


def summary(job: JobRecord) -> JobSummary:
    return JobSummary(
        id=job.id,
        owner=job.owner,
        name=job.name,
        status=JobStatus(job.status),
        status_reason=job.status_reason,
        priority=job.priority,
        config_name=job.config_name,
        attempt=job.attempt,
        max_retries=job.max_retries,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        deadline_at=job.deadline_at,
        ray_submission_id=job.ray_submission_id,
        mlflow_run_id=job.mlflow_run_id,
    )


def detail(
    job: JobRecord, service: JobService, settings: ApiSettings, events: list[JobEventRecord] | None = None
) -> JobDetail:
    base = summary(job).model_dump()
    run_url = None
    if job.mlflow_run_id and job.mlflow_experiment_id:
        run_url = f"{settings.mlflow_url}/#/experiments/{job.mlflow_experiment_id}/runs/{job.mlflow_run_id}"
    return JobDetail(
        **base,
        updated_at=job.updated_at,
        overrides=job.overrides or {},
        config=job.config,
        ray_job_id=job.ray_job_id,
        ray_dashboard_url=(
            f"{settings.dashboard_url}/#/jobs/{job.ray_submission_id}" if job.ray_submission_id else None
        ),
        mlflow_experiment_id=job.mlflow_experiment_id,
        mlflow_run_url=run_url,
        resume_from=job.resume_from,
        progress=JobProgress(
            steps_done=job.steps_done,
            samples_per_s=job.samples_per_s,
            data_wait_fraction=job.data_wait_fraction,
            updated_at=job.progress_at,
        ),
        events=[
            JobEvent(
                at=e.at,
                attempt=e.attempt,
                kind=e.kind,
                status=JobStatus(e.status) if e.status else None,
                message=e.message,
            )
            for e in (events if events is not None else service.events(job.id))
        ],
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SubmitResponse,
    responses={
        200: {"model": SubmitResponse, "description": "the job an idempotency key already names"},
        400: {"model": ErrorBody, "description": "the body is not JSON"},
        **AUTH_ERRORS,
        409: {"model": ErrorBody, "description": "idempotency key reused with a different body"},
    },
    summary="Submit a training job",
)
async def submit_job(body: JobSubmitRequest, principal: PrincipalDep, service: ServiceDep,
                     response: Response) -> SubmitResponse:
    job, created = await anyio.to_thread.run_sync(service.submit, principal, body, limiter=_WRITERS)
    if not created:
        response.status_code = status.HTTP_200_OK
    return SubmitResponse(id=job.id, status=JobStatus(job.status), created=created)


@router.get(
    "",
    response_model=JobList,
    responses={**AUTH_ERRORS, 403: {"model": ErrorBody, "description": "listing another user's jobs"}},
    summary="List jobs (yours; all for admins)",
)
def list_jobs(
    principal: PrincipalDep,
    service: ServiceDep,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    owner: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> JobList:
    rows, total = service.list(principal, status=status_, owner=owner, limit=limit, offset=offset)
    return JobList(items=[summary(j) for j in rows], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobDetail, responses={**AUTH_ERRORS, **NOT_FOUND}, summary="One job")
async def get_job(job_id: JobId, principal: PrincipalDep, service: ServiceDep, settings: SettingsDep) -> Response:
    # Polled hard: served from the rendered-view cache when nothing changed.
    hit = service.view_cache.get(job_id)
    if hit is None:
        hit = await _render_once(job_id, principal, service, settings)
    owner, body = hit
    if owner != principal.user and not principal.is_admin:
        raise NotFound(f"no job {job_id}")
    return Response(body, media_type="application/json")


async def _render_once(job_id: str, principal: Principal, service: JobService,
                       settings: ApiSettings) -> tuple[str, bytes]:
    """Render a job's view; polls arriving while it renders wait for that render instead of
    each querying and rendering again (a burst of polls on a fresh job would queue N renders)."""
    key = (job_id, principal.user)
    pending = service.view_renders.get(key)
    if pending is not None:
        return await asyncio.shield(pending)
    pending = asyncio.get_running_loop().create_future()
    service.view_renders[key] = pending
    try:
        hit = await run_in_threadpool(_render_job, job_id, principal, service, settings)
    except BaseException as exc:
        pending.set_exception(exc)
        pending.exception()  # retrieved: waiters (if any) re-raise it, nobody else must
        raise
    else:
        pending.set_result(hit)
        return hit
    finally:
        service.view_renders.pop(key, None)


def _render_job(job_id: str, principal: Principal, service: JobService, settings: ApiSettings) -> tuple[str, bytes]:
    generation = service.view_cache.generation(job_id)
    job, events = service.get_with_events(principal, job_id)
    body = detail(job, service, settings, events).model_dump_json().encode()
    service.view_cache.put(job_id, job.owner, body, generation)
    return job.owner, body


@router.get(
    "/{job_id}/logs",
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "driver output"},
        **AUTH_ERRORS,
        **NOT_FOUND,
    },
    summary="Logs of an attempt; with follow=true, streamed while it runs",
)
async def job_logs(
    job_id: JobId,
    principal: PrincipalDep,
    service: ServiceDep,
    follow: bool = False,
    attempt: Annotated[int | None, Query(ge=1, le=1000, description="default: the current attempt")] = None,
) -> Response:
    import asyncio

    job = await asyncio.to_thread(service.get, principal, job_id)
    if not follow:
        text = await asyncio.to_thread(service.read_logs, job, attempt)
        return PlainTextResponse(text)
    return StreamingResponse(
        service.follow_logs(job.id, attempt),
        media_type="text/plain; charset=utf-8",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobDetail,
    responses={**AUTH_ERRORS, **NOT_FOUND, 409: {"model": ErrorBody, "description": "the job already finished"}},
    summary="Cancel: stop the Ray job and mark the MLflow run KILLED",
)
async def cancel_job(job_id: JobId, principal: PrincipalDep, service: ServiceDep, settings: SettingsDep) -> JobDetail:
    def cancel() -> JobDetail:
        return detail(service.cancel(principal, job_id), service, settings)

    return await anyio.to_thread.run_sync(cancel, limiter=_WRITERS)
