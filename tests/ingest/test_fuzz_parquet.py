"""Fuzzing the Parquet reader: dataset validation (`validate_dataset`) and the pipeline's `parse`.

Inputs: Parquet shards with random column types (right and wrong ones),
values at the edges (nulls, NaN, inf, huge integers, labels other than 0/1,
nulls inside lists), random compression and row groups, then random damage:
truncation, flipped bytes, a zeroed range, an empty file, a file that is not
Parquet. Every input must end in one of:

- a DatasetSchemaError that names the file (wrong columns; or an unreadable
  shard under ``data.on_bad_shard: fail``);
- the shard reported in ``bad_shards`` (``skip``);
- the shard read whole, and ``parse`` turning its N rows into trained rows +
  quarantined rows = N, the quarantined ones exactly those whose label is
  missing or not 0/1; the later operators run on the result without error.

`make test` tries a few dozen inputs; `make fuzz` (profile ``chaos``) 600.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dlrm_platform.config import DataConfig, DatasetSchema, IngestConfig, SideColumns
from dlrm_platform.ingest import transforms
from dlrm_platform.ingest.source import DatasetSchemaError, validate_dataset
from dlrm_platform.ingest.transforms import TransformSpec, count_quarantined

pytestmark = pytest.mark.timeout(600)

COLUMNS = DatasetSchema(
    label="label",
    session_key="sid",
    user=SideColumns(dense=["u_d"], categorical=["u_c"], multi_hot=["hist"]),
    item=SideColumns(dense=["i_d"], categorical=["i_c"]),
)
TABLE_SIZE = 1000

_INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]
_FLOAT_TYPES = [pa.float32(), pa.float64()]


def _int_values(t: pa.DataType, n: int):
    info = np.iinfo(t.to_pandas_dtype())
    edge = st.sampled_from([0, 1, int(info.min), int(info.max), 2, int(info.max) // 2])
    return st.lists(st.one_of(st.none(), edge, st.integers(int(info.min), int(info.max))), min_size=n, max_size=n)


def _float_values(n: int, width: int):
    edge = st.sampled_from([0.0, 1.0, -0.0, math.nan, math.inf, -math.inf, 1e300 if width == 64 else 3e38,
                            1.0000001, 0.9999999, 2.0])
    return st.lists(st.one_of(st.none(), edge, st.floats(width=width)), min_size=n, max_size=n)


@st.composite
def _scalar_column(draw, n: int, kinds: tuple[str, ...]):
    kind = draw(st.sampled_from(kinds))
    if kind == "int":
        t = draw(st.sampled_from(_INT_TYPES))
        arr = pa.array(draw(_int_values(t, n)), t)
    elif kind == "float":
        t = draw(st.sampled_from(_FLOAT_TYPES))
        arr = pa.array(draw(_float_values(n, t.bit_width)), t)
    elif kind == "bool":
        arr = pa.array(draw(st.lists(st.one_of(st.none(), st.booleans()), min_size=n, max_size=n)), pa.bool_())
    elif kind == "string":
        arr = pa.array(draw(st.lists(st.one_of(st.none(), st.text(max_size=5), st.sampled_from(["0", "1", "7"])),
                                     min_size=n, max_size=n)), pa.string())
    else:  # a list where a scalar is expected
        arr = pa.array([[1]] * n, pa.list_(pa.int64()))
    if kind in ("int", "string") and draw(st.booleans()):
        arr = arr.dictionary_encode()
    return arr


@st.composite
def _list_column(draw, n: int):
    kind = draw(st.sampled_from(["list", "list", "large_list", "list_int32", "list_string", "scalar"]))
    if kind == "scalar":
        return pa.array(range(n), pa.int64())
    value_type = pa.string() if kind == "list_string" else (pa.int32() if kind == "list_int32" else pa.int64())
    item = st.text(max_size=3) if kind == "list_string" else st.integers(-(2**31), 2**31 - 1)
    values = draw(st.lists(st.one_of(st.none(), st.lists(st.one_of(item, st.none()), max_size=6)),
                           min_size=n, max_size=n))
    typ = pa.large_list(value_type) if kind == "large_list" else pa.list_(value_type)
    return pa.array(values, typ)


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 30))
    cols = {
        "label": draw(_scalar_column(n, ("int", "int", "float", "bool", "string"))),
        "sid": draw(_scalar_column(n, ("int", "int", "float", "string", "list"))),
        "u_d": draw(_scalar_column(n, ("int", "float", "float", "string"))),
        "u_c": draw(_scalar_column(n, ("int", "int", "int", "float"))),
        "hist": draw(_list_column(n)),
        "i_d": draw(_scalar_column(n, ("int", "float", "float", "bool"))),
        "i_c": draw(_scalar_column(n, ("int", "int", "int", "string"))),
    }
    drop = draw(st.sampled_from([None] * 8 + list(cols)))
    return pa.table({k: v for k, v in cols.items() if k != drop})


def _parquet_bytes(draw, table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(
        table, buf,
        compression=draw(st.sampled_from(["none", "snappy", "zstd", "gzip"])),
        row_group_size=draw(st.integers(1, 40)),
        use_dictionary=draw(st.booleans()),
        write_page_checksum=draw(st.booleans()),
    )
    return buf.getvalue()


@st.composite
def shards(draw) -> tuple[str, bytes]:
    """(damage done, file bytes)."""
    data = _parquet_bytes(draw, draw(tables()))
    damage = draw(st.sampled_from(["none", "none", "truncate", "flip", "zero_range", "empty", "not_parquet",
                                   "magic_only", "csv"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "flip":
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    elif damage == "zero_range":
        at = draw(st.integers(0, len(data) - 1))
        size = draw(st.integers(1, 64))
        data = data[:at] + b"\x00" * min(size, len(data) - at) + data[at + size:]
    elif damage == "empty":
        data = b""
    elif damage == "not_parquet":
        data = draw(st.binary(max_size=300))
    elif damage == "magic_only":
        data = b"PAR1" + draw(st.binary(max_size=40)) + b"PAR1"
    elif damage == "csv":
        data = b"label,sid,u_d\n1,2,3\n"
    return damage, data


def _good_table(n: int = 4) -> pa.Table:
    return pa.table({
        "label": pa.array([0, 1] * (n // 2), pa.int64()), "sid": pa.array(range(n), pa.int64()),
        "u_d": pa.array([0.5] * n, pa.float32()), "u_c": pa.array(range(n), pa.int64()),
        "hist": pa.array([[1, 2]] * n, pa.list_(pa.int64())), "i_d": pa.array([1.0] * n),
        "i_c": pa.array(range(n), pa.int64()),
    })


def _expected_bad_labels(label: pa.ChunkedArray) -> int:
    """Rows whose label is missing or not exactly 0 or 1 (Python's exact comparison, no float rounding)."""
    return sum(1 for v in label.to_pylist() if v is None or isinstance(v, str) or v not in (0, 1))


def _run_operators(table: pa.Table, quarantine: Path) -> tuple[pa.Table, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's invalid casts: garbage ids, silently
        return _run_operators_strict(table, quarantine)


def _run_operators_strict(table: pa.Table, quarantine: Path) -> tuple[pa.Table, int]:
    spec = TransformSpec.from_config(COLUMNS, IngestConfig(hash_size=TABLE_SIZE, max_history_length=3), quarantine)
    out = transforms.parse(table, spec)
    quarantined = sum(count_quarantined(quarantine).values()) if quarantine.exists() else 0
    if out.num_rows:
        out = transforms.sparse_transform(transforms.dense_transform(out, spec), spec)
        for name in COLUMNS.dense_columns:
            assert np.isfinite(out.column(name).to_numpy()).all(), name
        for name in ("u_c", "i_c"):
            ids = out.column(name).to_numpy()
            assert ((ids >= 0) & (ids < TABLE_SIZE)).all(), name
        hist = out.column("hist").combine_chunks()
        flat = hist.flatten().to_numpy(zero_copy_only=False)
        assert hist.null_count == 0 and flat.dtype == np.int64 and ((flat >= 0) & (flat < TABLE_SIZE)).all()
        assert (hist.value_lengths().to_numpy(zero_copy_only=False) <= 3).all()
        packed = transforms.batch(out, spec)
        assert packed.num_rows == 1
    return out, quarantined


@fuzz_settings()
@given(shards(), st.sampled_from(["fail", "skip"]))
def test_fuzzed_parquet_shard_is_read_skipped_or_named(tmp_path_factory, shard, on_bad_shard) -> None:
    damage, data = shard
    root = tmp_path_factory.mktemp("pq")
    (root / "train").mkdir()
    (root / "eval").mkdir()
    pq.write_table(_good_table(), root / "train" / "part-00000.parquet")
    pq.write_table(_good_table(), root / "eval" / "part-00000.parquet")
    fuzzed = root / "train" / "part-00001.parquet"
    fuzzed.write_bytes(data)
    config = DataConfig(path=root, columns=COLUMNS, on_bad_shard=on_bad_shard)
    try:
        files = validate_dataset(config)
    except DatasetSchemaError as err:
        assert str(fuzzed) in str(err), str(err)
        return
    bad = [b.path for b in files.bad_shards]
    if bad:
        assert on_bad_shard == "skip" and bad == [fuzzed] and fuzzed not in files.train
        assert files.train == [root / "train" / "part-00000.parquet"] and files.train_rows == 4
        return
    assert damage != "empty" and fuzzed in files.train
    table = pq.read_table(fuzzed, columns=COLUMNS.columns)  # validated: must read whole
    assert table.num_rows == pq.read_metadata(fuzzed).num_rows == files.train_rows - 4
    out, quarantined = _run_operators(table, root / "quarantine")
    assert out.num_rows + quarantined == table.num_rows  # nothing lost
    assert quarantined == _expected_bad_labels(table.column("label"))


# --------------------------------------------------------------------------- regressions and on_bad_shard


def _dataset(root: Path, n_bad: int, on_bad_shard: str) -> DataConfig:
    for split in ("train", "eval"):
        (root / split).mkdir(parents=True, exist_ok=True)
        pq.write_table(_good_table(), root / split / "part-00000.parquet")
    good = io.BytesIO()
    pq.write_table(_good_table(40), good, row_group_size=10, compression="none")
    raw = good.getvalue()
    for i in range(n_bad):
        corrupt = bytearray(raw)
        for at in range(8, len(raw) // 2, 7):  # the data pages: the footer still reads
            corrupt[at] ^= 0x5A
        (root / "train" / f"part-1000{i}.parquet").write_bytes(bytes(corrupt))
    (root / "train" / "part-20000.parquet").write_bytes(b"")  # empty: not Parquet
    return DataConfig(path=root, columns=COLUMNS, on_bad_shard=on_bad_shard)


def test_corrupt_data_pages_fail_the_job_by_default_naming_every_file(tmp_path: Path) -> None:
    config = _dataset(tmp_path, 2, "fail")
    assert DataConfig(path=tmp_path, columns=COLUMNS).on_bad_shard == "fail"
    with pytest.raises(DatasetSchemaError) as err:
        validate_dataset(config)
    msg = str(err.value)
    assert "3 Parquet shard(s) cannot be read" in msg and "data.on_bad_shard: skip" in msg
    for name in ("part-10000.parquet", "part-10001.parquet", "part-20000.parquet"):
        assert str(tmp_path / "train" / name) in msg
    assert "empty file" in msg


def test_skip_leaves_bad_shards_out_and_reports_them(tmp_path: Path, caplog) -> None:
    files = validate_dataset(_dataset(tmp_path, 2, "skip"))
    assert files.train == [tmp_path / "train" / "part-00000.parquet"] and files.train_rows == 4
    assert sorted(b.path.name for b in files.bad_shards) == ["part-10000.parquet", "part-10001.parquet",
                                                             "part-20000.parquet"]
    assert all(b.reason for b in files.bad_shards)
    assert "skipping 3 unreadable Parquet shard(s)" in caplog.text and "part-10001.parquet" in caplog.text


def test_skip_with_no_readable_shard_left_is_an_error(tmp_path: Path) -> None:
    config = _dataset(tmp_path, 1, "skip")
    (tmp_path / "train" / "part-00000.parquet").write_bytes(b"garbage")
    with pytest.raises(DatasetSchemaError, match="no readable shard left in the 'train' split"):
        validate_dataset(config)


def test_a_float_label_near_one_is_quarantined_not_rounded(tmp_path: Path) -> None:
    """Found by the fuzzer: parse compared labels after the cast to float32, so 0.99999999 became a 1."""
    table = _good_table(4).set_column(0, "label", pa.array([1.0, 0.99999999, 1e-9, 0.0], pa.float64()))
    out, quarantined = _run_operators(table, tmp_path / "q")
    assert quarantined == 2 and out.column("label").to_pylist() == [1.0, 0.0]


def test_a_null_inside_a_history_is_the_missing_id(tmp_path: Path) -> None:
    """Found by the fuzzer: a null inside a multi-hot list went through numpy as NaN and hashed to garbage."""
    table = _good_table(2).set_column(4, "hist", pa.array([[5, None], [None]], pa.list_(pa.int64())))
    out, _ = _run_operators(table, tmp_path / "q")
    missing = int(transforms.hash_ids(np.array([0]), TABLE_SIZE)[0])
    assert out.column("hist").to_pylist() == [[int(transforms.hash_ids(np.array([5]), TABLE_SIZE)[0]), missing],
                                              [missing]]


@pytest.mark.parametrize("keys", [["a", "b", None, "a"], [1.5, 1.7, -0.0, 0.0], [True, False, None, True],
                                  [2**62 + 1, 2**62, None, 2**62 + 1]])
def test_non_integer_session_keys_are_stable_and_distinct(keys) -> None:
    """Found by the fuzzer: a string session key crashed parse (cast to int64); a float one merged 1.5 and 1.7;
    integer keys above 2**53 in a batch with a missing key went through float64 and merged."""
    col = pa.chunked_array([pa.array(keys)])
    first = transforms.session_keys(col).to_pylist()
    again = transforms.session_keys(pa.chunked_array([pa.array(keys[::-1])])).to_pylist()[::-1]
    for i, k in enumerate(keys):
        if k is None:
            assert first[i] < 0  # its own session
            continue
        assert first[i] >= 0 and first[i] == again[i]  # the same key in another batch
        for j, other in enumerate(keys):
            if other is not None:
                assert (first[i] == first[j]) == (k == other)
