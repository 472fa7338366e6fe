"""Checkpoint integrity through real Ray Train: two workers' manifests merged into each checkpoint by
Ray, and a job resuming from a truncated checkpoint restores the previous intact one instead."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_train import TRAIN_BATCH_SIZES, _datasets, _job

from dlrm_platform.train.checkpoint import read_progress, verify_checkpoint
from dlrm_platform.train.trainer import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_truncated_checkpoint_falls_back_to_the_previous_one(ray_cluster, tmp_path: Path) -> None:
    job = _job(tmp_path, epochs=2, num_workers=2, cpus_per_worker=0.5)
    first = run_training(job, _datasets(), mlflow_run_id=None, tracking_uri=None,
                         storage_path=str(tmp_path / "ray"), run_name="first")
    run_dir = Path(first.checkpoint_path).parent
    kept = sorted(p.name for p in run_dir.glob("checkpoint_e*"))
    # Two workers read in coordinated steps (ingest.coordinated_reads auto): 2 x 64 samples a step.
    steps = math.ceil(sum(TRAIN_BATCH_SIZES) / (2 * 64))
    assert kept == [f"checkpoint_e000_s{steps:08d}_end", f"checkpoint_e001_s{2 * steps:08d}_end"], kept
    for name in kept:  # both ranks' manifests, merged by Ray into one directory, and every file intact
        assert {p.name for p in (run_dir / name).glob("manifest-rank*.json")} == {"manifest-rank0.json",
                                                                               "manifest-rank1.json"}
        verify_checkpoint(run_dir / name)

    newest = run_dir / kept[-1]
    shard = newest / "__1_0.distcp"  # rank 1's shards
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])

    resumed_job = _job(tmp_path, epochs=3, num_workers=2, cpus_per_worker=0.5, resume_from=str(newest))
    result = run_training(resumed_job, _datasets(), mlflow_run_id=None, tracking_uri=None,
                          storage_path=str(tmp_path / "ray"), run_name="second")
    # Restored from checkpoint_e000 (epoch 0 done), not the damaged epoch-1 one: epochs 1 and 2 trained.
    assert result.start_epoch == 1
    assert result.samples == 3 * sum(TRAIN_BATCH_SIZES)  # epoch 0 from the checkpoint + 2 trained now
    assert read_progress(result.checkpoint_path).epoch == 2
