"""Fakes for the job service's unit tests: Ray Jobs and MLflow in memory, the scheduler driven by hand."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dlrm_platform.api.app import create_app
from dlrm_platform.api.auth import create_api_key
from dlrm_platform.api.backend import BackendJob, BackendUnavailable
from dlrm_platform.api.service import JobService
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.api.mlflow_links import Progress

TINY_CONFIG = """\
name: tiny
data:
  path: data/tiny
  columns:
    label: label
    user: {dense: [u0], categorical: [uc0]}
    item: {dense: [i0], categorical: [ic0]}
train:
  epochs: 1
"""


class FakeBackend:
    """Ray's Jobs API in memory. Tests move jobs with ``set_status``."""

    def __init__(self) -> None:
        self.jobs: dict[str, BackendJob] = {}
        self.submissions: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        self.logs_by_sid: dict[str, str] = {}
        self.down = False
        self.fail_submit = False

    def _check(self) -> None:
        if self.down:
            raise BackendUnavailable("fake Ray is down")

    def submit(self, submission_id: str, entrypoint: str, *, runtime_env: dict[str, Any], metadata: dict[str, str],
               entrypoint_num_cpus: float) -> None:
        self._check()
        if self.fail_submit:
            raise BackendUnavailable("connection reset while submitting")
        self.submissions.append(
            {"sid": submission_id, "entrypoint": entrypoint, "runtime_env": runtime_env, "metadata": metadata}
        )
        if submission_id not in self.jobs:
            self.jobs[submission_id] = BackendJob(submission_id, "PENDING", metadata=dict(metadata))
            self.logs_by_sid[submission_id] = f"log of {submission_id}\n"

    def info(self, submission_id: str) -> BackendJob | None:
        self._check()
        return self.jobs.get(submission_id)

    def list_jobs(self) -> list[BackendJob]:
        self._check()
        return list(self.jobs.values())

    def stop(self, submission_id: str) -> bool:
        self._check()
        self.stopped.append(submission_id)
        job = self.jobs.get(submission_id)
        if job is None:
            return False
        if job.status in ("PENDING", "RUNNING"):
            job.status = "STOPPED"
        return True

    def logs(self, submission_id: str) -> str:
        self._check()
        return self.logs_by_sid.get(submission_id, "")

    async def tail(self, submission_id: str) -> AsyncIterator[str]:
        yield self.logs_by_sid.get(submission_id, "")

    def set_status(self, submission_id: str, status: str, message: str = "") -> None:
        self.jobs[submission_id].status = status
        self.jobs[submission_id].message = message


class FakeTracker:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.runs: dict[str, dict[str, Any]] = {}
        self.terminated: list[tuple[str, str]] = []
        self.fail_create = False
        self.progress_of: dict[str, Progress] = {}  # what a test says each run's metrics show

    def create_run(self, experiment: str, run_name: str, tags: dict[str, str]) -> tuple[str, str]:
        if self.fail_create:
            raise ConnectionError("MLflow down")
        run_id = f"run{next(self._ids)}"
        self.runs[run_id] = {"experiment": experiment, "name": run_name, "tags": dict(tags), "status": "RUNNING"}
        return run_id, "1"

    def set_terminated(self, run_id: str, status: str) -> None:
        self.terminated.append((run_id, status))
        self.runs[run_id]["status"] = status

    def run_status(self, run_id: str) -> str | None:
        return self.runs[run_id]["status"]

    def progress(self, run_id: str) -> Progress | None:
        return self.progress_of.get(run_id)

    def find_run(self, job_id: str) -> tuple[str, str] | None:
        for run_id, run in self.runs.items():
            if run["tags"].get("job_id") == job_id:
                return run_id, "1"
        return None

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"http://mlflow/#/experiments/{experiment_id}/runs/{run_id}"


class Stack:
    """An app on the fakes, its TestClient, its service and keys for alice, bob and an admin."""

    def __init__(self, tmp: Path, *, backend: FakeBackend | None = None, tracker: FakeTracker | None = None,
                 db_url: str | None = None, **settings: Any) -> None:
        configs = tmp / "configs"
        configs.mkdir(exist_ok=True)
        (configs / "tiny.yaml").write_text(TINY_CONFIG)
        (configs / "demo.yaml").write_text(TINY_CONFIG)  # the name the OpenAPI example uses
        (configs / "broken.yaml").write_text(TINY_CONFIG.replace("epochs: 1", "epochs: many"))
        self.settings = ApiSettings(
            database_url=db_url or f"sqlite:///{tmp / 'jobs.db'}",
            configs_dir=configs,
            storage_dir=tmp / "storage",
            job_workdir=tmp,
            job_python="/opt/venv/bin/python",
            mlflow_tracking_uri="http://mlflow:5000",
            ray_address="http://ray:8265",
            **{"auth_cache_ttl_s": 0.0, **settings},
        )
        self.backend = backend or FakeBackend()
        self.tracker = tracker or FakeTracker()
        self.app = create_app(self.settings, backend=self.backend, tracker=self.tracker, start_scheduler=False)
        self.client = TestClient(self.app)
        self.client.__enter__()
        self.service: JobService = self.app.state.service
        self.keys: dict[str, str] = {}
        for user, admin in (("alice", False), ("bob", False), ("root", True)):
            if user not in self.keys:
                with self.service.db.transaction() as s:
                    _, self.keys[user] = create_api_key(s, user, admin=admin)

    def h(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[user]}"}

    def submit(self, user: str = "alice", **body: Any) -> dict[str, Any]:
        body.setdefault("config_name", "tiny")
        r = self.client.post("/v1/jobs", json=body, headers=self.h(user))
        assert r.status_code in (200, 201), r.text
        return r.json()

    def job(self, job_id: str, user: str = "root") -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}", headers=self.h(user))
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        self.client.__exit__(None, None, None)
