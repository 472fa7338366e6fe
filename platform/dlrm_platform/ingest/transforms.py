"""Row transforms of the preprocessing pipeline, one function per named operator.

Each function maps an Arrow table to an Arrow table and is pure apart from
``parse`` writing quarantined rows, so it runs the same in a Ray Data task, a
benchmark or a unit test. Ray Data names operators after these functions
(``MapBatches(parse)`` ...), which is how the tuner finds its knobs.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from dlrm_platform.config import DatasetSchema, IngestConfig
from dlrm_platform.ingest.batching import pack_table

QUARANTINE_REASON = "quarantine_reason"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class TransformSpec(BaseModel):
    """What the operators need to know; small and picklable, shipped to every task.

    A typed config like the job's: it crosses into Ray Data tasks as this object and the
    task's entry point re-validates it (``config.revalidate``; ``ingest.pipeline`` for
    the map operators, the read tasks in ``fused`` and ``dedup_sessions``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: DatasetSchema
    table_sizes: dict[str, PositiveInt]
    max_history_length: PositiveInt
    dense_log1p: bool
    quarantine_dir: str | None

    @model_validator(mode="after")
    def _every_table_sized(self) -> TransformSpec:
        missing = [f for f in self.columns.sparse_features if f not in self.table_sizes]
        if missing:
            raise ValueError(f"table_sizes has no size for the sparse features {missing}")
        return self

    @classmethod
    def from_config(cls, columns: DatasetSchema, ingest: IngestConfig, quarantine_dir: Path | None) -> TransformSpec:
        return cls(
            columns=columns,
            table_sizes={f: ingest.table_size(f) for f in columns.sparse_features},
            max_history_length=ingest.max_history_length,
            dense_log1p=ingest.dense_log1p,
            quarantine_dir=str(quarantine_dir) if quarantine_dir else None,
        )


def parse(table: pa.Table, spec: TransformSpec) -> pa.Table:
    """Cast to the pipeline's types and quarantine rows that cannot be trained on.

    Output columns: label float32, dense float32 (nulls kept for
    ``dense_transform``), categorical int64, multi-hot list<int64>, session key
    int64 (missing keys become a fresh negative key: the row is its own session).
    A row whose label is missing or not 0/1 is written to
    ``quarantine_dir/parse-*.parquet`` with its reason and removed.
    """
    cols = spec.columns
    label = table.column(cols.label)
    # Compared exactly, in float64: after a cast to float32, 0.99999999 would pass as 1. `equal`, not
    # `is_in` (which hashes bits): -0.0 is a valid 0.
    label_f64 = pc.cast(label, pa.float64(), safe=False)
    bad_label = pc.invert(pc.or_(pc.equal(label_f64, 0.0), pc.equal(label_f64, 1.0)))
    bad_label = pc.fill_null(bad_label, True)
    if pc.any(bad_label).as_py():
        quarantine(table.filter(bad_label), "label missing or not 0/1", spec.quarantine_dir)
        keep = pc.invert(bad_label)
        table = table.filter(keep)
        label_f64 = label_f64.filter(keep)
    arrays: dict[str, pa.ChunkedArray | pa.Array] = {cols.label: pc.cast(label_f64, pa.float32())}
    if cols.session_key:
        arrays[cols.session_key] = session_keys(table.column(cols.session_key))
    for name in cols.dense_columns:
        arrays[name] = pc.cast(table.column(name), pa.float32(), safe=False)
    multi_hot = set(cols.multi_hot_columns)
    for name in cols.sparse_features:
        typ = pa.large_list(pa.int64()) if name in multi_hot else pa.int64()
        arrays[name] = pc.cast(table.column(name), typ, safe=False)
    return pa.table(arrays)


def _stable_key_hash(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Non-negative int64 keys of a non-integer key column, the same in every batch and process.

    Each distinct value is hashed once (blake2b of its value): a cast would fail on strings and merge
    1.5 and 1.7 into one session. Nulls get 0 here and a fresh key in :func:`session_keys`.
    """
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    encoded = col.dictionary_encode()

    def digest(v: object) -> int:
        v = v + 0.0 if isinstance(v, float) else v  # -0.0 is 0.0
        return int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=8).digest(), "little") >> 1

    digests = np.array([digest(v) for v in encoded.dictionary.to_pylist()] or [0], dtype=np.int64)
    return digests[pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)]


def session_keys(col: pa.ChunkedArray) -> pa.Array:
    """int64 session keys; a missing key becomes a unique negative key (its own session)."""
    value_type = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if pa.types.is_integer(value_type):
        # fill_null first: with nulls, to_numpy goes through float64 and keys above 2**53 would merge.
        keys = pc.cast(col, pa.int64(), safe=False).fill_null(0).to_numpy(zero_copy_only=False)
    else:
        keys = _stable_key_hash(col)
    missing = pc.is_null(col).to_numpy(zero_copy_only=False)
    if missing.any():
        keys = np.where(missing, 0, keys).astype(np.int64)
        keys[missing] = fresh_session_keys(int(missing.sum()))
    return pa.array(keys, pa.int64())


def fresh_session_keys(n: int) -> np.ndarray:
    """``n`` unique negative session keys: they never collide with real (non-negative) keys.

    Random high bits, a counter in the low bits.
    """
    salt = -(int(uuid.uuid4().int & 0x3FFFFFFF) << 32)
    return salt - np.arange(n, dtype=np.int64) - 1


def count_missing_session_keys(table: pa.Table, session_key: str) -> int:
    """Rows whose session key ``parse`` replaced (negative keys)."""
    return int(pc.sum(pc.less(table.column(session_key), 0)).as_py() or 0)


def quarantine(rows: pa.Table, reason: str, quarantine_dir: str | None) -> None:
    if quarantine_dir is None:
        raise ValueError(f"{rows.num_rows} rows to quarantine ({reason}) but no quarantine_dir is set")
    out = Path(quarantine_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = rows.append_column(QUARANTINE_REASON, pa.array([reason] * rows.num_rows, pa.string()))
    # Named by content: the same rows met again in a later epoch overwrite their file, counted once.
    digest = hashlib.sha1(rows.to_pandas().to_csv().encode()).hexdigest()[:16]
    pq.write_table(rows, out / f"parse-{digest}.parquet")


def count_quarantined(quarantine_dir: Path) -> dict[str, int]:
    """Quarantined rows by reason, read back from ``parse``'s files."""
    counts: dict[str, int] = {}
    for path in sorted(Path(quarantine_dir).glob("parse-*.parquet")):
        reasons = pq.read_table(path, columns=[QUARANTINE_REASON]).column(0).to_pylist()
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
    return counts


def dense_transform(table: pa.Table, spec: TransformSpec) -> pa.Table:
    """Fill missing dense values with 0, then ``log1p(max(x, 0))`` when configured. float32 out."""
    for name in spec.columns.dense_columns:
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float32)
        values = np.nan_to_num(values, nan=0.0)
        if spec.dense_log1p:
            values = np.log1p(np.maximum(values, 0.0, dtype=np.float32))
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.float32()))
    return table


def hash_ids(ids: np.ndarray, table_size: int, salt: int = 0) -> np.ndarray:
    """Map int64 ids (any range) onto ``[0, table_size)`` with a multiplicative hash."""
    mixed = (ids.astype(np.uint64) + np.uint64(salt)) * _GOLDEN
    mixed ^= mixed >> np.uint64(29)
    return (mixed % np.uint64(table_size)).astype(np.int64)


def sparse_transform(table: pa.Table, spec: TransformSpec) -> pa.Table:
    """Hash ids into their table sizes; truncate multi-hot lists to their last ``max_history_length`` ids.

    A missing categorical id hashes as id 0 (one shared "missing" row per table).
    """
    multi_hot = set(spec.columns.multi_hot_columns)
    for name in spec.columns.sparse_features:
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        size = spec.table_sizes[name]
        if name in multi_hot:
            new_col = hash_lists(col, size, spec.max_history_length)
        else:
            ids = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
            new_col = pa.array(hash_ids(ids, size), pa.int64())
        table = table.set_column(table.schema.get_field_index(name), name, new_col)
    return table


def hash_lists(col: pa.Array, table_size: int, max_len: int) -> pa.LargeListArray:
    col = col.fill_null(pa.scalar([], col.type)) if col.null_count else col
    lengths = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    # A sliced array's offsets need not start at 0; flatten() starts at its first value.
    offsets = np.asarray(col.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    # A null inside a list is the missing id 0, as for categorical columns (as floats, NaN hashed to garbage).
    flat = pc.fill_null(col.flatten(), 0).to_numpy(zero_copy_only=False)
    # Keep the most recent max_len ids: the tail of each list.
    new_lengths = np.minimum(lengths, max_len)
    if (new_lengths < lengths).any():
        ends = offsets[1:]
        starts = ends - new_lengths
        keep = np.zeros(len(flat), dtype=bool)
        # Mark kept ranges via a difference array, O(total length).
        marks = np.zeros(len(flat) + 1, dtype=np.int64)
        np.add.at(marks, starts, 1)
        np.add.at(marks, ends, -1)
        keep = np.cumsum(marks[:-1]) > 0
        flat = flat[keep]
    new_offsets = np.zeros(len(new_lengths) + 1, dtype=np.int64)
    np.cumsum(new_lengths, out=new_offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(new_offsets), pa.array(hash_ids(flat, table_size), pa.int64()))


def batch(table: pa.Table, spec: TransformSpec) -> pa.Table:
    """Pack ``table`` (one training batch of rows) into one packed row (see ``batching``)."""
    cols = spec.columns
    return pack_table(table, cols.dense_columns, cols.sparse_features, cols.multi_hot_columns, cols.label)
