"""The job service's local stack for tests: a real MLflow server, a real local Ray head (token auth
on), the API as `dlrm-platform serve` in a subprocess, API keys, and tiny job configs.

Shared by tests/integration/test_api_e2e.py and tests/chaos/test_api_kill.py (importable as
``api_stack``: pytest puts tests/ on sys.path, as for ``fuzzing``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from dlrm_platform.api import devstack, mlflow_links
from testkit import wait_for

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED", "TIMED_OUT"}


def tiny_config(data_dir: Path, runs_dir: Path) -> dict[str, Any]:
    """configs/demo.yaml shrunk to seconds of training on 2 shared cores."""
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["name"] = "apitiny"
    cfg["data"]["path"] = str(data_dir)
    cfg["data"]["synthetic"].update(
        num_sessions=150, user_vocab_size=500, item_vocab_size=300, rows_per_shard=600, history_length=[3, 10]
    )
    cfg["ingest"].update(batch_size=64, hash_size=500, max_history_length=10, data_cpus=1.0)
    cfg["train"].update(
        epochs=1, cpus_per_worker=0.5, log_every_steps=2, checkpoint_every_steps=3,
        bottom_mlp=[16, 16], top_mlp=[16, 1], max_failures=0,
    )  # fmt: skip
    cfg["tracking"] = {"experiment": "api-e2e", "log_model": False, "runs_dir": str(runs_dir)}
    return cfg


@dataclass
class E2E:
    root: Path
    api_port: int
    api_env: dict[str, str]
    api: subprocess.Popen[bytes]
    head: devstack.RayHead
    mlflow_uri: str
    keys: dict[str, str]
    jobs: dict[str, str] = field(default_factory=dict)
    cli: subprocess.Popen[str] | None = None
    cli_log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def http(self, user: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[user]}"} if user else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def submit(self, user: str, **body: Any) -> str:
        """POST /v1/jobs with the test's `tiny` config (and ``body``); the new job's id."""
        with self.http(user) as c:
            r = c.post("/v1/jobs", json={"config_name": "tiny", **body})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: str, user: str = "root") -> dict[str, Any]:
        with self.http(user) as c:
            r = c.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_status(self, job_id: str, statuses: set[str], timeout: float) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            j = self.job(job_id)
            if j["status"] in statuses:
                return j
            if j["status"] in TERMINAL:
                raise AssertionError(f"{job_id} ended {j['status']}: {j['status_reason']}\n{self.logs(job_id)[-3000:]}")
            return None

        return wait_for(f"{job_id} in {statuses}", check, timeout, 1.0)

    def logs(self, job_id: str, attempt: int | None = None) -> str:
        with self.http("root") as c:
            return c.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt} if attempt else {}).text

    def start_api(self) -> None:
        self.api = devstack.start_api(port=self.api_port, env=self.api_env, cwd=ROOT, log_file=self.root / "api.log")

    def restart_api(self) -> None:
        """Graceful: SIGTERM, uvicorn's shutdown, then a new process on the same port and database."""
        devstack.stop_process(self.api)
        self.start_api()

    def kill_api(self) -> None:
        """SIGKILL the API process, by its pid, from outside: no shutdown code runs."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.api.pid, signal.SIGKILL)
        self.api.wait(30)

    def ray_cli(self, *args: str, token: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **(self.head.env if token else {})}
        if not token:
            env.pop("RAY_AUTH_TOKEN_PATH", None)
            env["RAY_AUTH_MODE"] = "disabled"
        return subprocess.run(
            [str(devstack.VENV_BIN / "ray"), "job", *args, "--address", self.head.dashboard_url],
            env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        )  # fmt: skip

    def ray_jobs(self) -> list[Any]:
        """Ray's job table, through the Jobs SDK with the cluster token (a subprocess: no Ray state here)."""
        code = (
            "import json; from ray.job_submission import JobSubmissionClient as C; "
            f"print(json.dumps([{{'submission_id': j.submission_id, 'status': str(getattr(j.status, 'value', j.status)), "
            f"'metadata': j.metadata or {{}}}} for j in C({self.head.dashboard_url!r}).list_jobs()]))"
        )
        out = subprocess.run([PY, "-c", code], env={**os.environ, **self.head.env}, capture_output=True, text=True,
                             timeout=120, check=True, cwd=ROOT)  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def api_stack(
    root: Path, *, api_env: dict[str, str] | None = None, config: dict[str, Any] | None = None
) -> Iterator[E2E]:
    """The whole stack under ``root`` (a fresh directory), torn down on exit, whatever happened.

    Keys: ``alice`` (made by the CLI), ``bob``, ``root`` (admin). Configs: ``tiny`` (``config``,
    default :func:`tiny_config`, its data generated). ``api_env`` adds to or overrides the
    service's ``DLRM_API_*`` settings (defaults: 3 running jobs, 2 per user, no retries).
    """
    configs = root / "configs"
    configs.mkdir()
    cfg = config or tiny_config(root / "data", root / "runs")
    (configs / "tiny.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    subprocess.run(
        [PY, "-m", "dlrm_platform.cli", "gen-data", str(configs / "tiny.yaml"), "--quiet"], check=True, cwd=ROOT
    )

    procs: list[Callable[[], None]] = []
    try:
        ml_port = devstack.free_port()
        ml = mlflow_links.start_server(root / "mlflow", port=ml_port)
        procs.append(lambda: devstack.stop_process(ml, timeout=10))
        mlflow_uri = f"http://127.0.0.1:{ml_port}"

        ray_env = devstack.ensure_ray_token(root / "ray_auth_token")
        head = devstack.start_ray_head(
            num_cpus=8,
            env=ray_env,
            temp_dir=Path(tempfile.mkdtemp(prefix="dlrmapi-", dir="/tmp")),
            object_store_memory=400 * 1024 * 1024,
            log_file=root / "ray-head.log",
        )
        procs.append(head.stop)

        db_url = f"sqlite:///{root / 'jobs.db'}"
        keys = {}
        out = subprocess.run(
            [PY, "-m", "dlrm_platform.cli", "api-key", "create", "--user", "alice", "--database-url", db_url],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        keys["alice"] = out.stdout.strip()
        from dlrm_platform.api.auth import create_api_key
        from dlrm_platform.api.db import Database

        db = Database(db_url)
        with db.transaction() as s:
            _, keys["bob"] = create_api_key(s, "bob")
            _, keys["root"] = create_api_key(s, "root", admin=True)
        db.dispose()

        api_port = devstack.free_port()
        env = {
            **ray_env,
            "DLRM_API_DATABASE_URL": db_url,
            "DLRM_API_RAY_ADDRESS": head.dashboard_url,
            "DLRM_API_MLFLOW_TRACKING_URI": mlflow_uri,
            "DLRM_API_CONFIGS_DIR": str(configs),
            "DLRM_API_STORAGE_DIR": str(root / "storage"),
            "DLRM_API_JOB_WORKDIR": str(ROOT),
            # Config paths must lie under these (dlrm_platform.paths); the test's data and runs are in tmp.
            "DLRM_API_DATA_ROOTS": json.dumps([str(root)]),  # data/ and its dedup copy data.dedup/
            "DLRM_API_OUTPUT_ROOTS": json.dumps([str(root / "runs")]),
            "DLRM_API_MAX_RUNNING_JOBS": "3",
            "DLRM_API_MAX_RUNNING_PER_USER": "2",
            "DLRM_API_SCHEDULER_INTERVAL_S": "0.5",
            "DLRM_API_PROGRESS_INTERVAL_S": "2",
            "DLRM_API_DEFAULT_MAX_RETRIES": "0",
            **(api_env or {}),
        }
        api = devstack.start_api(port=api_port, env=env, cwd=ROOT, log_file=root / "api.log")
        stack = E2E(root, api_port, env, api, head, mlflow_uri, keys)
        procs.append(lambda: devstack.stop_process(stack.api))
        procs.append(lambda: devstack.stop_process(stack.cli, timeout=10))
        yield stack
    finally:
        for stop in reversed(procs):
            try:
                stop()
            except Exception as err:  # noqa: BLE001 - tear everything down regardless
                print(f"teardown: {err}", file=sys.stderr)
