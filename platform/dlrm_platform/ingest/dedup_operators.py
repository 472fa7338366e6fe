"""RecD per-session operators: the plain pipeline's stages on session blocks, and IKJT batch cutting.

On session blocks (:mod:`.dedup_sessions`) the user-side transforms (hashing,
history truncation and hashing, dense fill/log1p) touch every session once,
and item-side ones every sample once. Operators, named as in the plain pipeline so that the tuner sees the
same knobs (``IngestConfig.operators``)::

    ReadSessionParquet -> parse -> dense_transform -> sparse_transform -> batch
    (join a shard pair)   (types, labels quarantined, then per session / per sample)

``batch`` cuts whole sessions into IKJT batches
(:mod:`dlrm_platform.ingest.dedup_batching`): batches hold exactly
``batch_size`` samples except the last of each block; a session that does
not fit is split across two batches (one user row in each), so no sample is
lost and none is repeated.

The pipeline that chains these: :func:`dlrm_platform.ingest.pipeline.build_dedup_dataset`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlrm_platform.ingest import transforms
from dlrm_platform.ingest.batching import list_lengths_and_values
from dlrm_platform.ingest.dedup_batching import DEDUP_PACKED_SCHEMA, pack_dedup_arrays
from dlrm_platform.ingest.dedup_sessions import join_block, samples_offsets, session_order_of_keys, split_block
from dlrm_platform.ingest.dedup_storage import item_columns, key_array, user_columns
from dlrm_platform.ingest.transforms import TransformSpec, hash_ids

__all__ = ["batch", "batch_order", "dense_transform", "parse", "sparse_transform"]


def _normalized_list(arr: pa.Array) -> pa.Array:
    """A list array whose offsets start at 0 (``transforms.hash_lists`` indexes its flat values by offset)."""
    if arr.null_count:
        arr = arr.fill_null(pa.scalar([], arr.type))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    if len(offsets) and offsets[0] != 0:
        arr = pa.LargeListArray.from_arrays(pa.array(offsets - offsets[0]), arr.flatten())
    return arr


def parse(block: pa.Table, spec: TransformSpec) -> pa.Table:
    """Types as the plain ``parse`` (label/dense float32, ids int64, lists large_list<int64>).

    A sample whose label is missing or not 0/1 is quarantined with the same
    reason as the plain path and removed from its session; a session left
    without samples is dropped.
    """
    cols = spec.columns
    key = cols.session_key
    top, offsets, fields = split_block(block)
    label = pc.cast(fields[cols.label], pa.float32(), safe=False)
    bad = pc.fill_null(pc.or_(pc.is_null(label), pc.invert(pc.is_in(label, pa.array([0.0, 1.0], pa.float32())))), True)
    if pc.any(bad).as_py():
        bad_np = bad.to_numpy(zero_copy_only=False)
        session_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        rows = {key: top[key].take(pa.array(session_of[bad_np]))}
        rows.update({name: arr.filter(bad) for name, arr in fields.items()})
        transforms.quarantine(pa.table(rows), "label missing or not 0/1", spec.quarantine_dir)
        keep = pc.invert(bad)
        fields = {name: arr.filter(keep) for name, arr in fields.items()}
        label = label.filter(keep)
        counts = np.bincount(session_of[~bad_np], minlength=len(offsets) - 1)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
    multi_hot = set(cols.multi_hot_columns)

    def cast(name: str, arr: pa.Array) -> pa.Array:
        if name in cols.dense_columns:
            return pc.cast(arr, pa.float32(), safe=False)
        return pc.cast(arr, pa.large_list(pa.int64()) if name in multi_hot else pa.int64(), safe=False)

    new_top = {key: pc.cast(top[key], pa.int64(), safe=False)}
    new_top.update({name: cast(name, top[name]) for name in user_columns(cols)})
    new_fields = {cols.label: label}
    new_fields.update({name: cast(name, fields[name]) for name in item_columns(cols)[1:]})
    out = join_block(new_top, offsets, new_fields)
    counts = np.diff(offsets)
    if (counts == 0).any():
        out = out.filter(pa.array(counts > 0))
    return out


def _dense(arr: pa.Array, log1p: bool) -> pa.Array:
    values = arr.to_numpy(zero_copy_only=False).astype(np.float32)
    values = np.nan_to_num(values, nan=0.0)
    if log1p:
        values = np.log1p(np.maximum(values, 0.0, dtype=np.float32))
    return pa.array(values, pa.float32())


def dense_transform(block: pa.Table, spec: TransformSpec) -> pa.Table:
    """The plain dense transform (fill missing with 0, log1p): user columns once per session, item columns per sample."""
    cols = spec.columns
    top, offsets, fields = split_block(block)
    for name in cols.user.dense:
        top[name] = _dense(top[name], spec.dense_log1p)
    for name in cols.item.dense:
        fields[name] = _dense(fields[name], spec.dense_log1p)
    return join_block(top, offsets, fields)


def _sparse(name: str, arr: pa.Array, spec: TransformSpec, multi_hot: set[str]) -> pa.Array:
    size = spec.table_sizes[name]
    if name in multi_hot:
        return transforms.hash_lists(_normalized_list(arr), size, spec.max_history_length)
    ids = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
    return pa.array(hash_ids(ids, size), pa.int64())


def sparse_transform(block: pa.Table, spec: TransformSpec) -> pa.Table:
    """The plain sparse transform (hash into table size, keep the last ``max_history_length`` ids of a list):
    user features once per session, item features per sample."""
    cols = spec.columns
    multi_hot = set(cols.multi_hot_columns)
    top, offsets, fields = split_block(block)
    for name in cols.user_sparse_features:
        top[name] = _sparse(name, top[name], spec, multi_hot)
    for name in cols.item_sparse_features:
        fields[name] = _sparse(name, fields[name], spec, multi_hot)
    return join_block(top, offsets, fields)


def _sparse_parts(arr: pa.Array, is_list: bool, index: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths int32, values int64) of rows ``index`` (all rows when None) of an id or id-list column."""
    if index is not None:
        arr = arr.take(pa.array(index))
    if is_list:
        return list_lengths_and_values(arr)
    values = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return np.ones(len(values), dtype=np.int32), values


def _jagged_slice(lengths: np.ndarray, offsets: np.ndarray, values: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    return lengths[lo:hi], values[offsets[lo] : offsets[hi]]


def batch_order(block: pa.Table, spec: TransformSpec) -> np.ndarray:
    """int64 [S']: the block's non-empty sessions (indices into its rows) in the fixed pseudo-random order
    :func:`batch` takes them in (:func:`~dlrm_platform.ingest.dedup_sessions.session_order_of_keys`)."""
    keep = np.flatnonzero(np.diff(samples_offsets(block)) > 0)
    return keep[session_order_of_keys(key_array(block.column(spec.columns.session_key))[keep])]


def batch(block: pa.Table, spec: TransformSpec, batch_size: int, order: np.ndarray | None = None) -> pa.Table:
    """Cut a session block into packed IKJT batches (:data:`DEDUP_PACKED_SCHEMA`), one row each.

    Sessions are taken whole in a fixed pseudo-random order (:func:`batch_order`), or only the
    sessions ``order`` names (int64 [S'], indices into the block's rows), in that order: a read
    task batches a shard's consecutive slices of its order without copying the shard per slice.
    Every batch holds exactly ``batch_size`` samples except the last; a session that straddles a
    boundary contributes a user row to both batches.
    """
    cols = spec.columns
    top, offsets, fields = split_block(block)
    counts = np.diff(offsets)
    order = batch_order(block, spec) if order is None else order[counts[order] > 0]
    if len(order) == 0:
        return DEDUP_PACKED_SCHEMA.empty_table()
    counts_o = counts[order]
    n = int(counts_o.sum())
    # Samples in session order: their row in `fields` and the position of their session in `order`.
    sample_rows = np.repeat(offsets[:-1][order] - np.concatenate([[0], np.cumsum(counts_o)[:-1]]), counts_o) + np.arange(n)
    session_pos = np.repeat(np.arange(len(order)), counts_o)

    multi_hot = set(cols.multi_hot_columns)
    labels = fields[cols.label].to_numpy(zero_copy_only=False).astype(np.float32)[sample_rows]
    item_dense = _stack([fields[c] for c in cols.item.dense], sample_rows)
    user_dense = _stack([top[c] for c in cols.user.dense], order)
    item_sparse = [_jagged(fields[c], c in multi_hot, sample_rows) for c in cols.item_sparse_features]
    user_sparse = [_jagged(top[c], c in multi_hot, order) for c in cols.user_sparse_features]

    packed = []
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        s0, s1 = int(session_pos[lo]), int(session_pos[hi - 1]) + 1
        item_l, item_v, user_l, user_v = [], [], [], []
        for lengths, offs, values in item_sparse:
            l, v = _jagged_slice(lengths, offs, values, lo, hi)
            item_l.append(l)
            item_v.append(v)
        for lengths, offs, values in user_sparse:
            l, v = _jagged_slice(lengths, offs, values, s0, s1)
            user_l.append(l)
            user_v.append(v)
        packed.append(pack_dedup_arrays(
            labels=labels[lo:hi],
            item_dense=item_dense[lo:hi],
            item_lengths=_cat(item_l, np.int32),
            item_values=_cat(item_v, np.int64),
            user_dense=user_dense[s0:s1],
            user_lengths=_cat(user_l, np.int32),
            user_values=_cat(user_v, np.int64),
            inverse=session_pos[lo:hi] - s0,
            num_users=s1 - s0,
        ))
    return pa.concat_tables(packed)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _stack(arrays: list[pa.Array], index: np.ndarray) -> np.ndarray:
    if not arrays:
        return np.zeros((len(index), 0), dtype=np.float32)
    return np.stack([a.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)[index] for a in arrays], axis=1)


def _jagged(arr: pa.Array, is_list: bool, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths, values = _sparse_parts(arr, is_list, index)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return lengths, offsets, values


# =========================================================================== pipeline
