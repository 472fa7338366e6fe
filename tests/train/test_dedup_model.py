"""The dedup-aware DLRM is the plain TorchRec DLRM: same loss, logits and gradients on the same batch and weights."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import pack_table
from dlrm_platform.ingest.dedup_batching import pack_dedup_arrays
from dlrm_platform.train.batches import DedupBatch
from dlrm_platform.train import dedup_model
from dlrm_platform.train.dedup_model import (
    DedupDLRMTrain,
    batch_codec,
    build_dedup_dlrm,
    build_job_model,
    build_sharded_dedup_model,
    dedup_state_dict_from_plain,
    plain_state_dict_from_dedup,
)
from dlrm_platform.train.lockstep import StepBatch
from dlrm_platform.train.loop import Worker
from dlrm_platform.train.model import DLRMTrain, build_dense_optimizer, build_dlrm, build_sharded_model
from dlrm_platform.train.mlflow_logger import NullTracker

HASH = 97

LAYOUTS = {
    # the demo's shape: user and item side both have dense, ids and (user) a history
    "demo": {"user": {"dense": ["ud0", "ud1"], "categorical": ["uc0", "uc1"], "multi_hot": ["hist"]},
             "item": {"dense": ["id0"], "categorical": ["ic0", "ic1"]}},
    # one user feature: no user-user pairs; no user dense
    "thin_user": {"user": {"categorical": ["uc0"]}, "item": {"dense": ["id0", "id1"], "categorical": ["ic0"]}},
    # no item dense: the whole bottom MLP runs per user row; item multi-hot
    "no_item_dense": {"user": {"dense": ["ud0"], "categorical": ["uc0"], "multi_hot": ["hist"]},
                      "item": {"categorical": ["ic0"], "multi_hot": ["itags"]}},
    # no item sparse feature at all
    "no_item_sparse": {"user": {"dense": ["ud0"], "categorical": ["uc0", "uc1"]}, "item": {"dense": ["id0"]}},
    # no user sparse feature: only the user dense columns are deduplicated
    "no_user_sparse": {"user": {"dense": ["ud0", "ud1"]}, "item": {"dense": ["id0"], "categorical": ["ic0"]}},
}
SPLIT = {"expand": float("inf"), "split": 0}  # the two MLP paths of DedupDLRM


def _job(layout: str, tmp_path, **train) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": str(tmp_path), "columns": {"label": "label", "session_key": "sid", **LAYOUTS[layout]}},
        "ingest": {"batch_size": 64, "hash_size": HASH},
        "train": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [12, 6, 1], "seed": 5, **train},
    })


def _batch(job: JobConfig, num_samples: int, num_users: int, seed: int = 0) -> DedupBatch:
    """A dedup batch with sessions of uneven sizes, some empty histories."""
    cols = job.data.columns
    g = torch.Generator().manual_seed(seed)
    inverse = torch.sort(torch.cat([torch.arange(num_users),
                                    torch.randint(0, num_users, (num_samples - num_users,), generator=g)])).values

    def kjt(features, rows):
        lengths, values = [], []
        for f in features:
            multi = f in cols.multi_hot_columns
            n = torch.randint(0, 6, (rows,), generator=g) if multi else torch.ones(rows, dtype=torch.long)
            lengths.append(n)
            values.append(torch.randint(0, HASH, (int(n.sum()),), generator=g))
        return KeyedJaggedTensor.from_lengths_sync(list(features), torch.cat(values), torch.cat(lengths).int()) \
            if features else KeyedJaggedTensor.empty(values_dtype=torch.int64)

    return DedupBatch(
        user_dense=torch.rand(num_users, len(cols.user.dense), generator=g) * 3,
        user_sparse=kjt(cols.user_sparse_features, num_users),
        inverse=inverse,
        item_dense=torch.rand(num_samples, len(cols.item.dense), generator=g) * 3,
        item_sparse=kjt(cols.item_sparse_features, num_samples),
        labels=torch.randint(0, 2, (num_samples,), generator=g).float(),
    )


def _twins(job: JobConfig, mlp_path: str = "split") -> tuple[DLRMTrain, DedupDLRMTrain]:
    torch.manual_seed(0)
    plain = build_dlrm(job, "cpu")
    ded = build_dedup_dlrm(job, "cpu", mlp_split_min_macs=SPLIT[mlp_path])
    missing, unexpected = ded.load_state_dict(dedup_state_dict_from_plain(plain.state_dict(), job.data.columns))
    assert not missing and not unexpected
    return plain, ded


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.is_sparse else t


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("num_users", [1, 9, 40])
@pytest.mark.parametrize("mlp_path", sorted(SPLIT))
def test_same_loss_logits_and_gradients_as_the_plain_dlrm(layout, num_users, mlp_path, tmp_path):
    job = _job(layout, tmp_path)
    plain, ded = _twins(job, mlp_path)
    batch = _batch(job, 40, num_users)
    loss_p, logits_p = plain(batch.expand())
    loss_d, logits_d = ded(batch)
    torch.testing.assert_close(loss_d, loss_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_d, logits_p, rtol=1e-5, atol=1e-5)
    loss_p.backward()
    loss_d.backward()
    grads_p = dedup_state_dict_from_plain({k: p.grad for k, p in plain.named_parameters()}, job.data.columns)
    grads_d = {k: p.grad for k, p in ded.named_parameters()}
    assert grads_p.keys() == grads_d.keys()
    for name, g in grads_d.items():
        torch.testing.assert_close(_dense(g), _dense(grads_p[name]), rtol=1e-4, atol=1e-5, msg=name)


def test_state_dict_is_the_plain_models(tmp_path):
    job = _job("demo", tmp_path)
    plain, ded = _twins(job)
    assert ded.state_dict().keys() == plain.state_dict().keys()  # same modules under the same names
    back = plain_state_dict_from_dedup(ded.state_dict(), job.data.columns)
    assert back.keys() == plain.state_dict().keys()
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(back[k], v)


@pytest.mark.parametrize("mlp_path", sorted(SPLIT))
def test_bf16_autocast_stays_close(mlp_path, tmp_path):
    job = _job("demo", tmp_path)
    plain, ded = _twins(job, mlp_path)
    batch = _batch(job, 64, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_p, _ = plain(batch.expand())
        loss_d, _ = ded(batch)
    torch.testing.assert_close(loss_d.float(), loss_p.float(), rtol=2e-2, atol=0.5)


def _copy_weights(src: torch.nn.Module, dst: torch.nn.Module, mapping) -> None:
    """Copy an unsharded state into a DMP-wrapped model (works for table-wise sharding on one rank)."""
    state = mapping(src.state_dict())
    with torch.no_grad():
        for name, t in dst.state_dict().items():
            value = state[name.removeprefix("module.").removeprefix("_dmp_wrapped_module.module.")] \
                if name not in state else state[name]
            local = t.local_shards()[0].tensor if hasattr(t, "local_shards") else t
            local.copy_(value)


def _full(t) -> torch.Tensor:
    return t.local_shards()[0].tensor if hasattr(t, "local_shards") else t


@pytest.mark.parametrize("mlp_path", sorted(SPLIT))
def test_sharded_with_fused_optimizer_trains_identically(mlp_path, gloo_group, tmp_path):
    """Under DistributedModelParallel with row-wise Adagrad fused into backward: 3 steps, same losses and weights."""
    job = _job("demo", tmp_path)
    cols = job.data.columns
    plain = build_sharded_model(job, torch.device("cpu"))
    ded = build_sharded_dedup_model(job, torch.device("cpu"), mlp_split_min_macs=SPLIT[mlp_path])
    torch.manual_seed(1)
    reference = build_dlrm(job, "cpu")
    _copy_weights(reference, plain, lambda s: s)
    _copy_weights(reference, ded, lambda s: dedup_state_dict_from_plain(s, cols))
    for model, mapping in ((plain, lambda s: s), (ded, lambda s: dedup_state_dict_from_plain(s, cols))):
        want = mapping(reference.state_dict())
        for k, v in model.state_dict().items():
            torch.testing.assert_close(_full(v), want[k], msg=k)  # the copy took
    opt_p, opt_d = build_dense_optimizer(plain, job.train), build_dense_optimizer(ded, job.train)
    for step in range(3):
        batch = _batch(job, 48, 7, seed=step)
        for model, opt, b in ((plain, opt_p, batch.expand()), (ded, opt_d, batch)):
            opt.zero_grad()
            loss, _ = model(b)
            loss.backward()
            opt.step()
            if model is plain:
                loss_p = loss.detach()
            else:
                torch.testing.assert_close(loss.detach(), loss_p, rtol=1e-5, atol=1e-4)
    state_p = dedup_state_dict_from_plain({k: _full(v) for k, v in plain.state_dict().items()}, cols)
    state_d = {k: _full(v) for k, v in ded.state_dict().items()}
    assert state_p.keys() == state_d.keys()
    for k, v in state_d.items():
        torch.testing.assert_close(v, state_p[k], rtol=1e-4, atol=1e-5, msg=k)


def test_job_hooks_pick_the_dedup_model_and_unpack_dedup_batches(gloo_group, tmp_path):
    job = _job("demo", tmp_path)  # session key set, ingest.dedup unset: on
    assert job.dedup_enabled
    model = build_job_model(job, torch.device("cpu"))
    assert isinstance(model.module, DedupDLRMTrain)
    unpack, dummy = batch_codec(job, torch.device("cpu"))
    b = _batch(job, 30, 4)
    packed = pack_dedup_arrays(
        labels=b.labels.numpy(), item_dense=b.item_dense.numpy(), item_lengths=b.item_sparse.lengths().numpy(),
        item_values=b.item_sparse.values().numpy(), user_dense=b.user_dense.numpy(),
        user_lengths=b.user_sparse.lengths().numpy(), user_values=b.user_sparse.values().numpy(),
        inverse=b.inverse.numpy(), num_users=4)
    got = unpack(packed)
    assert got.num_samples == 30 and got.num_users == 4 and got.packed_bytes > 0
    torch.testing.assert_close(got.inverse, b.inverse)
    assert got.sparse_features.stride() == 30 and got.sparse_features.keys() == job.data.columns.sparse_features
    worker = Worker(job, model, build_dense_optimizer(model, job.train), torch.device("cpu"), 0, 1,
                    NullTracker())
    assert worker.train_step(StepBatch(got, 30, 30, 0.0)) > 0
    assert worker.train_step(StepBatch(dummy, 0, 30, 0.0)) == 0.0  # zero-weight lockstep step
    # A plain packed batch under ingest.dedup is a clear error, not a silent mis-read.
    plain_packed = pack_table(pa.table({"label": np.zeros(2, np.float32), "ud0": [1.0, 2.0], "ud1": [1.0, 2.0],
                                        "id0": [1.0, 2.0], "uc0": [1, 2], "uc1": [1, 2],
                                        "hist": pa.array([[1], []], pa.list_(pa.int64())), "ic0": [1, 2],
                                        "ic1": [3, 4]}),
                              ["ud0", "ud1", "id0"], job.data.columns.sparse_features, ["hist"], "label")
    with pytest.raises(ValueError, match="plain packed batch"):
        unpack(plain_packed)
    plain_job = _job("demo", tmp_path).model_copy(update={"ingest": job.ingest.model_copy(update={"dedup": False})})
    assert isinstance(build_job_model(plain_job, torch.device("cpu")).module, DLRMTrain)
    assert dedup_model.batch_codec(plain_job, torch.device("cpu"))[0](plain_packed).labels.numel() == 2


def test_mlp_path_rule_follows_the_work_saved(tmp_path):
    job = _job("demo", tmp_path)
    model = build_dedup_dlrm(job, "cpu").model
    # per duplicated sample: 2 user dense x 16 bottom units + 3 user-user pairs x 12 top units
    assert model.split_saves_macs(64, 8) == (64 - 8) * (2 * 16 + 3 * 12)
    assert model.split_saves_macs(64, 64) == 0
    # bottom 3x16 + 16x8, top (8 + 15 pairs)x12 + 12x6 + 6x1 multiply-adds per sample
    assert model.mlp_macs_per_sample == 3 * 16 + 16 * 8 + 23 * 12 + 12 * 6 + 6
    # saves 3,808 >= 5% of 33,920, but far less work than the split's extra operators cost
    assert 3_808 >= dedup_model.MLP_SPLIT_MIN_SHARE * 33_920 and 3_808 < dedup_model.MLP_SPLIT_MIN_MACS
    assert not model.takes_split(64, 8) and not model.takes_split(64, 64)
    # Criteo-sized MLPs: the user-only slices are ~1% of the MLP work, not worth the split's extra operators
    wide = build_dedup_dlrm(_job("demo", tmp_path, bottom_mlp=[512, 256, 64, 8], top_mlp=[512, 256, 1]), "cpu").model
    saved = wide.split_saves_macs(64, 8)
    assert 0 < saved < dedup_model.MLP_SPLIT_MIN_SHARE * 64 * wide.mlp_macs_per_sample
    assert not wide.takes_split(64, 8)
    # an explicit threshold overrides the share rule (the tests of both paths use it)
    assert build_dedup_dlrm(job, "cpu", mlp_split_min_macs=0).model.takes_split(64, 64)


def test_padded_kjt_layout(tmp_path):
    job = _job("demo", tmp_path)
    b = _batch(job, 10, 3)
    kjt = b.sparse_features
    assert kjt.stride() == 10
    for f in job.data.columns.user_sparse_features:
        lengths = kjt[f].lengths()
        torch.testing.assert_close(lengths[:3], b.user_sparse[f].lengths().int())
        assert int(lengths[3:].sum()) == 0  # B - U empty bags
    for f in job.data.columns.item_sparse_features:
        torch.testing.assert_close(kjt[f].values(), b.item_sparse[f].values())


@pytest.mark.parametrize("shuffled", [False, True])
def test_expand_user_bags_once_puts_each_user_rows_bags_in_its_first_sample_only(shuffled, tmp_path):
    # The benchmarks' bound of what deduplicating the lookups can save: the plain batch with each user
    # row's ids pooled once (its first sample), every other sample's user bags empty.
    job = _job("demo", tmp_path)
    batch = _batch(job, 50, 9, seed=3)
    if shuffled:  # samples not grouped by user: first samples in another order than the user rows
        perm = torch.randperm(50, generator=torch.Generator().manual_seed(1))
        batch = DedupBatch(user_dense=batch.user_dense, user_sparse=batch.user_sparse, inverse=batch.inverse[perm],
                           item_dense=batch.item_dense[perm], item_sparse=batch.item_sparse, labels=batch.labels[perm])
    full, once = batch.expand(), batch.expand_user_bags_once()
    assert torch.equal(once.dense_features, full.dense_features) and torch.equal(once.labels, full.labels)
    inv = batch.inverse.tolist()
    first = {u: inv.index(u) for u in set(inv)}
    got, want = once.sparse_features.to_dict(), full.sparse_features.to_dict()
    for key in job.data.columns.sparse_features:
        rows_once, rows_full = got[key].to_dense(), want[key].to_dense()
        for b, u in enumerate(inv):
            if key in job.data.columns.user_sparse_features and first[u] != b:
                assert rows_once[b].numel() == 0, (key, b)
            else:
                assert torch.equal(rows_once[b], rows_full[b]), (key, b)
    assert sum(len(set(r.tolist())) > 0 for r in got["hist"].to_dense()) <= 9


@pytest.mark.parametrize("mlps, batch, expect_split", [
    (([64, 8], [64, 1]), 1024, False),  # the demo's size: ~12% of the MLP work, but 0.5M MACs (split 4-5% slower)
    (([2048, 8], [2048, 1]), 1024, True),  # a large user-side share in multiply-adds: worth its extra operators
    (([512, 256, 64, 8], [512, 256, 1]), 2048, False),  # Criteo-sized MLPs: ~1% of the work
])
def test_default_rule_takes_the_mlp_split_only_where_it_saves_enough_work(mlps, batch, expect_split, tmp_path):
    job = _job("demo", tmp_path, bottom_mlp=mlps[0], top_mlp=mlps[1])
    model = build_dedup_dlrm(job, "cpu").model
    users = batch // 8
    saves = model.split_saves_macs(batch, users)
    assert model.takes_split(batch, users) is expect_split
    assert (saves >= dedup_model.MLP_SPLIT_MIN_MACS
            and saves >= dedup_model.MLP_SPLIT_MIN_SHARE * batch * model.mlp_macs_per_sample) is expect_split
    assert not model.takes_split(batch, batch)  # one sample per user row: nothing to save


def test_expansion_index_reads_user_rows_for_user_features_and_own_rows_for_items(tmp_path):
    from dlrm_platform.train.batches import embedding_expansion_index

    inverse = torch.tensor([0, 0, 1, 0, 2])
    index = embedding_expansion_index(inverse, num_user_features=2, num_item_features=1).view(5, 3)
    # rows of the pooled embeddings [B * F, E]: sample b, feature f at b * F + f
    assert index.tolist() == [[0, 1, 2], [0, 1, 5], [3, 4, 8], [0, 1, 11], [6, 7, 14]]
    # the model computes it when it is not given: the same logits
    job = _job("demo", tmp_path)
    _, ded = _twins(job, "expand")
    batch = _batch(job, 40, 6)
    m = ded.model
    given = m(batch.user_dense, batch.inverse, batch.item_dense, batch.sparse_features, batch.expansion_index)
    computed = m(batch.user_dense, batch.inverse, batch.item_dense, batch.sparse_features)
    torch.testing.assert_close(given, computed)
