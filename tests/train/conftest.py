"""Fixtures for the training unit tests: a single-process gloo group and a tiny job."""

from __future__ import annotations

import socket

import numpy as np
import pyarrow as pa
import pytest
import torch.distributed as dist

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import pack_table

COLUMNS = {
    "label": "label",
    "user": {"dense": ["ud0", "ud1"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["id0"], "categorical": ["ic"]},
}
HASH_SIZE = 100


@pytest.fixture(scope="module")
def gloo_group():
    """A world of one process (what TorchTrainer creates, minus Ray)."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def tiny_job(tmp_path):
    """``tiny_job(**train_overrides) -> JobConfig``: 3 small tables, embedding dim 8."""
    return lambda **train: _tiny_job(tmp_path, **train)


@pytest.fixture
def packed_batch():
    """``packed_batch(n, seed=0) -> pa.Table``: one packed batch with a learnable label."""
    return _packed_batch


def _tiny_job(tmp_path, **train) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": str(tmp_path), "columns": COLUMNS},
        "ingest": {"batch_size": 32, "hash_size": HASH_SIZE, "hash_sizes": {"ic": 50}},
        "train": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1], "seed": 3, **train},
    })


def _packed_batch(n: int, seed: int = 0) -> pa.Table:
    """One packed batch whose label is a function of the item id (learnable)."""
    rng = np.random.default_rng(seed)
    ic = rng.integers(0, 50, n)
    table = pa.table({
        "label": (ic % 2).astype(np.float32),
        "ud0": rng.random(n).astype(np.float32), "ud1": rng.random(n).astype(np.float32),
        "id0": rng.random(n).astype(np.float32),
        "uc": rng.integers(0, HASH_SIZE, n),
        "hist": pa.array([rng.integers(0, HASH_SIZE, rng.integers(0, 5)).tolist() for _ in range(n)],
                         pa.list_(pa.int64())),
        "ic": ic,
    })
    return pack_table(table, ["ud0", "ud1", "id0"], ["uc", "hist", "ic"], ["hist"], "label")
