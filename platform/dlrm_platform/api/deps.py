"""FastAPI dependencies, as ``Annotated`` aliases the routes use."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from dlrm_platform.api.auth import Principal, verify_key
from dlrm_platform.api.prometheus import ServiceMetrics
from dlrm_platform.api.service import JobService
from dlrm_platform.api.settings import ApiSettings

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="`X-API-Key: <API key>`")


# Trivial dependencies are `async def`: FastAPI runs sync ones in the thread pool,
# one hop each, which costs more than they do.
async def get_service(request: Request) -> JobService:
    return request.app.state.service


async def get_settings(request: Request) -> ApiSettings:
    return request.app.state.settings


async def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


ServiceDep = Annotated[JobService, Depends(get_service)]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]


async def get_principal(
    service: ServiceDep,
    metrics: MetricsDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    header_key: Annotated[str | None, Depends(_api_key_header)],
) -> Principal:
    key = header_key or (bearer.credentials if bearer is not None else None)
    if not key:
        metrics.auth_failures.inc()
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = service.key_cache.get(key)
    if principal is None:
        principal = await run_in_threadpool(_verify, service, key)
    if principal is None:
        metrics.auth_failures.inc()
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return principal


def _verify(service: JobService, key: str) -> Principal | None:
    with service.db.session() as session:
        principal = verify_key(session, key)
    if principal is not None:
        service.key_cache.put(key, principal)
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
