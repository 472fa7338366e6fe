"""The job service over HTTP (TestClient) on fake Ray and MLflow, the scheduler driven by hand."""

from __future__ import annotations

import json
import shlex
from datetime import timedelta
from pathlib import Path

from api_fakes import FakeBackend, FakeTracker, Stack

from dlrm_platform.api.mlflow_links import Progress


def sets_of(entrypoint: str) -> dict[str, str]:
    argv = shlex.split(entrypoint.partition(" && exec ")[2])
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")


def test_submit_by_name_runs_to_success(stack: Stack):
    out = stack.submit("alice", overrides={"train.epochs": 2}, priority=3)
    assert out["status"] == "QUEUED" and out["created"]
    stack.service.tick()
    job = stack.job(out["id"], "alice")
    assert job["status"] == "STARTING" and job["attempt"] == 1
    sub = stack.backend.submissions[-1]
    assert sub["sid"] == job["ray_submission_id"] == f"{out['id']}-1"
    ep = sub["entrypoint"]
    assert " && exec /opt/venv/bin/python -m dlrm_platform.cli run " in ep
    sets = sets_of(ep)
    assert sets["tracking.tracking_uri"] == '"http://mlflow:5000"'
    assert sets["tracking.tags.job_id"] == json.dumps(out["id"])
    assert sets["tracking.tags.user"] == '"alice"'
    assert sets["tracking.run_id"] == json.dumps(job["mlflow_run_id"])
    assert "train.resume_from" not in sets
    # The resolved config went to a file the job reads; overrides applied.
    cfg_path = Path(shlex.split(ep.partition(" && exec ")[2])[4])
    assert "epochs: 2" in cfg_path.read_text()
    # One MLflow run per job, tagged with job id and user.
    run = stack.tracker.runs[job["mlflow_run_id"]]
    assert run["tags"]["job_id"] == out["id"] and run["tags"]["user"] == "alice"

    stack.backend.set_status(sub["sid"], "RUNNING")
    stack.tracker.progress_of[job["mlflow_run_id"]] = Progress(steps_done=17, samples_per_s=900.0,
                                                                data_wait_fraction=0.3)
    stack.service.tick()
    job = stack.job(out["id"], "alice")
    assert job["status"] == "RUNNING" and job["started_at"]
    # what the tracker read from the job's run (the real reader: test_progress_is_read_from_...)
    assert job["progress"]["steps_done"] == 17 and job["progress"]["data_wait_fraction"] == 0.3
    assert job["ray_dashboard_url"] == f"http://ray:8265/#/jobs/{sub['sid']}"
    assert job["mlflow_run_url"].endswith(f"/runs/{job['mlflow_run_id']}")

    stack.backend.set_status(sub["sid"], "SUCCEEDED")
    stack.service.tick()
    job = stack.job(out["id"], "alice")
    assert job["status"] == "SUCCEEDED" and job["finished_at"]
    kinds = [e["kind"] for e in job["events"]]
    assert kinds[0] == "submitted" and "attempt_started" in kinds and kinds[-1] == "finished"
    # Logs were archived at the end and are served from the archive.
    assert stack.client.get(f"/v1/jobs/{out['id']}/logs", headers=stack.h("alice")).text == f"log of {sub['sid']}\n"


def test_progress_is_read_from_the_jobs_mlflow_run(tmp_path: Path):
    """The real MLflow progress reader (api.mlflow_links.MlflowTracker) on a real run, written by the
    job's own MLflow logger (train.mlflow_logger) the way the train loop writes it."""
    from dlrm_platform.api.mlflow_links import MlflowTracker, init_backend_store
    from dlrm_platform.train.mlflow_logger import MlflowTracker as JobTracker

    uri = init_backend_store(tmp_path / "mlflow" / "mlflow.db", tmp_path / "mlflow" / "artifacts")
    s = Stack(tmp_path, tracker=MlflowTracker(uri), progress_interval_s=1e-6)
    try:
        job = s.submit("alice")["id"]
        s.service.tick()
        run_id = s.job(job)["mlflow_run_id"]
        assert run_id and s.service.tracker.find_run(job)[0] == run_id  # a real run, tagged with the job id
        s.backend.set_status(f"{job}-1", "RUNNING")
        s.service.tick()
        assert s.job(job)["progress"]["steps_done"] is None  # nothing logged yet

        writer = JobTracker(uri, run_id)
        for step in range(1, 13):  # per-step metrics, as Worker._log_step logs them
            writer.log_step(step, {"loss": 0.7 - 0.01 * step, "samples_per_s": 1000.0 + step,
                                   "data_wait_fraction": 0.5 - 0.02 * step})
        writer.log_epoch(0, {"epoch_train_loss": 0.6, "epoch_samples_per_s": 5.0,
                             "epoch_data_wait_fraction": 0.9})  # logged at step = epoch
        s.service.tick()
        p = s.job(job)["progress"]
        assert p["steps_done"] == 12
        assert p["samples_per_s"] == 1012.0 and abs(p["data_wait_fraction"] - 0.26) < 1e-9
        assert p["updated_at"]

        for step in range(13, 21):
            writer.log_step(step, {"loss": 0.5, "samples_per_s": 2000.0 + step, "data_wait_fraction": 0.1})
        writer.flush()
        s.service.tick()
        p = s.job(job)["progress"]
        assert (p["steps_done"], p["samples_per_s"], p["data_wait_fraction"]) == (20, 2020.0, 0.1)
    finally:
        s.close()


def test_a_job_submitted_through_the_api_logs_its_config_params(tmp_path: Path):
    """The service creates the job's MLflow run; the job, reopening it (tracking.run_id), logs its
    resolved config as params once. A retry (train.resume_from set) leaves them as they are."""
    from mlflow.tracking import MlflowClient

    from dlrm_platform.api.mlflow_links import MlflowTracker, init_backend_store
    from dlrm_platform.config import load_job_config
    from dlrm_platform.mlflow_run import start_job_run

    uri = init_backend_store(tmp_path / "mlflow" / "mlflow.db", tmp_path / "mlflow" / "artifacts")
    s = Stack(tmp_path, tracker=MlflowTracker(uri))
    try:
        job_id = s.submit("alice", overrides={"train.epochs": 2})["id"]
        s.service.tick()
        ep = s.backend.submissions[-1]["entrypoint"]
        sets = sets_of(ep)
        cfg_path = Path(shlex.split(ep.partition(" && exec ")[2])[4])
        run_id = s.job(job_id)["mlflow_run_id"]
        assert sets["tracking.run_id"] == json.dumps(run_id)
        job = load_job_config(cfg_path, [f"{k}={v}" for k, v in sets.items()])  # as the job's `run` reads it
        assert start_job_run(job, uri, run_id=job.tracking.run_id) == run_id
        params = MlflowClient(uri).get_run(run_id).data.params
        assert params["train.epochs"] == "2" and params["name"] == "tiny"
        assert params["tracking.tags.job_id"] == job_id

        retry = load_job_config(cfg_path, [*(f"{k}={v}" for k, v in sets.items()), "train.resume_from=/ckpt/e1"])
        assert start_job_run(retry, uri, run_id=run_id) == run_id
        assert MlflowClient(uri).get_run(run_id).data.params == params
    finally:
        s.close()


def test_progress_reads_the_metrics_the_worker_logs_without_the_loss_history(tmp_path: Path, monkeypatch):
    """Worker._log_step and the API's progress reader share the metric names (dlrm_platform.run_metrics):
    a status poll reads steps done from the run's latest metrics, never the whole loss history."""
    from types import SimpleNamespace

    from dlrm_platform.api.mlflow_links import MlflowTracker, init_backend_store
    from dlrm_platform.train.lockstep import StepBatch
    from dlrm_platform.train.loop import Worker
    from dlrm_platform.train.mlflow_logger import MlflowTracker as JobTracker

    uri = init_backend_store(tmp_path / "mlflow" / "mlflow.db", tmp_path / "mlflow" / "artifacts")
    reader = MlflowTracker(uri)
    run_id, _ = reader.create_run("progress", "run", {})
    worker = SimpleNamespace(progress=SimpleNamespace(global_step=0), tracker=JobTracker(uri, run_id), world_size=1)
    for step in range(1, 8):
        worker.progress.global_step = step
        Worker._log_step(worker, StepBatch(batch=None, num_samples=4, global_samples=8, wait_s=0.25),
                         loss_sum=2.0, compute_s=0.75)
    worker.tracker.flush()

    def no_history(*_a, **_k):
        raise AssertionError("the progress reader fetched a metric history")

    monkeypatch.setattr(reader.client, "get_metric_history", no_history)
    p = reader.progress(run_id)
    assert p is not None
    assert (p.steps_done, p.samples_per_s, p.data_wait_fraction) == (7, 8.0, 0.25)


def test_whole_config_and_422_naming_field_paths(stack: Stack):
    from api_fakes import TINY_CONFIG

    import yaml

    cfg = yaml.safe_load(TINY_CONFIG)
    r = stack.client.post("/v1/jobs", json={"config": cfg}, headers=stack.h("alice"))
    assert r.status_code == 201, r.text

    bad = yaml.safe_load(TINY_CONFIG)
    bad["train"]["epochs"] = "many"
    bad["ingest"] = {"bogus": 1}
    r = stack.client.post("/v1/jobs", json={"config": bad}, headers=stack.h("alice"))
    assert r.status_code == 422
    locs = {tuple(e["loc"]) for e in r.json()["detail"]}
    assert ("body", "config", "train", "epochs") in locs and ("body", "config", "ingest", "bogus") in locs
    assert any("train.epochs" in e["msg"] for e in r.json()["detail"])

    r = stack.client.post("/v1/jobs", json={"config_name": "tiny", "overrides": {"train.epochs": 0}}, headers=stack.h("alice"))
    assert r.status_code == 422 and "train.epochs" in r.text
    r = stack.client.post("/v1/jobs", json={"config_name": "broken"}, headers=stack.h("alice"))
    assert r.status_code == 422 and "configs/broken: train.epochs" in r.text
    r = stack.client.post("/v1/jobs", json={"config_name": "nope"}, headers=stack.h("alice"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "config_name"]
    for body in ({}, {"config_name": "tiny", "config": cfg}, {"config_name": "../etc/passwd"},
                 {"config_name": "tiny", "priority": 10**6}, {"config_name": "tiny", "overrides": {"a..b": 1}},
                 {"config_name": "tiny", "surprise": 1}):
        r = stack.client.post("/v1/jobs", json=body, headers=stack.h("alice"))
        assert r.status_code == 422, (body, r.text)
    assert stack.client.get("/v1/jobs", headers=stack.h("alice")).json()["total"] == 1


def test_idempotency_key(stack: Stack):
    a = stack.submit("alice", idempotency_key="k1", priority=1)
    b = stack.client.post("/v1/jobs", json={"config_name": "tiny", "idempotency_key": "k1", "priority": 1},
                          headers=stack.h("alice"))
    assert b.status_code == 200 and b.json()["id"] == a["id"] and b.json()["created"] is False
    c = stack.client.post("/v1/jobs", json={"config_name": "tiny", "idempotency_key": "k1", "priority": 2},
                          headers=stack.h("alice"))
    assert c.status_code == 409
    # Keys are per user.
    d = stack.submit("bob", idempotency_key="k1", priority=1)
    assert d["id"] != a["id"]


def test_list_filters_and_pages(stack: Stack):
    ids = [stack.submit("alice", priority=i)["id"] for i in range(5)]
    stack.submit("bob")
    r = stack.client.get("/v1/jobs?limit=2&offset=1", headers=stack.h("alice")).json()
    assert r["total"] == 5 and [j["id"] for j in r["items"]] == ids[::-1][1:3]
    stack.service.tick()  # alice may run 1: her priority-4 job starts
    r = stack.client.get("/v1/jobs?status=STARTING", headers=stack.h("alice")).json()
    assert [j["id"] for j in r["items"]] == [ids[4]]
    assert stack.client.get("/v1/jobs", headers=stack.h("root")).json()["total"] == 6
    assert stack.client.get("/v1/jobs?owner=bob", headers=stack.h("root")).json()["total"] == 1
    assert stack.client.get("/v1/jobs?status=NOPE", headers=stack.h("root")).status_code == 422
    assert stack.client.get("/v1/jobs?limit=0", headers=stack.h("root")).status_code == 422


def test_queue_priority_and_per_user_limit(stack: Stack):
    a_low = stack.submit("alice", priority=0)["id"]
    a_high = stack.submit("alice", priority=9)["id"]
    b = stack.submit("bob", priority=-5)["id"]
    c = stack.submit("bob", priority=-5)["id"]
    stack.service.tick()
    status = {j: stack.job(j)["status"] for j in (a_low, a_high, b, c)}
    assert status == {a_low: "QUEUED", a_high: "STARTING", b: "STARTING", c: "QUEUED"}
    stack.backend.set_status(f"{a_high}-1", "SUCCEEDED")
    stack.service.tick()
    assert stack.job(a_low)["status"] == "STARTING"
    assert stack.job(c)["status"] == "QUEUED"  # bob still at his limit


def test_retry_resumes_from_last_checkpoint(tmp_path: Path):
    s = Stack(tmp_path, default_max_retries=0)
    try:
        job = s.submit("alice", max_retries=2)["id"]
        s.service.tick()
        run_id = s.job(job)["mlflow_run_id"]
        # Attempt 1 writes a checkpoint (as Ray Train V2 lays it out), then fails.
        ck = tmp_path / "storage" / job / "train" / "tiny" / "checkpoint_2026-01-01_00-00-05.000000"
        ck.mkdir(parents=True)
        (ck / "state.pt").write_text("x")
        (ck.parent / "checkpoint_manager_snapshot.json").write_text(
            json.dumps({"latest_checkpoint_result": {"checkpoint_dir_name": ck.name}})
        )
        s.backend.set_status(f"{job}-1", "FAILED", "worker died")
        s.service.tick()  # failure noticed -> QUEUED -> dispatched again in the same pass
        j = s.job(job)
        assert j["status"] == "STARTING" and j["attempt"] == 2 and j["resume_from"] == str(ck)
        sets = sets_of(s.backend.submissions[-1]["entrypoint"])
        assert sets["train.resume_from"] == json.dumps(str(ck))
        assert sets["tracking.run_id"] == json.dumps(run_id)  # the same MLflow run
        assert sets["train.storage_path"] == json.dumps(str(tmp_path / "storage" / job / "train"))
        assert any(e["kind"] == "retry_scheduled" and str(ck) in e["message"] for e in j["events"])
        # Attempt 2 fails too, attempt 3 as well: retries exhausted -> FAILED, run marked FAILED.
        s.backend.set_status(f"{job}-2", "FAILED", "again")
        s.service.tick()
        s.backend.set_status(f"{job}-3", "FAILED", "and again")
        s.service.tick()
        j = s.job(job)
        assert j["status"] == "FAILED" and j["attempt"] == 3 and "and again" in j["status_reason"]
        assert (run_id, "FAILED") in s.tracker.terminated
        # Logs of every attempt stay readable.
        for n in (1, 2, 3):
            r = s.client.get(f"/v1/jobs/{job}/logs?attempt={n}", headers=s.h("alice"))
            assert r.text == f"log of {job}-{n}\n"
    finally:
        s.close()


def test_cancel_queued_and_running(stack: Stack):
    running = stack.submit("alice")["id"]
    queued = stack.submit("alice")["id"]
    stack.service.tick()
    stack.backend.set_status(f"{running}-1", "RUNNING")
    stack.service.tick()
    r = stack.client.post(f"/v1/jobs/{queued}/cancel", headers=stack.h("alice"))
    assert r.status_code == 202 and r.json()["status"] == "STOPPED"
    r = stack.client.post(f"/v1/jobs/{running}/cancel", headers=stack.h("alice"))
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    assert f"{running}-1" in stack.backend.stopped
    stack.service.tick()
    j = stack.job(running)
    assert j["status"] == "STOPPED"
    assert (j["mlflow_run_id"], "KILLED") in stack.tracker.terminated
    assert stack.client.post(f"/v1/jobs/{running}/cancel", headers=stack.h("alice")).status_code == 409


def test_deadline_stops_running_and_expires_queued(stack: Stack):
    run = stack.submit("alice", deadline_s=60)["id"]
    wait = stack.submit("alice", deadline_s=60)["id"]
    stack.service.tick()
    stack.backend.set_status(f"{run}-1", "RUNNING")
    stack.service.tick()
    real = stack.service.clock
    stack.service.clock = lambda: real() + timedelta(seconds=61)
    stack.service.tick()  # stop sent; fake Ray stops at once
    stack.service.tick()
    assert stack.job(wait)["status"] == "TIMED_OUT"
    j = stack.job(run)
    assert j["status"] == "TIMED_OUT" and f"{run}-1" in stack.backend.stopped
    assert (j["mlflow_run_id"], "KILLED") in stack.tracker.terminated


def test_restart_keeps_history_and_reconciles(tmp_path: Path):
    backend, tracker = FakeBackend(), FakeTracker()
    s1 = Stack(tmp_path, backend=backend, tracker=tracker)
    keep = s1.submit("alice")["id"]
    lost = s1.submit("bob", max_retries=0)["id"]
    queued = s1.submit("alice")["id"]
    s1.service.tick()
    backend.set_status(f"{keep}-1", "RUNNING")
    backend.set_status(f"{lost}-1", "RUNNING")
    s1.service.tick()
    before = s1.job(keep)
    keys = s1.keys
    s1.close()
    # The Ray head restarted meanwhile and forgot bob's job; an orphan of ours is running too.
    del backend.jobs[f"{lost}-1"]
    backend.submit(f"{queued}-7", "x", runtime_env={}, metadata={"dlrm_job_id": queued}, entrypoint_num_cpus=0)
    backend.submit("other-1", "x", runtime_env={}, metadata={"dlrm_job_id": "job-of-another-service"},
                   entrypoint_num_cpus=0)
    s2 = Stack(tmp_path, backend=backend, tracker=tracker)
    s2.keys = keys
    s2.service.reconcile()
    after = s2.job(keep)
    assert after["status"] == "RUNNING" and after["created_at"] == before["created_at"]
    assert [e["kind"] for e in after["events"]][: len(before["events"])] == [e["kind"] for e in before["events"]]
    assert after["events"][-1]["kind"] == "reconciled"
    lost_job = s2.job(lost)
    assert lost_job["status"] == "FAILED" and "no record" in lost_job["status_reason"]
    assert f"{queued}-7" in backend.stopped  # an attempt the records do not expect
    assert "other-1" not in backend.stopped  # not ours to judge
    assert s2.job(queued)["status"] == "QUEUED"
    s2.close()


def test_starting_job_lost_before_submission_is_resubmitted(stack: Stack):
    job = stack.submit("alice")["id"]
    stack.backend.fail_submit = True
    stack.service.tick()  # the record says STARTING, Ray never got it
    assert stack.job(job)["status"] == "STARTING"
    stack.backend.fail_submit = False
    stack.service.tick()
    assert [s["sid"] for s in stack.backend.submissions] == [f"{job}-1"]
    assert any(e["kind"] == "resubmitted" for e in stack.job(job)["events"])


def test_ray_down_holds_the_queue(stack: Stack):
    stack.backend.down = True
    job = stack.submit("alice")["id"]
    stack.service.tick()
    assert stack.job(job)["status"] == "QUEUED"
    assert stack.client.get("/healthz").json()["ray"] is False
    stack.backend.down = False
    stack.service.tick()
    assert stack.job(job)["status"] == "STARTING"
    assert stack.client.get("/healthz").json()["ray"] is True


def test_mlflow_down_does_not_block_jobs(stack: Stack):
    stack.tracker.fail_create = True
    job = stack.submit("alice")["id"]
    stack.service.tick()
    j = stack.job(job)
    assert j["status"] == "STARTING" and j["mlflow_run_id"] is None
    assert "tracking.run_id" not in sets_of(stack.backend.submissions[-1]["entrypoint"])


def test_a_run_created_before_a_crash_is_adopted_not_duplicated(stack: Stack):
    # The service created the job's run, then stopped before saving its id: the next tick finds it by tag.
    job = stack.submit("alice")["id"]
    orphan, _ = stack.tracker.create_run("dlrm-platform", f"tiny-{job}", {"job_id": job, "user": "alice"})
    stack.service.tick()
    j = stack.job(job)
    assert j["mlflow_run_id"] == orphan and list(stack.tracker.runs) == [orphan]
    assert sets_of(stack.backend.submissions[-1]["entrypoint"])["tracking.run_id"] == json.dumps(orphan)


def test_metrics_endpoint(stack: Stack):
    stack.submit("alice")
    stack.client.get("/v1/jobs", headers={"X-API-Key": "bad"})
    text = stack.client.get("/metrics", headers=stack.h("alice")).text
    assert 'dlrm_jobs{status="QUEUED"} 1.0' in text
    assert "dlrm_jobs_submitted_total 1.0" in text
    assert 'dlrm_api_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0' in text
    assert "dlrm_api_auth_failures_total 1.0" in text


def test_follow_logs_streams_until_the_job_ends(stack: Stack):
    job = stack.submit("alice")["id"]
    stack.service.tick()
    stack.backend.set_status(f"{job}-1", "SUCCEEDED")
    stack.service.tick()
    r = stack.client.get(f"/v1/jobs/{job}/logs?follow=true", headers=stack.h("alice"))
    assert r.status_code == 200 and r.text == f"log of {job}-1\n"


def test_job_view_cache_never_serves_a_stale_state(tmp_path: Path):
    s = Stack(tmp_path, view_cache_ttl_s=3600.0)
    try:
        job = s.submit("alice")["id"]
        assert s.job(job, "alice")["status"] == "QUEUED"
        assert s.service.view_cache.get(job) is not None  # rendered once, then served from memory
        s.service.tick()  # ORM changes drop the entry on commit
        assert s.job(job, "alice")["status"] == "STARTING"
        s.backend.set_status(f"{job}-1", "RUNNING")
        s.service.tick()
        assert s.job(job, "alice")["status"] == "RUNNING"
        s.client.post(f"/v1/jobs/{job}/cancel", headers=s.h("alice"))
        assert s.job(job, "alice")["cancel_requested"] is True
        s.service.tick()
        assert s.job(job, "alice")["status"] == "STOPPED"
        # A cached view is still only for its owner and admins.
        assert s.client.get(f"/v1/jobs/{job}", headers=s.h("bob")).status_code == 404
        queued = s.submit("alice")["id"]
        s.job(queued, "alice")
        s.client.post(f"/v1/jobs/{queued}/cancel", headers=s.h("alice"))  # a Core UPDATE, not an ORM flush
        assert s.job(queued, "alice")["status"] == "STOPPED"
    finally:
        s.close()


def test_view_cache_sweeps_expired_views_and_old_change_marks(monkeypatch):
    """Memory follows the jobs polled lately: a long-lived service that polled thousands of jobs
    once does not keep each one's view (found by benchmarks/api_load.py --duration)."""
    from dlrm_platform.api import view_cache as vc

    now = [1000.0]
    monkeypatch.setattr(vc.time, "monotonic", lambda: now[0])
    cache = vc.ViewCache(ttl_s=2.0)
    for i in range(500):
        cache.invalidate([f"job-{i}"])
        cache.put(f"job-{i}", "alice", b"{}", cache.generation(f"job-{i}"))
    assert len(cache) == 500
    now[0] += 3.0  # all expired
    cache.put("fresh", "alice", b"{}", cache.generation("fresh"))
    assert len(cache) == 1 and cache.get("fresh") == ("alice", b"{}")
    assert len(cache._generations) == 500  # change marks outlive views: they guard renders in flight
    now[0] += cache.GENERATION_KEEP_S + 3.0
    cache.put("fresh2", "alice", b"{}", 0)
    assert cache._generations == {} and len(cache) == 1
    # A render that read a mark before it was swept out and set again is still refused.
    cache.invalidate(["job-1"])
    seen = cache.generation("job-1")
    now[0] += cache.GENERATION_KEEP_S + 3.0
    cache.put("other", "alice", b"{}", 0)  # sweeps the mark of job-1 out
    cache.invalidate(["job-1"])  # changed again
    cache.put("job-1", "alice", b"stale", seen)
    assert cache.get("job-1") is None


def test_key_cache_remembers_for_its_ttl(tmp_path: Path):
    from dlrm_platform.api.auth import KeyCache, Principal

    p = Principal("alice", False, "k")
    off = KeyCache(0)
    off.put("key", p)
    assert off.get("key") is None
    on = KeyCache(60)
    on.put("key", p)
    assert on.get("key") == p and on.get("other") is None
    assert "key" not in on._entries  # stored by hash, never the key


def test_concurrent_polls_of_an_uncached_job_share_one_render(tmp_path: Path, monkeypatch):
    import asyncio
    import threading

    import httpx

    from dlrm_platform.api.routes import jobs as job_routes

    s = Stack(tmp_path, view_cache_ttl_s=3600.0)
    renders: list[str] = []
    real_render = job_routes._render_job
    polls = 23
    arrived = threading.Event()  # every poll has looked for a render in flight

    class CountingRenders(dict):
        looked = 0

        def get(self, key, default=None):
            CountingRenders.looked += 1
            if CountingRenders.looked >= polls:
                arrived.set()
            return super().get(key, default)

    def held_render(job_id, principal, service, settings):
        renders.append(principal.user)
        # hold the render until every poll has arrived, so each one finds it in flight
        assert arrived.wait(timeout=30), f"only {CountingRenders.looked} of {polls} polls arrived"
        return real_render(job_id, principal, service, settings)

    monkeypatch.setattr(job_routes, "_render_job", held_render)
    try:
        job = s.submit("alice")["id"]
        s.service.view_cache.invalidate([job])
        s.service.view_renders = CountingRenders()

        async def burst():
            transport = httpx.ASGITransport(app=s.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
                return await asyncio.gather(*(c.get(f"/v1/jobs/{job}", headers=s.h(u))
                                              for u in ["alice"] * 20 + ["bob"] * 3))

        responses = asyncio.run(burst())
        alice, bob = responses[:20], responses[20:]
        assert [r.status_code for r in alice] == [200] * 20 and len({r.content for r in alice}) == 1
        assert [r.status_code for r in bob] == [404] * 3  # another user's job, shared render or not
        assert renders.count("alice") == 1 and renders.count("bob") == 1
        assert not s.service.view_renders  # nothing left in flight
    finally:
        s.close()
