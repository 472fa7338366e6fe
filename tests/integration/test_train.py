"""Ray Train + TorchRec end to end on a local cluster, on packed batches built in the test.

Independent of the ingest pipeline: the datasets are ``ray.data.from_arrow``
over ``pack_table`` outputs, one block per batch, with uneven batch sizes and
an odd batch count so that two workers get different numbers of batches.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import pack_table
from dlrm_platform.train.checkpoint import read_progress
from dlrm_platform.train.trainer import TrainingResult, run_training

pytestmark = pytest.mark.integration

COLUMNS = {
    "label": "label",
    "user": {"dense": ["ud0", "ud1"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["id0"], "categorical": ["ic"]},
}
HASH_SIZE = 200
# Odd count, uneven sizes, last one smaller: 2 workers get different batch counts.
TRAIN_BATCH_SIZES = [64, 64, 50, 64, 64, 37, 64, 64, 64, 21, 64, 64, 9]
EVAL_BATCH_SIZES = [64, 64, 33]


@pytest.fixture(scope="module")
def ray_train_cluster():
    """One local cluster for the module."""
    import ray
    from ray.data import DataContext

    if ray.is_initialized():
        ray.shutdown()
    # address="local": always a fresh cluster, even when a `ray start` cluster runs on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING")
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _job(tmp_path: Path, ingest: dict | None = None, **train) -> JobConfig:
    return JobConfig.model_validate({
        "name": "t",
        "data": {"path": str(tmp_path), "columns": COLUMNS},
        "ingest": {"batch_size": 64, "hash_size": HASH_SIZE, "prefetch_batches": 1, **(ingest or {})},
        "train": {
            "num_workers": 1, "cpus_per_worker": 0.5, "epochs": 1, "embedding_dim": 8,
            "bottom_mlp": [16, 8], "top_mlp": [16, 1], "learning_rate": 0.05,
            "embedding_learning_rate": 0.1, "log_every_steps": 3, **train,
        },
    })


def _packed(sizes: list[int], seed: int) -> list[pa.Table]:
    """Packed batches whose label is learnable from the item id (AUC well above 0.5)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        ic = rng.integers(0, HASH_SIZE, n)
        p = 1 / (1 + np.exp(-(np.where(ic % 2 == 0, 2.0, -2.0))))
        hist = [rng.integers(0, HASH_SIZE, rng.integers(0, 6)).tolist() for _ in range(n)]  # some empty
        table = pa.table({
            "label": (rng.random(n) < p).astype(np.float32),
            "ud0": rng.random(n).astype(np.float32), "ud1": rng.random(n).astype(np.float32),
            "id0": rng.random(n).astype(np.float32),
            "uc": rng.integers(0, HASH_SIZE, n), "hist": pa.array(hist, pa.list_(pa.int64())), "ic": ic,
        })
        out.append(pack_table(table, ["ud0", "ud1", "id0"], ["uc", "hist", "ic"], ["hist"], "label"))
    return out


def _datasets(train_sizes=TRAIN_BATCH_SIZES, eval_sizes=EVAL_BATCH_SIZES):
    import ray.data

    return {"train": ray.data.from_arrow(_packed(train_sizes, 0)),
            "eval": ray.data.from_arrow(_packed(eval_sizes, 1))}


def _mlflow_run(tmp_path: Path) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    return uri, client.create_run(exp).info.run_id


def _check_result(result: TrainingResult, epochs: int) -> None:
    assert result.samples == epochs * sum(TRAIN_BATCH_SIZES)  # every sample exactly once per epoch
    assert 0.0 <= result.auc <= 1.0 and math.isfinite(result.logloss)
    assert 0.0 <= result.data_wait_fraction <= 1.0
    assert result.samples_per_s > 0 and result.steps > 0
    assert result.checkpoint_path and (Path(result.checkpoint_path) / ".metadata").is_file()
    progress = read_progress(result.checkpoint_path)
    assert progress.epoch_complete and progress.epoch == epochs - 1


def test_one_worker_trains_every_sample_and_logs_to_mlflow(ray_train_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, run_id = _mlflow_run(tmp_path)
    job = _job(tmp_path, epochs=2)
    result = run_training(job, _datasets(), mlflow_run_id=run_id, tracking_uri=uri,
                          storage_path=str(tmp_path / "ray"))
    _check_result(result, epochs=2)
    assert result.steps == 2 * len(TRAIN_BATCH_SIZES)  # one worker: one step per batch
    assert result.auc > 0.7, result  # learnable labels

    client = MlflowClient(uri)
    losses = client.get_metric_history(run_id, "loss")
    assert len(losses) == 2 * len(TRAIN_BATCH_SIZES)
    assert {m.step for m in losses} == set(range(1, 2 * len(TRAIN_BATCH_SIZES) + 1))
    assert len(client.get_metric_history(run_id, "data_wait_fraction")) == len(losses)
    aucs = client.get_metric_history(run_id, "eval_auc")
    assert [m.step for m in aucs] == [0, 1] and aucs[-1].value == pytest.approx(result.auc)
    assert client.get_metric_history(run_id, "eval_logloss")[-1].value == pytest.approx(result.logloss)


@pytest.mark.parametrize("reads", ["steps", "blocks"])
def test_two_workers_fractional_cpus_uneven_batches(ray_train_cluster, tmp_path, reads):
    job = _job(tmp_path, ingest={"coordinated_reads": reads}, num_workers=2, cpus_per_worker=0.5)
    result = run_training(job, _datasets(), mlflow_run_id=None, tracking_uri=None,
                          storage_path=str(tmp_path / "ray"))
    _check_result(result, epochs=1)
    if reads == "steps":
        # Coordinated: every step gives both workers a full batch (the last one what is left, split evenly).
        assert result.steps == math.ceil(sum(TRAIN_BATCH_SIZES) / (2 * 64))
    else:
        # Lockstep over whole blocks: as many steps as the worker with the most batches, at least half of them.
        assert math.ceil(len(TRAIN_BATCH_SIZES) / 2) <= result.steps < len(TRAIN_BATCH_SIZES)
    assert sorted(p.name for p in Path(result.checkpoint_path).glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_step_limit_and_step_checkpoints_with_two_workers(ray_train_cluster, tmp_path):
    # Stopping an epoch early leaves both splits half-read; the next epoch must start cleanly.
    job = _job(tmp_path, num_workers=2, cpus_per_worker=0.5, epochs=2, max_steps_per_epoch=3,
               checkpoint_every_steps=2)
    result = run_training(job, _datasets(), mlflow_run_id=None, tracking_uri=None,
                          storage_path=str(tmp_path / "ray"))
    assert result.steps == 6
    assert 2 * 3 * 9 <= result.samples <= 2 * 3 * 2 * 64  # 3 lockstep steps/epoch, <= 2 batches each
    assert read_progress(result.checkpoint_path).epoch_complete
    step_checkpoints = sorted(p.name for p in Path(result.checkpoint_path).parent.glob("checkpoint_e*"))
    # Step checkpoints at global steps 2, 4, 6, epoch ends at 3 and 6; num_to_keep=2 keeps the last two.
    assert step_checkpoints == ["checkpoint_e001_s00000006", "checkpoint_e001_s00000006_end"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_bf16_with_read_ahead_learns_on_one_and_two_workers(ray_train_cluster, tmp_path, workers):
    # bf16 autocast (forced: auto keeps these tiny MLPs in fp32), read-ahead of 2 batches, table-wise over gloo.
    job = _job(tmp_path, num_workers=workers, cpus_per_worker=0.5, epochs=2, precision="bf16")
    job = job.model_copy(update={"ingest": job.ingest.model_copy(update={"prefetch_batches": 2})})
    result = run_training(job, _datasets(), mlflow_run_id=None, tracking_uri=None,
                          storage_path=str(tmp_path / "ray"))
    _check_result(result, epochs=2)
    assert result.auc > 0.7, result
    assert result.precision == "bf16"
    assert result.intra_op_threads == 1  # 0.5 CPU each: one thread, never 0, never all cores
