"""The fused operator delivers exactly what the split operators deliver, in blocks of the planned size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_platform.config import OPERATOR_NAMES, DatasetSchema, IngestConfig, TunerConfig
from dlrm_platform.ingest import dedup_convert, dedup_sessions, dedup_storage, fused, transforms
from dlrm_platform.ingest.transforms import TransformSpec

COLUMNS = DatasetSchema.model_validate({
    "label": "label",
    "session_key": "sid",
    "user": {"dense": ["ud"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["idn"], "categorical": ["ic"]},
})


def _flat(n: int, seed: int = 0, bad_labels: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    sid = np.sort(rng.integers(0, n // 5 + 1, n))
    label = (rng.random(n) < 0.3).astype(np.float64)
    label[:bad_labels] = 7.0  # quarantined by parse
    user = {s: (rng.integers(0, 50), [int(x) for x in rng.integers(0, 99, rng.integers(0, 4))], rng.random())
            for s in np.unique(sid)}
    return pa.table({
        "label": label,
        "sid": sid,
        "ud": [user[s][2] for s in sid],
        "uc": [user[s][0] for s in sid],
        "hist": pa.array([user[s][1] for s in sid], pa.list_(pa.int64())),
        "idn": rng.random(n),
        "ic": rng.integers(0, 1000, n),
    })


def _spec(tmp_path: Path) -> TransformSpec:
    return TransformSpec.from_config(COLUMNS, IngestConfig(hash_size=97), tmp_path / "q")


def _samples(packed: list[pa.Table]) -> list[tuple]:
    """Every sample of packed plain batches as (label, dense..., ids per feature), sorted."""
    out = []
    for t in packed:
        for r in range(t.num_rows):
            b = int(t.column("num_samples")[r].as_py())
            labels = np.asarray(t.column("labels")[r].values)
            dense = np.asarray(t.column("dense")[r].values).reshape(b, -1)
            lengths = np.asarray(t.column("lengths")[r].values).reshape(-1, b)
            values = np.asarray(t.column("values")[r].values)
            offs = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
            for i in range(b):
                ids = tuple(tuple(values[offs[f * b + i]:offs[f * b + i + 1]]) for f in range(lengths.shape[0]))
                out.append((float(labels[i]), *np.round(dense[i], 5), ids))
    return sorted(out)


def _dedup_samples(packed: list[pa.Table]) -> list[tuple]:
    """Every sample of packed IKJT batches, user side expanded: (label, user dense, item dense, ids)."""
    out = []
    for t in packed:
        for r in range(t.num_rows):
            row = {c: np.asarray(t.column(c)[r].values) for c in ("labels", "dense", "user_dense", "inverse",
                                                                   "lengths", "values", "user_lengths", "user_values")}
            b, u = len(row["labels"]), int(t.column("num_users")[r].as_py())
            ul = row["user_lengths"].reshape(-1, u)
            uoffs = np.concatenate([[0], np.cumsum(ul.reshape(-1))])
            il = row["lengths"].reshape(-1, b)
            ioffs = np.concatenate([[0], np.cumsum(il.reshape(-1))])
            for i in range(b):
                j = row["inverse"][i]
                uids = tuple(tuple(row["user_values"][uoffs[f * u + j]:uoffs[f * u + j + 1]]) for f in range(ul.shape[0]))
                iids = tuple(tuple(row["values"][ioffs[f * b + i]:ioffs[f * b + i + 1]]) for f in range(il.shape[0]))
                out.append((float(row["labels"][i]), *np.round(row["user_dense"].reshape(u, -1)[j], 5),
                            *np.round(row["dense"].reshape(b, -1)[i], 5), uids, iids))
    return sorted(out)


def test_fused_flat_reader_equals_the_split_operators_and_cuts_blocks(tmp_path):
    table = _flat(3000, bad_labels=3)
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path, row_group_size=700)
    spec = _spec(tmp_path)
    blocks = list(fused._FlatReadTask(str(path), 0, pq.ParquetFile(path).metadata.num_row_groups, spec, 64, 512)())
    ref = TransformSpec.from_config(COLUMNS, IngestConfig(hash_size=97), tmp_path / "q-split")
    split = transforms.sparse_transform(transforms.dense_transform(transforms.parse(table, ref), ref), ref)
    expected = [transforms.batch(split.slice(lo, 64), ref) for lo in range(0, split.num_rows, 64)]
    assert _samples(blocks) == _samples(expected)
    assert len(blocks) == 6  # 3000 rows in blocks of 512
    sizes = [n for b in blocks for n in b.column("num_samples").to_pylist()]
    assert sum(sizes) == 2997 and max(sizes) == 64
    assert transforms.count_quarantined(tmp_path / "q") == {"label missing or not 0/1": 3}


def test_fused_session_reader_equals_the_split_operators_with_near_full_batches(tmp_path):
    table = _flat(4000, seed=1)
    users, samples, _ = dedup_convert.convert_table(table, COLUMNS)
    u, s = dedup_storage.write_shard(users, samples, tmp_path, "part-00000", "sid")
    spec = _spec(tmp_path)
    blocks = list(fused._SessionReadTask(str(u), str(s), spec, 128, 1024)())
    whole = dedup_sessions.read_session_shard(str(u), str(s), COLUMNS)
    split = fused.preprocess_sessions(whole, spec, 128)
    assert _dedup_samples(blocks) == _dedup_samples([split])
    assert len(blocks) >= 4
    for block in blocks[:-1]:  # the shard's last block holds what is left
        sizes = block.column("num_samples").to_pylist()
        assert sum(sizes) <= 1024
        # whole sessions up to the block size: the last batch is short by less than one session
        assert all(n == 128 for n in sizes[:-1]) and sizes[-1] > 128 - 20


def test_session_reader_batches_slices_of_the_shards_order_as_the_split_batch_orders_it(tmp_path):
    # The read task transforms the whole shard once and batches consecutive slices of its session order:
    # with a block that holds the whole shard, its batches are the split pipeline's, row for row and in
    # order; cut smaller, the same sessions come in the same order; bad labels are quarantined once.
    table = _flat(3000, seed=2, bad_labels=4)
    users, samples, _ = dedup_convert.convert_table(table, COLUMNS)
    u, s = dedup_storage.write_shard(users, samples, tmp_path, "part-00000", "sid")
    whole = dedup_sessions.read_session_shard(str(u), str(s), COLUMNS)
    expected = fused.preprocess_sessions(whole, _spec(tmp_path / "ref"), 128)
    one = list(fused._SessionReadTask(str(u), str(s), _spec(tmp_path / "one"), 128, 1 << 20)())
    assert len(one) == 1 and one[0].equals(expected)
    cut = list(fused._SessionReadTask(str(u), str(s), _spec(tmp_path), 128, 512)())
    assert len(cut) > 4
    assert _dedup_samples(cut) == _dedup_samples([expected])
    first_user = [np.asarray(t.column("user_dense")[0].values)[0] for t in (expected, cut[0])]
    assert first_user[0] == first_user[1]  # the order's first session opens the first block
    assert transforms.count_quarantined(tmp_path / "q") == {"label missing or not 0/1": 4}
    assert transforms.count_quarantined(tmp_path / "one" / "q") == {"label missing or not 0/1": 4}


def test_dedup_batch_takes_only_the_sessions_named_in_the_order_given(tmp_path):
    from dlrm_platform.ingest import dedup_operators as ops

    spec = _spec(tmp_path)
    table = _flat(1200, seed=3)
    users, samples, _ = dedup_convert.convert_table(table, COLUMNS)
    block = ops.sparse_transform(ops.dense_transform(ops.parse(_session_block(users, samples, tmp_path), spec),
                                                     spec), spec)
    order = ops.batch_order(block, spec)
    assert sorted(order.tolist()) == list(range(block.num_rows))  # every (non-empty) session once
    assert ops.batch(block, spec, 64, order).equals(ops.batch(block, spec, 64))
    half = order[: len(order) // 2]
    counts = np.diff(dedup_sessions.samples_offsets(block))
    part = ops.batch(block, spec, 64, half)
    assert sum(part.column("num_samples").to_pylist()) == int(counts[half].sum())
    assert ops.batch(block, spec, 64, half[:0]).num_rows == 0


def _session_block(users: pa.Table, samples: pa.Table, tmp_path: Path) -> pa.Table:
    u, s = dedup_storage.write_shard(users, samples, tmp_path, "part-x", "sid")
    return dedup_sessions.read_session_shard(str(u), str(s), COLUMNS)


def test_block_plan_takes_at_least_eight_batches_and_2_mib_capped_by_8_mib():
    ingest = IngestConfig(batch_size=1024)
    assert fused.plan_blocks(ingest).rows == 8192  # not measured: 8 batches
    assert fused.plan_blocks(ingest, bytes_per_sample=128).rows == 16384  # 8 batches are 1 MiB: 2 MiB
    assert fused.plan_blocks(ingest, bytes_per_sample=100).rows == 21504  # whole batches reaching 2 MiB
    assert fused.plan_blocks(ingest, bytes_per_sample=512).rows == 8192  # 8 batches are 4 MiB already
    assert fused.plan_blocks(ingest, bytes_per_sample=4096).rows == 2048  # 8 MiB cap
    assert fused.plan_blocks(ingest, bytes_per_sample=1 << 24).rows == 1024  # never below one batch
    assert fused.plan_blocks(IngestConfig(block_rows=300)).describe() == "300 samples per block (config)"


@pytest.mark.parametrize(("fusion", "policy", "expected"), [
    ("auto", "static", True), ("auto", "auto", True), ("auto", "rl", False), ("auto", "ray_default", False),
    ("on", "rl", True), ("off", "static", False),
])
def test_fusion_is_on_unless_a_policy_steers_operators_one_by_one(fusion, policy, expected):
    assert fused.fusion_enabled(IngestConfig(fusion=fusion), TunerConfig(policy=policy)) is expected
    # a budget with room for a second task of some operator leaves the steering policy its choices
    assert fused.fusion_enabled(IngestConfig(fusion=fusion), TunerConfig(policy=policy), cpu_budget=8.0) is expected


@pytest.mark.parametrize(("budget", "fused_"), [(0.5, True), (1.0, True), (1.19, True), (1.2, False), (4.0, False)])
def test_auto_fuses_a_steering_policy_when_the_budget_holds_one_task_per_operator(budget, fused_):
    # 5 operators of 0.2 CPU: 1.0 CPU runs one task of each; a second task of any needs 1.2
    ingest = IngestConfig(operators={name: {"concurrency": 1, "num_cpus": 0.2} for name in OPERATOR_NAMES})
    assert fused.split_leaves_no_choice(ingest, budget) is fused_
    for policy in ("rl", "plumber", "hill_climb", "ray_default"):
        assert fused.fusion_enabled(ingest, TunerConfig(policy=policy), cpu_budget=budget) is fused_
    # an explicit choice stands
    assert not fused.fusion_enabled(ingest.model_copy(update={"fusion": "off"}), TunerConfig(policy="rl"), budget)
    # uneven operators: the budget must hold one of each plus the cheapest one's second task
    ingest = IngestConfig(operators={**{name: {"num_cpus": 0.5} for name in OPERATOR_NAMES}, "parse": {"num_cpus": 1.0}})
    assert fused.split_leaves_no_choice(ingest, 3.4) and not fused.split_leaves_no_choice(ingest, 3.5)


def test_read_tasks_transform_growing_chunks_and_cut_them_into_blocks(tmp_path, monkeypatch):
    # The first transform call holds one block's samples (the first block comes as early as block by
    # block), later ones 2, 4, then 8 blocks' (fewer per-call costs); every yielded block <= block_rows.
    table = _flat(9000)
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    calls: list[int] = []
    real = fused.preprocess_flat

    def recording(t, spec, batch_size):
        calls.append(t.num_rows)
        return real(t, spec, batch_size)

    monkeypatch.setattr(fused, "preprocess_flat", recording)
    blocks = list(fused._FlatReadTask(str(path), 0, 1, _spec(tmp_path), 64, 256)())
    assert calls == [256, 512, 1024, 2048, 2048, 2048, 1064]
    sizes = [sum(b.column("num_samples").to_pylist()) for b in blocks]
    assert sum(sizes) == 9000 and max(sizes) == 256
    assert len(blocks) == -(-9000 // 256)  # chunks are whole blocks: only the last block is short
    ref = _spec(tmp_path / "ref")
    assert _samples(blocks) == _samples([fused.preprocess_flat(table, ref, 64)])


def test_yielded_blocks_are_compact_one_chunk_per_column_from_offset_zero(tmp_path):
    # Ray's Arrow serializer walks each chunk of a sliced table in Python (6 ms per demo block to put,
    # 1.4 ms to get, against 2.4 and 0.5 compact): every block a read task yields is one chunk per
    # column whose arrays start at offset 0 and hold only the block's own values.
    table = _flat(3000)
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    blocks = list(fused._FlatReadTask(str(path), 0, 1, _spec(tmp_path), 64, 512)())
    assert len(blocks) > 2
    for block in blocks:
        for name in block.column_names:
            column = block.column(name)
            assert column.num_chunks == 1, name
            assert column.chunk(0).offset == 0, name
        labels = block.column("labels").chunk(0)
        assert len(labels.values) == sum(block.column("num_samples").to_pylist())  # not the whole chunk's
    ref = _spec(tmp_path / "ref")
    assert _samples(blocks) == _samples([fused.preprocess_flat(table, ref, 64)])


def test_read_tasks_pickle_by_reference_and_read_the_same_after_a_round_trip(tmp_path):
    # Ray Data pickles every read task at the start of every execution (each epoch's pass), on the critical
    # path before the first task runs. A closure goes by value (its code and globals walked by cloudpickle);
    # the read tasks are module-level callables, which the stdlib pickle handles only by reference.
    import pickle

    table = _flat(1500, seed=3)
    flat_path = tmp_path / "part-0.parquet"
    pq.write_table(table, flat_path, row_group_size=500)
    users, samples, _ = dedup_convert.convert_table(table, COLUMNS)
    u, s = dedup_storage.write_shard(users, samples, tmp_path, "part-00000", "sid")
    spec = _spec(tmp_path)
    flat = fused.FusedParquetDatasource([flat_path], spec, 64, 256).get_read_tasks(1)
    sessions = fused.FusedSessionDatasource([(u, s)], spec, 64, 256).get_read_tasks(1)
    shards = dedup_sessions.SessionParquetDatasource([(u, s)], COLUMNS, None).get_read_tasks(1)  # split pipeline
    for task in flat + sessions + shards:
        data = pickle.dumps(task.read_fn)
        assert len(data) < 4096, len(data)  # fields only: no code objects
        again = pickle.loads(data)
        assert all(b.equals(a) for b, a in zip(again(), task.read_fn(), strict=True))
