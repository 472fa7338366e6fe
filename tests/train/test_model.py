"""The sharded DLRM on a one-process gloo group: build, plan, one step, learning, lockstep pieces."""

from __future__ import annotations

import math

import pytest
import torch

from dlrm_platform.config import TrainConfig
from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.train.lockstep import StepBatch, lockstep_batches
from dlrm_platform.train.loop import Worker
from dlrm_platform.train.model import (
    CPU_SHARDING_1_WORKER,
    build_dense_optimizer,
    build_dlrm,
    build_sharded_model,
    dummy_batch,
    embedding_bag_configs,
    resolve_sharding,
    table_name,
)
from dlrm_platform.train.mlflow_logger import NullTracker

SPARSE = ["uc", "hist", "ic"]
EBC = "model.sparse_arch.embedding_bag_collection"


@pytest.fixture
def make_batch(packed_batch):
    return lambda n, seed=0: unpack_batch(packed_batch(n, seed), SPARSE, 3)


def _worker(job, model=None) -> Worker:
    model = model or build_sharded_model(job, torch.device("cpu"))
    return Worker(job, model, build_dense_optimizer(model, job.train), torch.device("cpu"), 0, 1, NullTracker())


def test_one_table_per_feature_sized_by_ingest(tiny_job) -> None:
    configs = embedding_bag_configs(tiny_job())
    assert [(c.name, c.feature_names, c.num_embeddings, c.embedding_dim) for c in configs] == [
        ("t_uc", ["uc"], 100, 8), ("t_hist", ["hist"], 100, 8), ("t_ic", ["ic"], 50, 8)]


def test_build_dlrm_is_on_meta_by_default(tiny_job) -> None:
    model = build_dlrm(tiny_job())
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize(
    ("sharding", "world", "device", "expected"),
    [
        ("auto", 1, "cpu", CPU_SHARDING_1_WORKER),
        ("auto", 2, "cpu", "table_wise"),
        ("auto", 4, "cuda", None),  # the planner's choice
        ("column_wise", 2, "cpu", "column_wise"),
        ("data_parallel", 1, "cpu", "data_parallel"),
    ],
)
def test_resolve_sharding(sharding, world, device, expected) -> None:
    assert resolve_sharding(TrainConfig(sharding=sharding), world, device) == expected


def test_sharded_model_uses_fused_rowwise_adagrad(tiny_job, gloo_group) -> None:
    job = tiny_job()
    model = build_sharded_model(job, torch.device("cpu"))
    plan = model.plan.plan[EBC]
    assert {(p.sharding_type, p.compute_kernel) for p in plan.values()} == {("table_wise", "fused")}
    state = model.fused_optimizer.state_dict()["state"]
    assert {k.split(".")[-2] for k in state} == {table_name(f) for f in SPARSE}
    assert all(list(v) == [f"{k.split('.')[-2]}.momentum1"] for k, v in state.items())
    dense = build_dense_optimizer(model, job.train)
    assert dense.params and not any("embedding_bags" in name for name in dense.params)


def test_forward_backward_one_batch(tiny_job, make_batch, gloo_group) -> None:
    job = tiny_job()
    model = build_sharded_model(job, torch.device("cpu"))
    batch = make_batch(32)
    loss_sum, logits = model(batch)
    assert logits.shape == (32,) and not logits.requires_grad
    assert loss_sum.dim() == 0 and math.isfinite(float(loss_sum.detach()))
    (loss_sum / 32).backward()
    dense_grads = [p.grad for name, p in model.named_parameters() if "embedding_bags" not in name]
    assert all(g is not None and torch.isfinite(g).all() for g in dense_grads)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "sgd"])
def test_loss_decreases_on_a_learnable_batch(tiny_job, make_batch, gloo_group, optimizer) -> None:
    job = tiny_job(dense_optimizer=optimizer, learning_rate=0.05 if optimizer != "sgd" else 0.5)
    worker = _worker(job)
    batch = make_batch(64, seed=1)
    step = StepBatch(batch, 64, 64, 0.0)
    losses = [worker.train_step(step) / 64 for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_zero_weight_step_changes_nothing(tiny_job, make_batch, gloo_group) -> None:
    job = tiny_job(dense_optimizer="adagrad")
    worker = _worker(job)
    worker.train_step(StepBatch(make_batch(16), 16, 16, 0.0))  # optimizer state exists now
    before = _local_state(worker.model)
    dummy = dummy_batch(SPARSE, 3)
    assert worker.train_step(StepBatch(dummy, 0, 16, 0.0)) == 0.0
    after = _local_state(worker.model)
    assert before.keys() == after.keys() and len(before) == 11
    assert all(torch.equal(before[k], after[k]) for k in before)


def _local_state(model) -> dict[str, torch.Tensor]:
    """Parameters as plain tensors (this rank's shard of the sharded tables)."""
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "local_shards"):
            v = v.local_shards()[0].tensor
        out[k] = v.detach().clone()
    return out


class _FakeShard:
    """Stands in for a Ray DataIterator over packed batches."""

    def __init__(self, tables) -> None:
        self.tables = tables

    def iter_batches(self, *, batch_size: int, batch_format: str, prefetch_batches: int):
        assert (batch_size, batch_format) == (1, "pyarrow")
        yield from self.tables


def test_lockstep_batches_single_worker(tiny_job, packed_batch, gloo_group) -> None:
    job = tiny_job()
    shard = _FakeShard([packed_batch(n, seed=i) for i, n in enumerate([8, 5, 3])])
    steps = list(lockstep_batches(shard, job, torch.device("cpu")))
    assert [(s.num_samples, s.global_samples) for s in steps] == [(8, 8), (5, 5), (3, 3)]
    assert all(s.wait_s >= 0 for s in steps)
    assert len(list(lockstep_batches(shard, job, torch.device("cpu"), max_steps=2))) == 2
    assert list(lockstep_batches(_FakeShard([]), job, torch.device("cpu"))) == []
