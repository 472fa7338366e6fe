"""SIGKILL the job service's API process (uvicorn) while jobs run and others wait in its queue.

A real stack (tests/api_stack.py: MLflow server, Ray head with token auth, `dlrm-platform serve`)
runs at most 2 jobs at once. Four tiny jobs are submitted: two start (one of them long, to be
cancelled), two wait QUEUED. At a point the seed picks, the API process is killed by its pid from
outside (no shutdown code runs), left down for a seeded while (jobs go on under Ray, one may end),
and started again on the same database. The cancel lands just before the kill or just after the
restart (seeded). After reconciliation:

* every submitted job is listed exactly once, and nothing else is;
* the cancelled job ends STOPPED (its Ray job STOPPED), every other job SUCCEEDED;
* Ray's job table holds exactly one submission per job (the one the record names): nothing was
  submitted twice, nothing runs on;
* the jobs that were queued at the kill were started by the new process;
* the history recorded before the kill is kept, and each job active at the kill was reconciled.
"""

from __future__ import annotations

import os
import random
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from api_stack import TERMINAL, api_stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]
SEEDS = [int(s) for s in os.environ.get("DLRM_CHAOS_SEEDS", "7").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_api_sigkill_loses_duplicates_and_strands_no_job(tmp_path: Path, seed: int):
    rng = random.Random(seed)
    delay_s = rng.uniform(0.0, 4.0)  # after both first jobs are RUNNING
    down_s = rng.uniform(0.5, 6.0)  # how long the API stays dead
    cancel_before_kill = rng.random() < 0.5
    print(f"seed {seed}: kill {delay_s:.1f} s after 2 jobs run, down {down_s:.1f} s, "
          f"cancel {'before the kill' if cancel_before_kill else 'after the restart'}")  # fmt: skip

    env = {"DLRM_API_MAX_RUNNING_JOBS": "2", "DLRM_API_MAX_RUNNING_PER_USER": "2"}
    with api_stack(tmp_path, api_env=env) as s:
        # Highest priority first: `long` and `run` start, `q1` and `q2` wait for a free slot.
        jobs = {
            "long": s.submit("bob", priority=10, overrides={"train.epochs": 100}),
            "run": s.submit("alice", priority=5),
            "q1": s.submit("alice", priority=0),
            "q2": s.submit("bob", priority=0),
        }
        ids = set(jobs.values())
        s.wait_status(jobs["long"], {"RUNNING"}, timeout=600)
        s.wait_status(jobs["run"], {"RUNNING"}, timeout=600)
        time.sleep(delay_s)
        before = {name: s.job(job_id) for name, job_id in jobs.items()}
        queued_at_kill = {n for n, j in before.items() if j["status"] == "QUEUED"}
        active_at_kill = {n for n, j in before.items() if j["status"] in ("STARTING", "RUNNING")}
        assert queued_at_kill, f"nothing queued at the kill: {before}"

        def cancel() -> None:
            with s.http("bob") as c:
                r = c.post(f"/v1/jobs/{jobs['long']}/cancel")
            assert r.status_code == 202, r.text

        if cancel_before_kill:
            cancel()
            before["long"] = s.job(jobs["long"])
        killed_at = datetime.now(UTC)
        s.kill_api()
        assert s.api.returncode == -9
        time.sleep(down_s)
        s.start_api()
        if not cancel_before_kill:
            cancel()

        # Listed exactly once each, and nothing else, right after the restart.
        with s.http("root") as c:
            listed = c.get("/v1/jobs", params={"limit": 200}).json()
        assert sorted(j["id"] for j in listed["items"]) == sorted(ids) and listed["total"] == len(ids)

        # Every job reaches the state it should, each queued one started by the new process.
        final = {}
        for name, job_id in jobs.items():
            final[name] = wait_for(
                f"{name} ({job_id}) terminal",
                lambda job_id=job_id: (j := s.job(job_id))["status"] in TERMINAL and j,
                timeout_s=900,
                interval_s=2.0,
            )
        want = {"long": "STOPPED", "run": "SUCCEEDED", "q1": "SUCCEEDED", "q2": "SUCCEEDED"}
        got = {name: j["status"] for name, j in final.items()}
        assert got == want, {n: (j["status"], j["status_reason"]) for n, j in final.items()}
        assert final["long"]["status_reason"] == "cancelled"
        for name, j in final.items():
            assert j["attempt"] == 1, (name, j["attempt"], j["events"])
            assert j["ray_submission_id"] == f"{j['id']}-1"
            # The history from before the kill is kept, in order.
            assert j["events"][: len(before[name]["events"])] == before[name]["events"], name
            kinds = [e["kind"] for e in j["events"]]
            assert kinds.count("attempt_started") == 1, (name, kinds)
            assert kinds.count("finished") == 1, (name, kinds)
        for name in active_at_kill:
            assert "reconciled" in [e["kind"] for e in final[name]["events"]], name
        for name in queued_at_kill:
            assert before[name]["ray_submission_id"] is None
            (started,) = [e for e in final[name]["events"] if e["kind"] == "attempt_started"]
            assert datetime.fromisoformat(started["at"]) > killed_at, (name, started)

        # Ray's side: one submission per job, the one its record names, none still running.
        def ray_settled() -> list[dict] | None:
            ours = [r for r in s.ray_jobs() if r["metadata"].get("dlrm_job_id") in ids]
            return ours if all(r["status"] in TERMINAL for r in ours) else None

        ours = wait_for("Ray's jobs of the service settled", ray_settled, timeout_s=120, interval_s=2.0)
        by_job: dict[str, list[dict]] = {}
        for r in ours:
            by_job.setdefault(r["metadata"]["dlrm_job_id"], []).append(r)
        assert {k: len(v) for k, v in by_job.items()} == {i: 1 for i in ids}, by_job
        for name, job_id in jobs.items():
            (r,) = by_job[job_id]
            assert r["submission_id"] == final[name]["ray_submission_id"]
            assert r["status"] == want[name], (name, r)

        # The new process is healthy and counts what it sees.
        with s.http("root") as c:
            assert c.get("/healthz").status_code == 200
            text = c.get("/metrics").text
        assert re.search(r'^dlrm_jobs\{status="SUCCEEDED"\} 3(\.0)?$', text, re.MULTILINE), text[-2000:]
