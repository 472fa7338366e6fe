"""Queue order, per-user limits, retry decisions, checkpoint discovery, the entry point."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dlrm_platform.api import policy
from dlrm_platform.api.db import JobStatus
from dlrm_platform.api.policy import QueuedJob, select_jobs_to_start

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def q(id: str, owner: str, priority: int = 0, age: int = 0) -> QueuedJob:
    return QueuedJob(id=id, owner=owner, priority=priority, created_at=T0 + timedelta(seconds=age))


def ids(jobs: list[QueuedJob]) -> list[str]:
    return [j.id for j in jobs]


def test_priority_then_fifo():
    jobs = [q("a", "u1", 0, 0), q("b", "u2", 5, 1), q("c", "u3", 5, 2), q("d", "u4", 0, 3)]
    assert ids(select_jobs_to_start(jobs, {}, max_running=10, max_running_per_user=5)) == ["b", "c", "a", "d"]


def test_per_user_limit_skips_user_without_blocking_others():
    jobs = [q("a1", "alice", 9, 0), q("a2", "alice", 9, 1), q("b1", "bob", 0, 2)]
    chosen = select_jobs_to_start(jobs, {}, max_running=3, max_running_per_user=1)
    assert ids(chosen) == ["a1", "b1"]


def test_running_jobs_count_against_limits():
    jobs = [q("a1", "alice"), q("b1", "bob", age=1), q("c1", "carol", age=2)]
    assert ids(select_jobs_to_start(jobs, {"alice": 1}, max_running=2, max_running_per_user=1)) == ["b1"]
    assert select_jobs_to_start(jobs, {"x": 2}, max_running=2, max_running_per_user=1) == []


@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-3, 3)), max_size=30),
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 3)),
    st.integers(1, 6),
    st.integers(1, 3),
)
def test_selection_never_exceeds_limits(spec, running, max_running, per_user):
    jobs = [q(f"j{i}", owner, prio, i) for i, (owner, prio) in enumerate(spec)]
    chosen = select_jobs_to_start(jobs, running, max_running=max_running, max_running_per_user=per_user)
    assert len(chosen) <= max(0, max_running - sum(running.values()))
    for user in "abcd":
        assert running.get(user, 0) + sum(j.owner == user for j in chosen) <= max(per_user, running.get(user, 0))
    # Whenever capacity is left, every job left behind belongs to a user at their limit.
    free = max_running - sum(running.values())
    picked = set(ids(chosen))
    if len(chosen) < free:
        for j in jobs:
            if j.id not in picked:
                assert running.get(j.owner, 0) + sum(c.owner == j.owner for c in chosen) >= per_user


def test_should_retry():
    now = T0
    kw = dict(cancel_requested=False, deadline_at=None, now=now)
    assert policy.should_retry(attempt=1, max_retries=1, **kw)
    assert not policy.should_retry(attempt=2, max_retries=1, **kw)
    assert not policy.should_retry(attempt=1, max_retries=0, **kw)
    assert not policy.should_retry(attempt=1, max_retries=3, cancel_requested=True, deadline_at=None, now=now)
    assert not policy.should_retry(
        attempt=1, max_retries=3, cancel_requested=False, deadline_at=now - timedelta(seconds=1), now=now
    )


def test_ray_status_mapping():
    assert policy.map_ray_status("PENDING") is JobStatus.STARTING
    assert policy.map_ray_status("JobStatus.RUNNING") is JobStatus.RUNNING
    for s in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert policy.map_ray_status(s).terminal


def _ckpt(root: Path, name: str) -> Path:
    d = root / "run" / name
    d.mkdir(parents=True)
    (d / "model.pt").write_text("x")
    return d


def test_latest_checkpoint_prefers_ray_snapshot(tmp_path: Path):
    assert policy.find_latest_checkpoint(tmp_path / "missing") is None
    assert policy.find_latest_checkpoint(tmp_path) is None
    good = _ckpt(tmp_path, "checkpoint_2026-01-01_00-00-01")
    _ckpt(tmp_path, "checkpoint_2026-01-01_00-00-09")  # newer, but not recorded: being written when it died
    (tmp_path / "run" / policy.SNAPSHOT_NAME).write_text(
        json.dumps({"latest_checkpoint_result": {"checkpoint_dir_name": good.name}})
    )
    assert policy.find_latest_checkpoint(tmp_path) == good


def test_latest_checkpoint_without_snapshot(tmp_path: Path):
    import os
    import time

    old = _ckpt(tmp_path, "checkpoint_a")
    new = _ckpt(tmp_path, "checkpoint_b")
    os.utime(old, (time.time() - 100, time.time() - 100))
    (tmp_path / "run" / "checkpoint_empty").mkdir()
    assert policy.find_latest_checkpoint(tmp_path) == new


def test_entrypoint_uses_given_interpreter_and_quotes(tmp_path: Path):
    ep = policy.build_entrypoint(
        python="/opt/my venv/bin/python",
        workdir=tmp_path / "work dir",
        config_path=tmp_path / "job.yaml",
        overrides={"tracking.tags.user": "123", "train.resume_from": "/ck pt/x", "tracking.run_id": "abc"},
        summary_path=tmp_path / "s.json",
    )
    cd, _, cmd = ep.partition(" && exec ")
    assert shlex.split(cd) == ["cd", str(tmp_path / "work dir")]
    argv = shlex.split(cmd)
    assert argv[:5] == ["/opt/my venv/bin/python", "-m", "dlrm_platform.cli", "run", str(tmp_path / "job.yaml")]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    # Values are JSON, so the job's YAML parser keeps "123" a string.
    assert 'tracking.tags.user="123"' in sets
    assert 'train.resume_from="/ck pt/x"' in sets
    assert argv[-2:] == ["--summary-json", str(tmp_path / "s.json")]


def test_override_values_round_trip_through_job_config_parser():
    from dlrm_platform.config import apply_overrides

    overrides = [f"k.{i}={policy._override_value(v)}" for i, v in enumerate(["123", "true", "a: b", "null", 5])]
    out = apply_overrides({}, overrides)
    assert out["k"] == {"0": "123", "1": "true", "2": "a: b", "3": "null", "4": 5}
