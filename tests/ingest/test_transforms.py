"""The pipeline's operators on hand-made Arrow tables (no Ray)."""

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.config import DatasetSchema, IngestConfig
from dlrm_platform.ingest import transforms
from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.ingest.transforms import TransformSpec, count_quarantined, hash_ids

COLUMNS = DatasetSchema.model_validate(
    {
        "label": "label",
        "session_key": "sid",
        "user": {"dense": ["ud"], "categorical": ["uc"], "multi_hot": ["hist"]},
        "item": {"dense": ["id"], "categorical": ["ic"]},
    }
)


def _spec(tmp_path, **ingest) -> TransformSpec:
    cfg = IngestConfig.model_validate({"hash_size": 100, "max_history_length": 3, **ingest})
    return TransformSpec.from_config(COLUMNS, cfg, tmp_path / "quarantine")


def _table(labels=(1, 0, 1, 0)) -> pa.Table:
    n = len(labels)
    return pa.table(
        {
            "label": pa.array(labels, pa.int64()),
            "sid": pa.array([7, 7, None, 9][:n], pa.int64()),
            "ud": pa.array([1.0, None, 3.0, -2.0][:n], pa.float64()),
            "uc": pa.array([5, 5, None, 123456789][:n], pa.int64()),
            "hist": pa.array([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [], None][:n], pa.list_(pa.int64())),
            "id": pa.array([0.5, 0.5, 0.5, 0.5][:n], pa.float32()),
            "ic": pa.array([11, 12, 13, 14][:n], pa.int64()),
        }
    )


def test_parse_casts_types_and_gives_missing_session_its_own_key(tmp_path):
    out = transforms.parse(_table(), _spec(tmp_path))
    assert out.schema.field("label").type == pa.float32()
    assert out.schema.field("ud").type == pa.float32()
    assert out.schema.field("hist").type == pa.large_list(pa.int64())
    sids = out.column("sid").to_pylist()
    assert sids[0] == sids[1] == 7 and sids[3] == 9
    assert sids[2] < 0  # missing key: a fresh session of its own
    assert transforms.count_missing_session_keys(out, "sid") == 1


def test_parse_quarantines_bad_labels_with_reason(tmp_path):
    spec = _spec(tmp_path)
    out = transforms.parse(_table(labels=(1, None, 2, 0)), spec)
    assert out.num_rows == 2
    assert out.column("label").to_pylist() == [1.0, 0.0]
    assert count_quarantined(tmp_path / "quarantine") == {"label missing or not 0/1": 2}


def test_parse_without_quarantine_dir_refuses_to_drop_rows():
    spec = TransformSpec.from_config(COLUMNS, IngestConfig(), None)
    with pytest.raises(ValueError, match="quarantine"):
        transforms.parse(_table(labels=(1, None, 0, 0)), spec)


def test_dense_transform_fills_missing_and_log1p(tmp_path):
    spec = _spec(tmp_path)
    out = transforms.dense_transform(transforms.parse(_table(), spec), spec)
    np.testing.assert_allclose(out.column("ud").to_numpy(), np.log1p([1.0, 0.0, 3.0, 0.0]), rtol=1e-6)
    assert out.schema.field("ud").type == pa.float32()
    raw = transforms.dense_transform(transforms.parse(_table(), spec), _spec(tmp_path, dense_log1p=False))
    np.testing.assert_allclose(raw.column("ud").to_numpy(), [1.0, 0.0, 3.0, -2.0])


def test_hash_ids_in_range_deterministic_and_spread():
    ids = np.arange(100_000, dtype=np.int64) * 1000  # strided ids: plain modulo would collide
    h = hash_ids(ids, 1000)
    assert h.min() >= 0 and h.max() < 1000
    np.testing.assert_array_equal(h, hash_ids(ids, 1000))
    assert len(np.unique(h)) > 990
    assert hash_ids(np.array([-5, 2**62], dtype=np.int64), 7).max() < 7


def test_sparse_transform_hashes_and_keeps_history_tail(tmp_path):
    spec = _spec(tmp_path)
    parsed = transforms.parse(_table(), spec)
    out = transforms.sparse_transform(parsed, spec)
    hist = out.column("hist").to_pylist()
    assert [len(h) for h in hist] == [3, 3, 0, 0]
    assert hist[0] == hash_ids(np.array([3, 4, 5]), 100).tolist()  # the most recent 3
    uc = out.column("uc").to_pylist()
    assert uc[0] == uc[1] and all(0 <= v < 100 for v in uc)
    assert uc[2] == hash_ids(np.array([0]), 100)[0]  # missing id -> the shared "missing" row


def test_per_feature_table_sizes(tmp_path):
    spec = _spec(tmp_path, hash_sizes={"ic": 3})
    out = transforms.sparse_transform(transforms.parse(_table(), spec), spec)
    assert max(out.column("ic").to_pylist()) < 3


def test_batch_packs_and_unpacks_to_kjt(tmp_path):
    spec = _spec(tmp_path)
    table = transforms.sparse_transform(transforms.dense_transform(transforms.parse(_table(), spec), spec), spec)
    packed = transforms.batch(table, spec)
    assert packed.num_rows == 1
    b = unpack_batch(packed, COLUMNS.sparse_features, len(COLUMNS.dense_columns))
    assert b.dense_features.shape == (4, 2)
    assert b.labels.tolist() == [1.0, 0.0, 1.0, 0.0]
    kjt = b.sparse_features
    assert kjt.keys() == ["uc", "hist", "ic"]
    assert kjt.stride() == 4
    assert kjt["hist"].lengths().tolist() == [3, 3, 0, 0]
    assert kjt["ic"].values().tolist() == table.column("ic").to_pylist()


def test_sliced_history_lists_hash_the_right_ids():
    from dlrm_platform.ingest.transforms import hash_lists

    arr = pa.array([[9, 9, 9], [1, 2, 3, 4], [5]], pa.large_list(pa.int64())).slice(1)
    out = hash_lists(arr, 1000, 2).to_pylist()
    assert out == [hash_ids(np.array([3, 4]), 1000).tolist(), hash_ids(np.array([5]), 1000).tolist()]


def test_quarantine_counts_a_row_once_across_epochs(tmp_path):
    spec = _spec(tmp_path)
    for _epoch in range(2):
        transforms.parse(_table(labels=(1, None, 0, 0)), spec)
    assert count_quarantined(tmp_path / "quarantine") == {"label missing or not 0/1": 1}
