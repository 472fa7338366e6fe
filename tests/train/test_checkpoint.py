"""DCP checkpoints of the sharded model and both optimizers, on a one-process gloo group."""

from __future__ import annotations

import json

import pytest
import torch

from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.train.checkpoint import (
    PROGRESS_FILE,
    TrainProgress,
    load_checkpoint,
    read_progress,
    save_checkpoint,
)
from dlrm_platform.train.lockstep import StepBatch
from dlrm_platform.train.loop import Worker
from dlrm_platform.train.model import build_dense_optimizer, build_sharded_model
from dlrm_platform.train.mlflow_logger import NullTracker


def _worker(job) -> Worker:
    model = build_sharded_model(job, torch.device("cpu"))
    return Worker(job, model, build_dense_optimizer(model, job.train), torch.device("cpu"), 0, 1, NullTracker())


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_restore_continues_exactly(tiny_job, packed_batch, gloo_group, tmp_path, optimizer) -> None:
    job = tiny_job(dense_optimizer=optimizer)
    batches = [StepBatch(unpack_batch(packed_batch(24, seed=s), ["uc", "hist", "ic"], 3), 24, 24, 0.0)
               for s in range(4)]
    trained = _worker(job)
    for b in batches[:2]:
        trained.train_step(b)
    progress = TrainProgress(epoch=3, epoch_complete=True, global_step=2, samples=48, auc=0.7)
    save_checkpoint(tmp_path / "ck", trained.model, trained.dense_optimizer, progress)
    assert json.loads((tmp_path / "ck" / PROGRESS_FILE).read_text())["samples"] == 48

    # A fresh model (different init seed), restored, must take the very same next steps
    # (same weights, same Adagrad accumulators / Adam moments in both optimizers).
    restored = _worker(tiny_job(dense_optimizer=optimizer, seed=99))
    assert load_checkpoint(tmp_path / "ck", restored.model, restored.dense_optimizer) == progress
    for b in batches[2:]:
        assert restored.train_step(b) == pytest.approx(trained.train_step(b), rel=1e-6)


def test_next_epoch_replays_an_unfinished_epoch() -> None:
    assert TrainProgress(epoch=2, epoch_complete=True).next_epoch == 3
    assert TrainProgress(epoch=2, epoch_complete=False, step_in_epoch=5).next_epoch == 2
    assert TrainProgress().next_epoch == 0


def test_progress_written_under_the_old_names_reads_the_same(tmp_path) -> None:
    """Checkpoints from before TrainProgress took TrainReport's names (eval_auc, eval_logloss) still restore."""
    old = {"epoch": 1, "epoch_complete": True, "step_in_epoch": 4, "samples_in_epoch": 96, "global_step": 8,
           "samples": 192, "train_time_s": 1.5, "wait_s": 0.2, "compute_s": 1.1, "eval_auc": 0.71,
           "eval_logloss": 0.52, "trained_in_epoch": ["a", "b"]}
    (tmp_path / PROGRESS_FILE).write_text(json.dumps(old))
    progress = read_progress(tmp_path)
    assert progress.auc == 0.71 and progress.logloss == 0.52
    assert progress == TrainProgress(epoch=1, epoch_complete=True, step_in_epoch=4, samples_in_epoch=96,
                                     global_step=8, samples=192, train_time_s=1.5, wait_s=0.2, compute_s=1.1,
                                     auc=0.71, logloss=0.52, trained_in_epoch=["a", "b"])
