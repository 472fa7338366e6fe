"""Session-dedup storage, operators and IKJT batches on crafted tables (no Ray)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dlrm_platform.config import DatasetSchema, IngestConfig
from dlrm_platform.ingest import dedup_convert, dedup_operators, dedup_sessions, dedup_storage, transforms
from dlrm_platform.ingest.batching import PACKED_SCHEMA
from dlrm_platform.ingest.dedup_batching import DEDUP_PACKED_SCHEMA, is_dedup_packed, packed_batch_stats
from dlrm_platform.ingest.transforms import TransformSpec
from dlrm_platform.train.batches import DedupBatch, dummy_dedup_batch, unpack_batch, unpack_dedup_batch

COLUMNS = DatasetSchema.model_validate({
    "label": "label",
    "session_key": "sid",
    "user": {"dense": ["ud"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["idn"], "categorical": ["ic"]},
})
USER_F, ITEM_F = COLUMNS.user_sparse_features, COLUMNS.item_sparse_features


def _flat(num_sessions=40, seed=0, max_len=30, missing_keys=0, bad_labels=0):
    """Flat rows in random order; ``ic`` is a unique id per sample so deliveries can be counted."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, num_sessions)
    n = int(lengths.sum())
    sess = np.repeat(np.arange(num_sessions), lengths)
    ud = rng.random(num_sessions).astype(np.float32)
    ud[::7] = np.nan  # some missing user dense values
    uc = rng.integers(0, 10**9, num_sessions)
    hist = [rng.integers(0, 10**6, rng.integers(0, 12)).tolist() for _ in range(num_sessions)]
    labels = rng.integers(0, 2, n).astype(object)
    for i in range(bad_labels):
        labels[i * 3] = None if i % 2 else 5
    table = pa.table({
        "sid": pa.array(sess + 100, pa.int64()),
        "label": pa.array(list(labels), pa.int64()),
        "ud": pa.array(ud[sess], pa.float32(), from_pandas=True),
        "uc": pa.array(uc[sess]),
        "hist": pa.array([hist[s] for s in sess], pa.list_(pa.int64())),
        "idn": pa.array(rng.random(n).astype(np.float32)),
        "ic": pa.array(np.arange(n) * 7 + 1),
    })
    if missing_keys:
        keys = table.column("sid").to_pylist()
        for i in range(missing_keys):
            keys[-1 - 2 * i] = None
        table = table.set_column(0, "sid", pa.array(keys, pa.int64()))
    return table.take(pa.array(rng.permutation(n)))


def _spec(tmp_path, max_history=100, hash_size=10**9) -> TransformSpec:
    ingest = IngestConfig(hash_size=hash_size, max_history_length=max_history)
    return TransformSpec.from_config(COLUMNS, ingest, tmp_path / "quarantine")


def _dedup_blocks(flat, tmp_path, spec):
    keyed, _ = dedup_convert._with_session_keys(flat, "sid")
    users, samples, counts = dedup_convert.convert_table(keyed, COLUMNS)
    up, sp = dedup_storage.write_shard(users, samples, tmp_path / "ds", "part-00000", "sid")
    block = dedup_sessions.read_session_shard(str(up), str(sp), COLUMNS, spec.quarantine_dir)
    for fn in (dedup_operators.parse, dedup_operators.dense_transform, dedup_operators.sparse_transform):
        block = fn(block, spec)
    return block, counts


def _rows(batch) -> list[tuple]:
    """Each sample of a plain Batch as a hashable tuple (label, dense, ids per feature)."""
    jt = batch.sparse_features.to_dict()
    per = {k: (jt[k].lengths().numpy(), jt[k].values().numpy()) for k in batch.sparse_features.keys()}
    offs = {k: np.concatenate([[0], np.cumsum(v[0])]) for k, v in per.items()}
    dense = batch.dense_features.numpy()
    return [
        (float(batch.labels[i]), tuple(np.round(dense[i], 6).tolist()),
         tuple(tuple(per[k][1][offs[k][i]:offs[k][i + 1]].tolist()) for k in per))
        for i in range(len(batch.labels))
    ]


def _plain_rows(flat, spec, batch_size):
    t = flat
    for fn in (transforms.parse, transforms.dense_transform, transforms.sparse_transform):
        t = fn(t, spec)
    rows = []
    for lo in range(0, t.num_rows, batch_size):
        packed = transforms.batch(t.slice(lo, batch_size), spec)
        rows += _rows(unpack_batch(packed, COLUMNS.sparse_features, 2))
    return rows


def _dedup_batches(packed):
    return [unpack_dedup_batch(packed.slice(r, 1), USER_F, ITEM_F, 1, 1) for r in range(packed.num_rows)]


# --------------------------------------------------------------------------- storage


def test_convert_table_stores_user_side_once_per_session_and_round_trips():
    flat = _flat()
    users, samples, counts = dedup_convert.convert_table(flat, COLUMNS)
    assert counts == {"sessions": 40, "samples": flat.num_rows, "split_sessions": 0}
    ukeys = users.column("sid").to_numpy()
    assert (np.diff(ukeys) > 0).all()  # sorted, unique
    assert (np.diff(samples.column("sid").to_numpy()) >= 0).all()
    assert set(users.column_names) == {"sid", "uc", "hist", "ud"}
    assert set(samples.column_names) == {"sid", "label", "ic", "idn"}
    # Joining back gives exactly the flat rows.
    back = dedup_sessions.session_block_to_flat(dedup_sessions.join_sessions(users, samples, COLUMNS))
    key = lambda t: sorted(zip(*(t.column(c).to_pylist() for c in sorted(flat.column_names))), key=repr)  # noqa: E731
    assert key(back.select(sorted(flat.column_names))) == key(flat.select(sorted(flat.column_names)))


def test_rows_of_one_key_with_different_user_features_become_separate_sessions():
    flat = _flat(num_sessions=3, max_len=4, seed=1)
    keys = np.full(flat.num_rows, 5)  # every row claims session 5, but user features differ by true session
    flat = flat.set_column(0, "sid", pa.array(keys))
    users, samples, counts = dedup_convert.convert_table(flat, COLUMNS)
    assert counts["sessions"] == 3 and counts["split_sessions"] == 2
    block = dedup_sessions.join_sessions(users, samples, COLUMNS)
    assert sorted(np.diff(block.column(dedup_storage.SAMPLES_COLUMN).combine_chunks().offsets.to_numpy()).tolist()) == \
        sorted(np.unique(flat.column("uc").to_numpy(), return_counts=True)[1].tolist())


def test_same_as_previous_compares_lists_and_nulls_exactly():
    lists = pa.array([[1, 2], [1, 2], [1, 3], [], [], None, [4]], pa.list_(pa.int64()))
    assert dedup_convert._same_as_previous(lists).tolist() == [False, True, False, False, True, True, False]
    floats = pa.array([1.0, 1.0, None, None, float("nan"), float("nan"), 2.0], pa.float32(), from_pandas=False)
    assert dedup_convert._same_as_previous(floats).tolist() == [False, True, False, True, False, True, False]


def test_shard_files_use_the_size_encodings(tmp_path):
    users, samples, _ = dedup_convert.convert_table(_flat(), COLUMNS)
    up, sp = dedup_storage.write_shard(users, samples, tmp_path, "part-00000", "sid")
    for path, floats, ids in ((up, "ud", ["uc", "hist.list.element"]), (sp, "idn", ["ic", "label"])):
        meta = pq.ParquetFile(path).metadata
        assert meta.num_row_groups == 1
        cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
        assert "DELTA_BINARY_PACKED" in cols["sid"].encodings
        assert "BYTE_STREAM_SPLIT" in cols[floats].encodings
        for name in ids:
            assert "RLE_DICTIONARY" in cols[name].encodings
        assert all(c.compression == "ZSTD" for c in cols.values())


def test_missing_session_keys_become_their_own_sessions():
    flat = _flat(missing_keys=3)
    keyed, missing = dedup_convert._with_session_keys(flat, "sid")
    assert missing == 3
    flags = dedup_convert._assign_keys(flat, "sid").column("_missing_key").to_pylist()
    assert sum(flags) == 3
    users, samples, counts = dedup_convert.convert_table(keyed, COLUMNS)
    assert counts["samples"] == flat.num_rows
    neg = samples.column("sid").to_numpy() < 0
    assert neg.sum() == 3 and len(np.unique(samples.column("sid").to_numpy()[neg])) == 3


def test_join_quarantines_samples_without_a_user_row_and_rejects_duplicate_users(tmp_path):
    users, samples, _ = dedup_convert.convert_table(_flat(), COLUMNS)
    orphan_key = users.column("sid")[0].as_py()
    block = dedup_sessions.join_sessions(users.slice(1), samples, COLUMNS, str(tmp_path))
    lost = int(np.sum(samples.column("sid").to_numpy() == orphan_key))
    assert dedup_sessions.session_block_to_flat(block).num_rows == samples.num_rows - lost
    assert transforms.count_quarantined(tmp_path) == {dedup_sessions.NO_USER_ROW: lost}
    with pytest.raises(ValueError, match="more than once"):
        dedup_sessions.join_sessions(pa.concat_tables([users, users.slice(0, 1)]), samples, COLUMNS)


# --------------------------------------------------------------------------- operators and batches


@pytest.mark.parametrize("batch_size,max_history", [(64, 100), (16, 5), (7, 3)])
def test_dedup_batches_expand_to_exactly_the_plain_pipelines_samples(tmp_path, batch_size, max_history):
    """Same samples, same transformed features: truncation, hashing, missing values, bad labels."""
    flat = _flat(bad_labels=4)
    spec = _spec(tmp_path, max_history=max_history, hash_size=1000)
    plain = _plain_rows(flat, spec, batch_size)
    block, _ = _dedup_blocks(flat, tmp_path, spec)
    packed = dedup_operators.batch(block, spec, batch_size)
    assert packed.schema == DEDUP_PACKED_SCHEMA and is_dedup_packed(packed)
    rows = [r for b in _dedup_batches(packed) for r in _rows(b.expand())]
    assert sorted(rows) == sorted(plain)
    assert len(rows) == flat.num_rows - 4
    reasons = transforms.count_quarantined(tmp_path / "quarantine")
    assert reasons == {"label missing or not 0/1": 8}  # 4 per path: the plain and the dedup parse


def test_sessions_larger_than_the_batch_are_split_and_every_sample_arrives_once(tmp_path):
    flat = _flat(num_sessions=30, max_len=50, seed=3)
    spec = _spec(tmp_path)
    block, _ = _dedup_blocks(flat, tmp_path, spec)
    batch_size = 20
    packed = dedup_operators.batch(block, spec, batch_size)
    sizes = packed.column("num_samples").to_pylist()
    assert all(s == batch_size for s in sizes[:-1]) and 0 < sizes[-1] <= batch_size
    seen = []
    session_batches: dict[int, int] = {}
    for b in _dedup_batches(packed):
        assert b.inverse.min() >= 0 and b.inverse.max() < b.num_users
        assert torch.unique(b.inverse).numel() == b.num_users  # every user row is used
        assert (torch.diff(b.inverse) >= 0).all()  # samples grouped by session
        seen += b.item_sparse["ic"].values().tolist()
        for uc in b.user_sparse["uc"].values().tolist():
            session_batches[uc] = session_batches.get(uc, 0) + 1
    assert sorted(seen) == sorted(transforms.hash_ids(flat.column("ic").to_numpy(), 10**9).tolist())
    assert len(seen) == len(set(seen)) == flat.num_rows
    assert max(session_batches.values()) >= 3  # a 50-sample session spans 3 batches of 20


def test_batch_of_an_empty_block_is_empty(tmp_path):
    spec = _spec(tmp_path)
    block, _ = _dedup_blocks(_flat(num_sessions=2), tmp_path, spec)
    assert dedup_operators.batch(block.slice(0, 0), spec, 8).num_rows == 0


def test_user_transforms_run_once_per_session(tmp_path, monkeypatch):
    flat = _flat(num_sessions=25, max_len=20)
    spec = _spec(tmp_path, max_history=4, hash_size=1000)
    keyed, _ = dedup_convert._with_session_keys(flat, "sid")
    users, samples, _ = dedup_convert.convert_table(keyed, COLUMNS)
    block = dedup_operators.parse(dedup_sessions.join_sessions(users, samples, COLUMNS), spec)
    calls = []
    real = transforms.hash_lists
    monkeypatch.setattr(transforms, "hash_lists", lambda col, *a: calls.append(len(col)) or real(col, *a))
    dedup_operators.sparse_transform(block, spec)
    assert calls == [25]  # the history: one list per session, not per sample
    assert flat.num_rows > 100


# --------------------------------------------------------------------------- the packed contract


def test_unpack_expand_and_stats(tmp_path):
    spec = _spec(tmp_path, hash_size=1000)
    block, _ = _dedup_blocks(_flat(num_sessions=10, max_len=6), tmp_path, spec)
    packed = dedup_operators.batch(block, spec, 1000)
    assert packed.num_rows == 1
    b = _dedup_batches(packed)[0]
    assert b.num_samples == b.labels.numel() and b.num_users == 10
    stats = packed_batch_stats(packed)
    assert stats["dedup_factor"] == pytest.approx(b.num_samples / 10) and stats["batch_bytes"] > 0
    plain = b.expand()
    assert plain.dense_features.shape == (b.num_samples, 2)
    assert plain.sparse_features.keys() == COLUMNS.sparse_features
    torch.testing.assert_close(plain.dense_features[:, 0], b.user_dense[b.inverse, 0])
    # The plain contract is untouched: plain rows still unpack, and have no dedup columns.
    plain_packed = transforms.batch(pa.table({
        "label": pa.array([1.0], pa.float32()), "ud": pa.array([0.5], pa.float32()),
        "idn": pa.array([0.1], pa.float32()), "uc": [3], "hist": pa.array([[1, 2]], pa.large_list(pa.int64())),
        "ic": [4], "sid": [1],
    }), spec)
    assert plain_packed.schema == PACKED_SCHEMA and not is_dedup_packed(plain_packed)
    assert DEDUP_PACKED_SCHEMA.names[:5] == PACKED_SCHEMA.names
    assert unpack_batch(plain_packed, COLUMNS.sparse_features, 2).labels.tolist() == [1.0]
    assert packed_batch_stats(plain_packed)["dedup_factor"] == 1.0


def test_dummy_dedup_batch():
    d = dummy_dedup_batch(USER_F, ITEM_F, 1, 1)
    assert isinstance(d, DedupBatch) and d.num_samples == 1 and d.num_users == 1
    assert d.expand().sparse_features.keys() == [*USER_F, *ITEM_F]


# --------------------------------------------------------------------------- the dedup-convert command


def _parse(argv):
    import argparse

    from dlrm_platform.ingest import dedup_cli

    parser = argparse.ArgumentParser()
    parser.add_argument("-v", "--verbose", action="store_true")
    dedup_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_dedup_convert_command_parses_and_refuses_data_without_sessions(tmp_path):
    from dlrm_platform.errors import UserError

    args = _parse(["dedup-convert", "configs/demo.yaml", str(tmp_path / "out"), "--rows-per-shard", "1000"])
    assert args.out_dir == tmp_path / "out" and args.rows_per_shard == 1000
    assert _parse(["dedup-convert", "configs/demo.yaml"]).out_dir is None  # default: <data.path>.dedup
    config = tmp_path / "no_sessions.yaml"
    config.write_text(
        "data:\n  path: x\n  columns:\n    label: label\n    user: {dense: [ud], categorical: [uc]}\n"
        "    item: {categorical: [ic]}\n"
    )
    with pytest.raises(UserError, match="session_key"):
        args = _parse(["dedup-convert", str(config)])
        args.handler(args)


def test_dedup_dataset_open_errors(tmp_path):
    from dlrm_platform.errors import UserError

    with pytest.raises(UserError, match="not a complete dedup dataset"):
        dedup_storage.DedupDataset.open(tmp_path)
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / dedup_storage.MANIFEST_FILE).write_text('{"format": "other", "version": 1}')
    with pytest.raises(UserError, match="convert the data again"):
        dedup_storage.DedupDataset.open(tmp_path)
    assert dedup_storage.default_dedup_dir(tmp_path / "data" / "demo") == tmp_path / "data" / "demo.dedup"


def test_local_converter_writes_co_partitioned_shards(tmp_path):
    flat = _flat(num_sessions=50, max_len=30, missing_keys=2)
    files = []
    for i, idx in enumerate(np.array_split(np.arange(flat.num_rows), 2)):
        files.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(flat.take(pa.array(idx)), files[-1])
    report = dedup_convert.convert_split_local(files, COLUMNS, tmp_path / "out", rows_per_shard=200)
    assert report.samples == flat.num_rows and report.missing_session_keys == 2
    assert report.shards >= 2 and report.bytes > 0
    users = sorted((tmp_path / "out" / "users").glob("part-*.parquet"))
    assert [u.name for u in users] == [f"part-{i:05d}.parquet" for i in range(report.shards)]
    total = 0
    for u in users:
        ukeys = set(pq.read_table(u, columns=["sid"]).column(0).to_pylist())
        skeys = pq.read_table(tmp_path / "out" / "samples" / u.name, columns=["sid"]).column(0).to_pylist()
        assert set(skeys) == ukeys
        total += len(skeys)
    assert total == flat.num_rows


def test_session_read_task_rejects_a_malformed_schema_naming_the_field(tmp_path):
    """The schema crosses into the read task as the typed object and is re-validated there (config.revalidate)."""
    import pickle

    import cloudpickle

    from dlrm_platform.config import ConfigError, SideColumns

    keyed, _ = dedup_convert._with_session_keys(_flat(num_sessions=5), "sid")
    users, samples, _ = dedup_convert.convert_table(keyed, COLUMNS)
    up, sp = dedup_storage.write_shard(users, samples, tmp_path / "ds", "part-00000", "sid")
    good = dedup_sessions.SessionParquetDatasource([(str(up), str(sp))], COLUMNS, None)
    (task,) = good.get_read_tasks(1)
    shipped = pickle.loads(cloudpickle.dumps(task))  # as Ray ships it
    assert sum(b.num_rows for b in shipped()) > 0
    # Built past validation (model_construct): a string where the list of categorical columns goes.
    bad_item = SideColumns.model_construct(dense=["idn"], categorical="ic", multi_hot=[])
    bad = COLUMNS.model_copy(update={"item": bad_item})
    (task,) = dedup_sessions.SessionParquetDatasource([(str(up), str(sp))], bad, None).get_read_tasks(1)
    with pytest.raises(ConfigError, match=r"item\.categorical"):
        list(pickle.loads(cloudpickle.dumps(task))())
    with pytest.raises(ConfigError, match=r"item\.categorical"):  # the converter's task too
        dedup_convert._convert_block(keyed, bad, str(tmp_path / "out"), 100)
