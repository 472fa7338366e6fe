"""A local stack: MLflow tracking server + Ray head + the job service.

``make serve`` runs :func:`run_stack`; the integration tests start the same
pieces one by one (module-scoped fixtures). Every process is started in its own
session and stopped by its process group, never by name: other Ray clusters on
the same machine are left alone (``ray stop`` would kill them too).

Ray's token auth stays on: the head, the service and the jobs run with
``RAY_AUTH_MODE=token`` and share one token file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrm_platform.api.mlflow_links import start_server, wait_http_ok
from dlrm_platform.ray_cluster import idle_worker_env
from dlrm_platform.redact import redact_text

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, exclude: Collection[int] = ()) -> list[int]:
    """``n`` distinct free loopback ports. The sockets stay bound until all are picked: one bound
    and closed at a time, the kernel may hand the same port out twice (it did, in CI, and
    ``ray start`` refused a runtime-env agent port equal to the dashboard agent's)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in exclude:
                ports.append(port)
        return ports


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 30.0) -> None:
    """SIGTERM the process group the process leads, then SIGKILL what is left."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def ensure_ray_token(path: Path | None = None) -> dict[str, str]:
    """Environment for token auth; creates the token file (default ``~/.ray/auth_token``) if missing."""
    token_path = path or Path.home() / ".ray" / "auth_token"
    if not token_path.exists() or not token_path.read_text().strip():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
    env = {"RAY_AUTH_MODE": "token"}
    if path is not None:
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    return env


#: How long a head gets to exit on SIGTERM before its process group is killed (see ``RayHead.stop``).
HEAD_STOP_GRACE_S = 5.0


@dataclass
class RayHead:
    proc: subprocess.Popen[bytes]
    dashboard_url: str
    gcs_address: str
    temp_dir: Path | None
    env: dict[str, str]

    def stop(self, grace_s: float = HEAD_STOP_GRACE_S) -> None:
        """SIGTERM the head's process group, SIGKILL what is left after ``grace_s``. Measured: the
        workers exit within 2 s and the raylet within 10 s, but ``ray start --block`` and the GCS linger
        ~30 s more, and a head this module started holds nothing worth that wait (GCS state is in memory)
        - Ray's own ``ray stop`` also escalates to SIGKILL after a grace period."""
        stop_process(self.proc, timeout=grace_s)


def start_ray_head(
    *,
    num_cpus: int,
    env: Mapping[str, str],
    dashboard_port: int | None = None,
    gcs_port: int | None = None,
    temp_dir: Path | None = None,
    object_store_memory: int | None = None,
    isolated_ports: bool = True,
    log_file: Path | None = None,
    timeout_s: float = 120.0,
) -> RayHead:
    """``ray start --head --block`` in its own process group; returns when the Jobs API answers."""
    picked = iter(free_ports(7, exclude={p for p in (dashboard_port, gcs_port) if p}))
    dashboard_port = dashboard_port or next(picked)
    gcs_port = gcs_port or next(picked)
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        "--port", str(gcs_port),
        "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        "--include-dashboard", "true",
        "--num-cpus", str(num_cpus),
    ]  # fmt: skip
    if isolated_ports:  # several clusters on one machine must not share the fixed default ports
        cmd += [
            "--ray-client-server-port", str(next(picked)),
            "--dashboard-agent-listen-port", str(next(picked)),
            "--dashboard-agent-grpc-port", str(next(picked)),
            "--runtime-env-agent-port", str(next(picked)),
            "--metrics-export-port", str(next(picked)),
        ]  # fmt: skip
    if temp_dir is not None:
        temp_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["--temp-dir", str(temp_dir)]
    if object_store_memory:
        cmd += ["--object-store-memory", str(object_store_memory)]
    full_env = {**idle_worker_env(), **os.environ, **env, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    full_env.pop("RAY_ADDRESS", None)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    head = RayHead(proc, f"http://127.0.0.1:{dashboard_port}", f"127.0.0.1:{gcs_port}", temp_dir, dict(env))
    try:
        wait_ray_jobs_api(head.dashboard_url, env, timeout_s, proc)
    except BaseException as e:
        head.stop()
        if log_file is not None and isinstance(e, RuntimeError | TimeoutError):
            raise type(e)(f"{e}; the end of {log_file}:\n{_tail(log_file)}") from e
        raise
    return head


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


def wait_ray_jobs_api(
    url: str, env: Mapping[str, str], timeout_s: float = 120.0, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Poll the Jobs API through the SDK (with the token) in a subprocess until it answers."""
    code = (
        "import sys; from ray.job_submission import JobSubmissionClient as C; "
        f"C({url!r}).list_jobs(); print('ok')"
    )
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"ray start exited with code {proc.returncode}")
        r = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0 and "ok" in r.stdout:
            return
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] and (r.stderr or r.stdout).strip().splitlines()[-1]
        time.sleep(1.0)
    raise TimeoutError(f"Ray Jobs API at {url} not ready after {timeout_s:.0f} s: {last}")


def start_api(
    *,
    port: int,
    env: Mapping[str, str],
    cwd: Path,
    log_file: Path | None = None,
    timeout_s: float = 60.0,
) -> subprocess.Popen[bytes]:
    """``dlrm-platform serve`` in a subprocess; returns when /healthz answers."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrm_platform.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", timeout_s, proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def run_stack(
    *,
    root: Path,
    host: str = "127.0.0.1",
    api_port: int = 8000,
    mlflow_port: int = 5000,
    mlflow_host: str = "127.0.0.1",
    dashboard_port: int = 8265,
    gcs_port: int = 6379,
    num_cpus: int | None = None,
) -> int:
    """``make serve``: MLflow server, Ray head and the API in the foreground until Ctrl-C."""
    import uvicorn

    from dlrm_platform.api.app import create_app
    from dlrm_platform.api.settings import ApiSettings

    root.mkdir(parents=True, exist_ok=True)
    ray_env = ensure_ray_token()
    os.environ.update(ray_env)
    print(f"[serve] MLflow tracking server on http://{mlflow_host}:{mlflow_port} (store: {root / 'mlflow'})",
          flush=True)
    # Loopback only unless --mlflow-host says otherwise; beyond loopback MLflow's basic auth is on.
    mlflow_proc = start_server(root / "mlflow", host=mlflow_host, port=mlflow_port)
    mlflow_url = f"http://{'127.0.0.1' if mlflow_host in ('0.0.0.0', '::') else mlflow_host}:{mlflow_port}"
    if mlflow_proc.auth is not None:  # the service and the jobs (via the head's env) log in with it
        os.environ.update(mlflow_proc.auth.client_env())
        print(f"[serve] MLflow basic auth: user {mlflow_proc.auth.username}, password in "
              f"{mlflow_proc.auth.password_file} (or $DLRM_MLFLOW_PASSWORD)", flush=True)
    head: RayHead | None = None
    try:
        print(f"[serve] Ray head: dashboard http://127.0.0.1:{dashboard_port}, GCS 127.0.0.1:{gcs_port}", flush=True)
        head = start_ray_head(
            num_cpus=num_cpus or os.cpu_count() or 2,
            env={**ray_env, "MLFLOW_TRACKING_URI": mlflow_url},
            dashboard_port=dashboard_port,
            gcs_port=gcs_port,
            log_file=root / "ray-head.log",
        )
        os.environ.setdefault("DLRM_API_RAY_ADDRESS", head.dashboard_url)
        os.environ.setdefault("DLRM_API_MLFLOW_TRACKING_URI", mlflow_url)
        settings = ApiSettings()
        print(f"[serve] job service on http://{host}:{api_port} (db: {redact_text(settings.database_url)})",
              flush=True)
        print("[serve] API key: dlrm-platform api-key create --user $USER", flush=True)
        # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown; with a Python handler
        # in place that becomes SystemExit, so the `finally` below still stops the head and MLflow.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        uvicorn.run(create_app(settings), host=host, port=api_port, log_level="info")
    finally:
        print("[serve] stopping the Ray head and MLflow", flush=True)
        if head is not None:
            head.stop()
        stop_process(mlflow_proc, timeout=10)
    return 0
