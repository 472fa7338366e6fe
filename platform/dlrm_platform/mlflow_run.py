"""MLflow tracking for a job: where the store is, one run per job, params, summary, artifacts.

Embedded default: a sqlite store ``<runs_dir>/mlflow.db`` with artifacts under
``<runs_dir>/mlartifacts``. The store is created here, once, in the driver,
before any worker connects (concurrent first use races on schema migration).
Workers receive the run id and URI and log per-step metrics themselves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dlrm_platform.config import JobConfig, TrackingConfig
from dlrm_platform.redact import redact_param

log = logging.getLogger(__name__)

# MLflow rejects param values over this many characters.
_MAX_PARAM_CHARS = 6000


def embedded_store_paths(cfg: TrackingConfig) -> tuple[Path, Path]:
    """(sqlite file, artifact root) of the embedded store."""
    root = cfg.runs_dir.resolve()
    return root / "mlflow.db", root / "mlartifacts"


def resolve_tracking_uri(cfg: TrackingConfig) -> str:
    """The config's URI, else ``$MLFLOW_TRACKING_URI``, else the embedded sqlite store."""
    if cfg.tracking_uri:
        return cfg.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    db, _ = embedded_store_paths(cfg)
    return f"sqlite:///{db}"


def ensure_experiment(cfg: TrackingConfig, tracking_uri: str) -> str:
    """Create the store (if sqlite) and the experiment once; return the experiment id."""
    from mlflow.tracking import MlflowClient

    artifact_location = None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        if db == embedded_store_paths(cfg)[0]:
            artifact_location = embedded_store_paths(cfg)[1].as_uri()
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(cfg.experiment, artifact_location=artifact_location)
    except Exception:  # created concurrently by another job
        exp = client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    """Dotted-key flattening of a config dump, for MLflow params."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from flatten(f"{prefix}.{k}" if prefix else str(k), v)
    else:
        yield prefix, str(value)[:_MAX_PARAM_CHARS]


def start_job_run(job: JobConfig, tracking_uri: str, *, config_source: str | None = None,
                  run_id: str | None = None) -> str:
    """Create the job's MLflow run, or reopen ``run_id`` (created by the API service, or a retry's);
    the resolved config is logged once per run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if run_id is not None:
        client.update_run(run_id, status="RUNNING")
        # A run the API service created holds no params yet: the job logs its config into it once.
        # A retry reopens a run that has them (and may differ in train.resume_from): left as it is.
        if not client.get_run(run_id).data.params:
            _log_config(client, run_id, job, config_source)
        return run_id
    experiment_id = ensure_experiment(job.tracking, tracking_uri)
    run = client.create_run(experiment_id, run_name=job.tracking.run_name or job.name)
    _log_config(client, run.info.run_id, job, config_source)
    return run.info.run_id


def _log_config(client: Any, run_id: str, job: JobConfig, config_source: str | None) -> None:
    """The job's tags, its resolved config as params, and the run's note."""
    from mlflow.entities import Param, RunTag

    tags = {"job.name": job.name, **{k: redact_param(k, v) for k, v in job.tracking.tags.items()}}
    if config_source:
        tags["job.config_source"] = config_source
    # Secrets never become params: passwords in URIs, values of secret-named fields (dlrm_platform.redact).
    params = [Param(k, redact_param(k, v)) for k, v in flatten("", job.model_dump(mode="json"))]
    for i in range(0, len(params), 100):  # MLflow's per-request limit
        client.log_batch(run_id, params=params[i : i + 100])
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()]
                     + [RunTag("mlflow.note.content", f"dlrm-platform job `{job.name}`")])


def server_answers(tracking_uri: str, timeout_s: float = 5.0) -> bool:
    """Whether the tracking server answers its ``/health`` endpoint (a local store always does).

    One short request, no retries: MLflow's client retries a refused connection
    for about two minutes per call, which would stall a job's end for each call.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return True
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(tracking_uri)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    url = f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/health"  # no credentials in it
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http(s) only, above
            return 200 <= response.status < 300
    except Exception:  # noqa: BLE001 - refused, reset, timed out, 5xx: not answering
        return False


def wait_for_server(tracking_uri: str, timeout_s: float, interval_s: float = 5.0) -> bool:
    """Poll :func:`server_answers` until it does or ``timeout_s`` passes; whether it answered."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        if server_answers(tracking_uri):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval_s, left))


def run_url(tracking_uri: str, run_id: str, experiment_id: str | None = None) -> str | None:
    """A browser URL for the run when the store is an HTTP server."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    exp = experiment_id or "0"
    return f"{tracking_uri.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"


def ui_command(cfg: TrackingConfig, port: int = 5000) -> list[str]:
    """The `mlflow ui` command line that serves this config's store."""
    uri = resolve_tracking_uri(cfg)
    cmd = ["mlflow", "ui", "--backend-store-uri", uri, "--port", str(port)]
    if uri.startswith("sqlite:///") and Path(uri.removeprefix("sqlite:///")) == embedded_store_paths(cfg)[0]:
        cmd += ["--artifacts-destination", str(embedded_store_paths(cfg)[1])]
    return cmd
