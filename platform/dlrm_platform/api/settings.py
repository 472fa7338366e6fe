"""Service settings, read from the environment (prefix ``DLRM_API_``) by pydantic-settings.

Every field can be set as ``DLRM_API_<FIELD>``, e.g. ``DLRM_API_DATABASE_URL``.
Paths are resolved against the working directory of the service.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DLRM_API_", extra="ignore")

    database_url: str = Field(
        "sqlite:///runs/api/jobs.db",
        description="SQLAlchemy URL of the job database (sqlite by default; postgresql+psycopg://... in production)",
    )
    ray_address: str = Field(
        "http://127.0.0.1:8265", description="Ray dashboard address the Jobs SDK submits to"
    )
    ray_dashboard_url: str | None = Field(
        None, description="public Ray dashboard URL for links (default: ray_address)"
    )
    mlflow_tracking_uri: str = Field(
        "http://127.0.0.1:5000", description="MLflow tracking server passed to every job"
    )
    mlflow_ui_url: str | None = Field(None, description="public MLflow URL for links (default: the tracking URI)")
    configs_dir: Path = Field(Path("configs"), description="where POST /v1/jobs finds configs by name")
    storage_dir: Path = Field(
        Path("runs/api/storage"),
        description="per-job storage: checkpoints (train.storage_path) and archived logs; "
        "must be visible to the Ray workers at the same path",
    )
    job_workdir: Path = Field(
        Path("."), description="relative paths in job configs (data.path, ...) resolve against this"
    )
    data_roots: list[Path] = Field(
        default_factory=lambda: [Path("data")],
        description="inputs of submitted configs (data.path and its dedup copy, tuner.policy_path) must lie "
        "under one of these (relative: against job_workdir; no '..', no symlink out); JSON list in the env var",
    )
    output_roots: list[Path] = Field(
        default_factory=lambda: [Path("runs")],
        description="outputs of submitted configs (tracking.runs_dir, ingest.cache.spill_dir) must lie under "
        "one of these (storage_dir is always allowed); JSON list in the env var",
    )
    job_python: str = Field(
        sys.executable, description="the interpreter of the environment that runs `dlrm-platform run`"
    )
    job_entrypoint_num_cpus: float = Field(
        0.0, ge=0, description="CPUs Ray reserves for each job's driver process"
    )
    max_running_jobs: int = Field(2, ge=1, description="jobs running on the cluster at once, all users")
    max_running_per_user: int = Field(1, ge=1, description="jobs of one user running at once")
    default_max_retries: int = Field(1, ge=0, le=20)
    max_retries_limit: int = Field(10, ge=0, description="largest max_retries a request may ask for")
    scheduler_interval_s: float = Field(1.0, gt=0, description="seconds between scheduler passes")
    progress_interval_s: float = Field(5.0, gt=0, description="seconds between MLflow progress reads per job")
    scheduler_enabled: bool = Field(True, description="run the queue/scheduler loop in this process")
    view_cache_ttl_s: float = Field(
        2.0, ge=0, description="seconds a rendered job view may be served from memory (changes drop it at once)"
    )
    auth_cache_ttl_s: float = Field(
        5.0, ge=0, description="seconds a verified API key is remembered; a revoked key works at most this long"
    )

    @property
    def dashboard_url(self) -> str:
        return (self.ray_dashboard_url or self.ray_address).rstrip("/")

    @property
    def mlflow_url(self) -> str:
        return (self.mlflow_ui_url or self.mlflow_tracking_uri).rstrip("/")


def get_settings() -> ApiSettings:
    return ApiSettings()
