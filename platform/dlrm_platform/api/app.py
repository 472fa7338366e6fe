"""The FastAPI application: ``create_app()``; uvicorn serves ``dlrm_platform.api.app:create_app --factory``.

Start-up opens the database (creating the schema), connects lazily to Ray's
Jobs API and to MLflow, and starts the scheduler thread, whose first pass
reconciles the job records with Ray's job table. Nothing connects at import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dlrm_platform import __version__
from dlrm_platform.api.backend import JobBackend, RayJobsBackend
from dlrm_platform.api.db import Database
from dlrm_platform.api.errors import InvalidRequest, ServiceError
from dlrm_platform.api.prometheus import ServiceMetrics
from dlrm_platform.api.routes import health, jobs, metrics
from dlrm_platform.api.service import JobService
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.mlflow_links import Tracker
from dlrm_platform.redact import redact_text

log = logging.getLogger(__name__)


_JOB_VIEW_ROUTE = "/v1/jobs/{job_id}"


class _MetricsMiddleware:
    """Counts and times every request by route template (pure ASGI: streaming stays streaming).

    It also answers the hottest request, polling one job's status, straight from
    the service's caches when both the key and the rendered view are there: same
    bytes, same checks (key, owner) as the route, without the framework's
    per-request machinery. Anything else, or any miss, goes the normal way.
    """

    def __init__(self, app: Any, metrics: ServiceMetrics, fastapi_app: FastAPI):
        self.app = app
        self.metrics = metrics
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if scope["method"] == "GET" and await self._job_view_fast_path(scope, send):
            self.metrics.observe("GET", _JOB_VIEW_ROUTE, 200, started)
            return
        status = {"code": 500}

        async def _send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "<unmatched>"
            self.metrics.observe(scope.get("method", ""), path, status["code"], started)


    async def _job_view_fast_path(self, scope: Any, send: Any) -> bool:
        path: str = scope["path"]
        if not path.startswith("/v1/jobs/") or scope.get("query_string"):
            return False
        job_id = path[len("/v1/jobs/") :]
        if not job_id or "/" in job_id:
            return False
        service = getattr(self.fastapi_app.state, "service", None)
        if service is None:
            return False
        key = None
        for name, value in scope["headers"]:
            if name == b"x-api-key":
                key = value.decode("latin-1")
                break
            if name == b"authorization":
                scheme, _, cred = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and cred.strip():
                    key = cred.strip()
        if not key:
            return False
        principal = service.key_cache.get(key)
        hit = service.view_cache.get(job_id) if principal is not None else None
        if hit is None or (hit[0] != principal.user and not principal.is_admin):
            return False
        body = hit[1]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return True


def _default_tracker(settings: ApiSettings) -> Tracker | None:
    try:
        from dlrm_platform.api.mlflow_links import MlflowTracker

        return MlflowTracker(settings.mlflow_tracking_uri, settings.mlflow_url)
    except Exception as err:  # noqa: BLE001 - run without MLflow links rather than not at all
        log.warning("MLflow client unavailable (%s): jobs will create their own runs", err)
        return None


def create_app(
    settings: ApiSettings | None = None,
    *,
    backend: JobBackend | None = None,
    tracker: Tracker | None = None,
    start_scheduler: bool | None = None,
) -> FastAPI:
    settings = settings or ApiSettings()
    service_metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url)
        service = JobService(
            settings,
            db,
            backend or RayJobsBackend(settings.ray_address),
            tracker if tracker is not None else _default_tracker(settings),
            service_metrics,
        )
        service_metrics.add_job_counts(service.status_counts)
        app.state.service = service
        run_scheduler = settings.scheduler_enabled if start_scheduler is None else start_scheduler
        if run_scheduler:
            service.start()
        log.info("job service up: db=%s ray=%s mlflow=%s", _safe_url(settings.database_url),
                 redact_text(settings.ray_address), redact_text(settings.mlflow_tracking_uri))
        try:
            yield
        finally:
            service.stop()
            db.dispose()

    app = FastAPI(
        title="dlrm-platform job service",
        version=__version__,
        description=(
            "Training jobs on Ray Jobs with a priority queue, per-user limits, retries that resume "
            "from checkpoints, deadlines, persistent history and MLflow links. Every endpoint but "
            "/healthz needs an API key (`dlrm-platform api-key create --user NAME`)."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = service_metrics

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": exc.errors})

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc)})

    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(jobs.router)
    app.add_middleware(_MetricsMiddleware, metrics=service_metrics, fastapi_app=app)
    return app


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
