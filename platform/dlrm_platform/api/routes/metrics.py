"""/metrics: Prometheus exposition (needs an API key like every endpoint but /healthz)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dlrm_platform.api.deps import MetricsDep, PrincipalDep
from dlrm_platform.api.routes.jobs import AUTH_ERRORS

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format"},
        **AUTH_ERRORS,
    },
    summary="Prometheus metrics",
)
def metrics(_: PrincipalDep, m: MetricsDep) -> Response:
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
