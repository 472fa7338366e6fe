"""The job service end to end: real HTTP to `dlrm-platform serve` in a subprocess, a real local
Ray head (token auth on), a real MLflow server, and the real `dlrm-platform run` on tiny data.

One stack per module (tests/api_stack.py). The jobs are submitted together at the start (a success, a retry, one to
cancel, and one through `ray job submit`) so that they overlap; each test then follows its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api_stack import E2E, api_stack, wait_for
from dlrm_platform.api import devstack, policy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    root = tmp_path_factory.mktemp("api-e2e")
    with api_stack(root) as stack:
        # Submit everything up front so that the jobs overlap.
        stack.jobs["success"] = stack.submit("alice", idempotency_key="success-1")
        stack.jobs["cancel"] = stack.submit("alice", overrides={"train.epochs": 100})
        # Many small steps: attempt 1 is still far from done when the test kills it after its first
        # checkpoint, on a quiet machine as on a loaded one.
        stack.jobs["retry"] = stack.submit("bob", max_retries=1, overrides={
            "train.epochs": 2, "ingest.batch_size": 16, "train.checkpoint_every_steps": 2, "train.log_every_steps": 4,
        })  # fmt: skip
        # And one without the service: `ray job submit` with the files in configs/ray_job/.
        stack.cli_log = root / "ray-job-submit.log"
        stack.cli = subprocess.Popen(
            [
                str(devstack.VENV_BIN / "ray"), "job", "submit",
                "--address", stack.head.dashboard_url,
                "--submission-id", "cli-e2e-1",
                "--runtime-env", "configs/ray_job/runtime_env.yaml",
                "--", str(ROOT / "configs" / "ray_job" / "entrypoint.sh"), str(root / "configs" / "tiny.yaml"),
                "--set", f"tracking.tracking_uri={stack.mlflow_uri}",
                "--set", "tracking.experiment=api-e2e-cli",
            ],
            cwd=ROOT, env={**os.environ, **stack.head.env}, text=True,
            stdout=open(stack.cli_log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        yield stack


def mlflow_client(e2e: E2E) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(e2e.mlflow_uri)


# --------------------------------------------------------------------------- auth


def test_every_auth_failure_case(e2e: E2E):
    job = e2e.jobs["success"]
    endpoints = [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{job}"),
                 ("GET", f"/v1/jobs/{job}/logs"), ("POST", f"/v1/jobs/{job}/cancel"), ("GET", "/metrics")]  # fmt: skip
    with httpx.Client(base_url=e2e.url, timeout=30) as c:
        for method, path in endpoints:
            body = {"json": {"config_name": "tiny"}} if method == "POST" and path == "/v1/jobs" else {}
            assert c.request(method, path, **body).status_code == 401, path  # no key
            for bad in ({"Authorization": "Bearer dlrm_0123456789abcdef_" + "x" * 43}, {"X-API-Key": "garbage"},
                        {"Authorization": e2e.keys["alice"]}):  # fmt: skip
                assert c.request(method, path, headers=bad, **body).status_code == 401, (path, bad)
        assert c.get("/healthz").status_code == 200
    with e2e.http("bob") as bob:
        # Another user's job: invisible, not cancellable, not listable.
        assert bob.get(f"/v1/jobs/{job}").status_code == 404
        assert bob.get(f"/v1/jobs/{job}/logs").status_code == 404
        assert bob.post(f"/v1/jobs/{job}/cancel").status_code == 404
        assert bob.get("/v1/jobs", params={"owner": "alice"}).status_code == 403
        assert {j["id"] for j in bob.get("/v1/jobs").json()["items"]} == {e2e.jobs["retry"]}
    with e2e.http("root") as admin:
        owners = {j["owner"] for j in admin.get("/v1/jobs").json()["items"]}
        assert owners == {"alice", "bob"}
    with e2e.http("alice") as alice:
        # The idempotency key gives back the same job; another body with it is refused.
        r = alice.post("/v1/jobs", json={"config_name": "tiny", "idempotency_key": "success-1"})
        assert r.status_code == 200 and r.json()["id"] == job
        r = alice.post("/v1/jobs", json={"config_name": "tiny", "idempotency_key": "success-1", "priority": 5})
        assert r.status_code == 409
        r = alice.post("/v1/jobs", json={"config_name": "tiny", "overrides": {"train.epochs": "many"}})
        assert r.status_code == 422 and "train.epochs" in r.text
    # Ray's own token auth stays on: raw HTTP to the Jobs API and a CLI without the token are refused.
    assert httpx.get(f"{e2e.head.dashboard_url}/api/jobs/", timeout=30).status_code == 401
    r = e2e.ray_cli("list", token=False)
    assert r.returncode != 0 and "auth" in (r.stdout + r.stderr).lower()


# --------------------------------------------------------------------------- cancel


def test_cancel_running_job_stops_it_and_kills_the_mlflow_run(e2e: E2E):
    job_id = e2e.jobs["cancel"]
    running = e2e.wait_status(job_id, {"RUNNING"}, timeout=600)
    # Follow its logs while it runs; the stream ends by itself once the job has stopped.
    chunks: list[str] = []

    def follow() -> None:
        with e2e.http("alice") as c, c.stream(
            "GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, timeout=600
        ) as r:
            assert r.status_code == 200
            for text in r.iter_text():
                chunks.append(text)

    streamer = threading.Thread(target=follow, daemon=True)
    streamer.start()
    wait_for("streamed log output", lambda: "".join(chunks).strip(), timeout_s=300, interval_s=1.0)
    with e2e.http("alice") as alice:
        r = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    done = e2e.wait_status(job_id, {"STOPPED"}, timeout=180)
    streamer.join(timeout=120)
    assert not streamer.is_alive(), "the followed log stream did not end with the job"
    assert done["finished_at"] and done["status_reason"] == "cancelled"
    info = e2e.ray_cli("status", running["ray_submission_id"])
    assert "stopped" in (info.stdout + info.stderr).lower()
    run = mlflow_client(e2e).get_run(done["mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert run.data.tags["job_id"] == job_id and run.data.tags["user"] == "alice"


# --------------------------------------------------------------------------- restart


def test_restart_api_mid_job_keeps_job_and_history(e2e: E2E):
    job_id = e2e.jobs["success"]
    before = e2e.wait_status(job_id, {"RUNNING", "SUCCEEDED"}, timeout=600)
    listed_before = e2e.http("root").get("/v1/jobs").json()
    e2e.restart_api()
    after = e2e.job(job_id)
    assert after["created_at"] == before["created_at"] and after["ray_submission_id"] == before["ray_submission_id"]
    assert after["mlflow_run_id"] == before["mlflow_run_id"]
    assert after["events"][: len(before["events"])] == before["events"]
    listed_after = e2e.http("root").get("/v1/jobs").json()
    assert {j["id"] for j in listed_after["items"]} == {j["id"] for j in listed_before["items"]}
    # The new process reconciled its records with Ray's job table and keeps following the job.
    wait_for("reconciliation", lambda: any(e["kind"] == "reconciled" for e in e2e.job(job_id)["events"])
             or e2e.job(job_id)["status"] == "SUCCEEDED", timeout_s=60, interval_s=1.0)  # fmt: skip


# --------------------------------------------------------------------------- success


def test_submitted_job_succeeds_with_metrics_in_its_mlflow_run(e2e: E2E):
    job_id = e2e.jobs["success"]
    done = e2e.wait_status(job_id, {"SUCCEEDED"}, timeout=900)
    assert done["attempt"] == 1 and done["finished_at"]
    assert done["ray_dashboard_url"] == f"{e2e.head.dashboard_url}/#/jobs/{done['ray_submission_id']}"
    assert done["mlflow_run_url"].endswith(f"/runs/{done['mlflow_run_id']}")
    assert done["progress"]["samples_per_s"] > 0 and done["progress"]["steps_done"] > 0
    client = mlflow_client(e2e)
    run = client.get_run(done["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["job_id"] == job_id and run.data.tags["user"] == "alice"
    for key in ("loss", "samples_per_s", "data_wait_fraction", "auc", "logloss"):
        assert key in run.data.metrics, (key, sorted(run.data.metrics))
    assert len(client.get_metric_history(run.info.run_id, "loss")) >= 2
    # Exactly one run for the job.
    exp = client.get_experiment_by_name("api-e2e")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.job_id = '{job_id}'")
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    logs = e2e.logs(job_id)
    assert "apitiny" in logs or "MLflow run" in logs
    with e2e.http("alice") as c:
        text = c.get("/metrics").text
    assert 'dlrm_jobs{status="SUCCEEDED"}' in text and "dlrm_job_attempts_total" in text


# --------------------------------------------------------------------------- retry


def _driver_pids(config_path: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config_path).encode() in argv and b"dlrm_platform.cli" in argv and b"run" in argv:
            pids.append(int(proc.name))
    return pids


def test_retry_resumes_from_checkpoint_after_injected_failure(e2e: E2E):
    job_id = e2e.jobs["retry"]
    e2e.wait_status(job_id, {"RUNNING"}, timeout=600)
    train_dir = e2e.root / "storage" / job_id / "train"
    ckpt = wait_for("a checkpoint of attempt 1", lambda: policy.find_latest_checkpoint(train_dir), 600, 0.1)
    # Inject the failure: kill attempt 1's driver (a process this test's Ray head started).
    pids = _driver_pids(e2e.root / "storage" / job_id / "job.yaml")
    assert pids, "driver process of attempt 1 not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    done = e2e.wait_status(job_id, {"SUCCEEDED"}, timeout=900)
    assert done["attempt"] == 2
    retry = [e for e in done["events"] if e["kind"] == "retry_scheduled"]
    assert len(retry) == 1 and "resuming from checkpoint" in retry[0]["message"]
    resumed = done["resume_from"]
    assert resumed and Path(resumed).name.startswith("checkpoint_") and Path(resumed).parent.parent == train_dir
    assert Path(resumed).name >= ckpt.name  # the latest one attempt 1 wrote
    # Attempt 2 restored it (the training loop logs "restored <path>: epoch E, global step S").
    logs2 = e2e.logs(job_id, attempt=2)
    assert "restored" in logs2, logs2[-3000:]
    step = int(logs2.split("global step ")[1].split()[0].rstrip(";,"))
    assert step > 0
    # Both attempts logged into the one MLflow run, which ended FINISHED.
    client = mlflow_client(e2e)
    run = client.get_run(done["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["job_id"] == job_id
    exp = client.get_experiment_by_name("api-e2e")
    assert len(client.search_runs([exp.experiment_id], filter_string=f"tags.job_id = '{job_id}'")) == 1
    assert e2e.logs(job_id, attempt=1)  # attempt 1's logs are kept


# --------------------------------------------------------------------------- ray job submit


def test_ray_job_submit_cli_runs_the_job(e2e: E2E):
    assert e2e.cli is not None and e2e.cli_log is not None
    rc = e2e.cli.wait(timeout=900)
    out = e2e.cli_log.read_text()
    assert rc == 0, out[-4000:]
    assert "cli-e2e-1" in out and "succeeded" in out.lower()
    status = e2e.ray_cli("status", "cli-e2e-1")
    assert "succeeded" in (status.stdout + status.stderr).lower()
    client = mlflow_client(e2e)
    exp = client.get_experiment_by_name("api-e2e-cli")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and "auc" in runs[0].data.metrics
