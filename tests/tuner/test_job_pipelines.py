"""`dlrm-platform analyze CONFIG` profiles the pipeline `dlrm-platform run` builds (no Ray: the builder is stubbed)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray

import dlrm_platform.config as config_module
from dlrm_platform import ray_cluster
from dlrm_platform.config import load_job_config
from dlrm_platform.ingest import source
from dlrm_platform.tuner import analysis, job_pipelines

REPO = Path(__file__).resolve().parents[2]


class Built(Exception):
    """Raised by the stubbed builder: the pipeline would have been built here."""


@pytest.mark.parametrize("overrides", [[], ["ingest.fusion=false"], ["ingest.dedup=false"]])
def test_analyze_builds_what_run_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, overrides: list[str]) -> None:
    config = tmp_path / "job.yaml"
    config.write_text((REPO / "configs" / "demo.yaml").read_text())
    built: dict = {}

    def build(job, train_files, eval_files, quarantine_dir, *, fused_op=None):
        built.update(job=job, fused_op=fused_op, files=(train_files, eval_files))
        raise Built

    monkeypatch.setattr(job_pipelines, "build_job_datasets", build)
    monkeypatch.setattr(job_pipelines, "warm_data_workers", lambda count, **kw: [])
    monkeypatch.setattr(job_pipelines, "train_read_tasks", lambda job, train, eval_: 5)  # 5 shard pairs or files
    monkeypatch.setattr(ray_cluster, "ray_session", lambda cfg, **kw: contextlib.nullcontext())
    monkeypatch.setattr(source, "validate_dataset", lambda data: SimpleNamespace(train=["t.parquet"], eval=["e.parquet"]))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(config_module, "load_job_config", lambda path, ov=None: load_job_config(path, overrides))

    with pytest.raises(Built):
        analysis.run_job_config(config, seconds=1.0)

    job = load_job_config(config, overrides)
    data_cpus = 4.0 - job.train.num_workers * job.train.cpus_per_worker
    run = job_pipelines.plan_job_pipelines(job, data_cpus, job.tuner, read_tasks=5)
    assert built["job"].dedup_enabled == job.dedup_enabled == (overrides != ["ingest.dedup=false"])  # demo: dedup
    assert built["fused_op"] == run.fused_op  # fused: one wave of the 5 read tasks on 3 data CPUs, as run sizes it
    if run.fused_op is not None:
        assert (run.fused_op.concurrency, run.fused_op.num_cpus) == (5, 0.6)
    assert built["files"] == (["t.parquet"], ["e.parquet"])


def test_run_fuses_a_steering_policy_that_its_budget_leaves_no_choice(caplog: pytest.LogCaptureFixture) -> None:
    # The demo's five operators of 0.2 CPU on 1 data CPU: one task each and no second one anywhere
    job = load_job_config(REPO / "configs" / "demo.yaml", ["tuner.policy=rl"])
    with caplog.at_level("INFO", logger="dlrm_platform.job"):
        plan = job_pipelines.plan_job_pipelines(job, 1.0, job.tuner)
    assert plan.fused and [op.name for op in plan.operators] == ["read"]
    assert "nothing to steer" in caplog.text and "ingest.fusion: off" in caplog.text
    # more data CPUs, or an elastic budget that may grow to them: split, every operator the policy's to steer
    assert not job_pipelines.plan_job_pipelines(job, 3.0, job.tuner).fused
    assert not job_pipelines.plan_job_pipelines(job, 1.0, job.tuner, sized_for=4.0).fused
    # and an explicit ingest.fusion: off splits anyway
    off = load_job_config(REPO / "configs" / "demo.yaml", ["tuner.policy=rl", "ingest.fusion=off"])
    assert not job_pipelines.plan_job_pipelines(off, 1.0, off.tuner).fused


def test_a_split_plan_never_counts_the_read_tasks() -> None:
    job = load_job_config(REPO / "configs" / "demo.yaml", ["tuner.policy=rl"])

    def count() -> int:
        raise AssertionError("counted the read tasks of a split pipeline")

    assert not job_pipelines.plan_job_pipelines(job, 3.0, job.tuner, read_tasks=count).fused
    fused = job_pipelines.plan_job_pipelines(job, 1.0, job.tuner, read_tasks=lambda: 3)
    assert (fused.fused_op.concurrency, fused.fused_op.num_cpus) == (3, 0.333)
