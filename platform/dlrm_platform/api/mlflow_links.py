"""MLflow: the tracking server helper and the service's client side.

Server: sqlite backend + local artifact store. The sqlite schema is created
once, by :func:`init_backend_store`, before the server (or any client) starts:
concurrent first-use migrations race (ARCHITECTURE.md, "MLflow on sqlite"). Every write goes through
the server.

Client: the service creates one MLflow run per job (tagged with the job id and
the user) and hands its id to every attempt (``tracking.run_id``), marks it
KILLED on cancel and reads progress metrics from it.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlrm_platform import run_metrics

log = logging.getLogger(__name__)

JOB_ID_TAG = "job_id"
USER_TAG = "user"


# --------------------------------------------------------------------------- server


def init_backend_store(db_path: Path, artifacts_dir: Path) -> str:
    """Create (or migrate) the sqlite tracking DB once; returns its URI."""
    db_path = db_path.resolve()
    artifacts_dir = artifacts_dir.resolve()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{db_path}"
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, artifacts_dir.as_uri())
    store.engine.dispose()
    return uri


# MLflow 3's server also starts a pool of "huey" job-runner processes (for server-side
# jobs the platform does not use); on a small machine they cost more CPU than the server.
SERVER_ENV = {"MLFLOW_TRACKING_URI": "", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: may resolve to anything
        return False


@dataclass(frozen=True)
class ServerAuth:
    """MLflow's basic-auth app for a tracking server: the admin account and the files behind it.

    The password comes from ``$DLRM_MLFLOW_PASSWORD`` or is generated once into
    ``password_file`` (mode 0600). It reaches the server and the clients through
    the environment only (``MLFLOW_AUTH_ADMIN_PASSWORD``, ``MLFLOW_TRACKING_PASSWORD``),
    never a command line, a log line or an MLflow param.
    """

    username: str
    password: str
    config_path: Path
    password_file: Path
    secret_key: str

    def server_env(self) -> dict[str, str]:
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(self.config_path),
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": self.secret_key,
        }

    def client_env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": self.password}


def prepare_server_auth(root: Path, username: str = "admin") -> ServerAuth:
    """The basic-auth config of a server whose store is under ``root`` (created on first use)."""
    auth_dir = (root / "auth").resolve()
    auth_dir.mkdir(parents=True, exist_ok=True)
    auth_dir.chmod(0o700)
    password_file = auth_dir / "admin_password"
    password = os.environ.get("DLRM_MLFLOW_PASSWORD")
    if not password:
        if not password_file.exists():
            fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24))
        password = password_file.read_text().strip()
    config = auth_dir / "basic_auth.ini"
    config.write_text(
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{auth_dir / 'basic_auth.db'}\n"
        f"admin_username = {username}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    secret_file = auth_dir / "flask_secret_key"
    if not secret_file.exists():
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return ServerAuth(username, password, config, password_file, secret_file.read_text().strip())


def server_auth_for(host: str, root: Path, auth: bool | None = None) -> ServerAuth | None:
    """Basic auth is on whenever the server listens beyond loopback; on loopback only if asked for.

    Raises UserError for an exposed server with ``auth=False``: it would accept anyone's writes.
    """
    from dlrm_platform.errors import UserError

    exposed = not is_loopback(host)
    if exposed and auth is False:
        raise UserError(f"an MLflow server listening on {host} (beyond this machine) must use basic auth")
    return prepare_server_auth(root) if (exposed or auth) else None


def server_command(
    backend_uri: str, artifacts_dir: Path, host: str = "127.0.0.1", port: int = 5000, workers: int = 1,
    *, auth: bool = False,
) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", backend_uri,
        "--artifacts-destination", str(artifacts_dir.resolve()),
        "--host", host,
        "--port", str(port),
        "--workers", str(workers),
        *(["--app-name", "basic-auth"] if auth else []),
    ]  # fmt: skip


def wait_http_ok(url: str, timeout_s: float = 60.0, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as err:
            if err.code < 500:  # answering, if only to say 401
                return
            last = err
        except Exception as err:  # noqa: BLE001 - any failure means not ready yet
            last = err
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s: {last}")


def start_server(
    root: Path, host: str = "127.0.0.1", port: int = 5000, workers: int = 1, log_file: Path | None = None,
    *, auth: bool | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``mlflow server`` on ``root/mlflow.db`` + ``root/artifacts``; returns when it answers.

    Loopback only by default; on any other ``host`` MLflow's basic auth is on
    (:func:`server_auth_for`); the process's ``auth`` attribute holds the
    :class:`ServerAuth` (or None) for the clients' environment.
    """
    server_auth = server_auth_for(host, root, auth)
    uri = init_backend_store(root / "mlflow.db", root / "artifacts")
    out = open(log_file or root / "mlflow-server.log", "ab")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        server_command(uri, root / "artifacts", host, port, workers, auth=server_auth is not None),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **SERVER_ENV, **(server_auth.server_env() if server_auth else {})},
    )
    proc.auth = server_auth  # type: ignore[attr-defined]
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    wait_http_ok(f"http://{probe}:{port}/health", proc=proc)
    return proc


# --------------------------------------------------------------------------- client


@dataclass
class Progress:
    steps_done: int | None = None
    samples_per_s: float | None = None
    data_wait_fraction: float | None = None


class Tracker(Protocol):
    def create_run(self, experiment: str, run_name: str, tags: Mapping[str, str]) -> tuple[str, str]: ...

    def set_terminated(self, run_id: str, status: str) -> None: ...

    def progress(self, run_id: str) -> Progress | None: ...

    def find_run(self, job_id: str) -> tuple[str, str] | None: ...

    def run_url(self, experiment_id: str, run_id: str) -> str: ...


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class MlflowTracker:
    """The service's MLflow client (through the tracking server)."""

    def __init__(self, tracking_uri: str, ui_url: str | None = None):
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.ui_url = (ui_url or tracking_uri).rstrip("/")
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except MlflowException:  # created concurrently
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def create_run(self, experiment: str, run_name: str, tags: Mapping[str, str]) -> tuple[str, str]:
        exp_id = self._experiment_id(experiment)
        run = self.client.create_run(exp_id, tags=dict(tags), run_name=run_name)
        return run.info.run_id, exp_id

    def set_terminated(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

    def run_status(self, run_id: str) -> str | None:
        return str(self.client.get_run(run_id).info.status)

    def progress(self, run_id: str) -> Progress | None:
        run = self.client.get_run(run_id)
        metrics = dict(run.data.metrics)
        if not metrics:
            return None
        p = Progress(
            samples_per_s=_finite(metrics.get(run_metrics.SAMPLES_PER_S)),
            data_wait_fraction=_finite(metrics.get(run_metrics.DATA_WAIT_FRACTION)),
        )
        step = _finite(metrics.get(run_metrics.STEPS_DONE))
        if step is None and run_metrics.LOSS in metrics:
            # A run whose worker did not log steps_done (older versions): the last step of its loss history.
            history = self.client.get_metric_history(run_id, run_metrics.LOSS)
            step = max((m.step for m in history), default=None)
        p.steps_done = int(step) if step is not None else None
        return p

    def find_run(self, job_id: str) -> tuple[str, str] | None:
        runs = self.client.search_runs(
            experiment_ids=[e.experiment_id for e in self.client.search_experiments()],
            filter_string=f"tags.{JOB_ID_TAG} = '{job_id}'",
            max_results=1,
        )
        return (runs[0].info.run_id, str(runs[0].info.experiment_id)) if runs else None

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"{self.ui_url}/#/experiments/{experiment_id}/runs/{run_id}"
