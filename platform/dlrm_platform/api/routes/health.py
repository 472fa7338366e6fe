"""/healthz: liveness and what the service can reach. The one endpoint without a key."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from dlrm_platform.api.deps import ServiceDep
from dlrm_platform.api.schemas.responses import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness (no API key needed)")
def healthz(service: ServiceDep) -> Health:
    try:
        with service.db.session() as s:
            s.execute(text("SELECT 1"))
        db_ok = True
    except Exception:  # noqa: BLE001 - report, don't raise
        db_ok = False
    sched = service.scheduler_alive or not service.settings.scheduler_enabled
    return Health(status="ok" if db_ok and sched else "degraded", database=db_ok, ray=service.ray_ok, scheduler=sched)
