"""Packed training batches: the contract between the Ray Data pipeline and the trainers.

This module is the *packing* side and imports no torch: it runs in every Ray Data
worker, where importing torch and torchrec would cost seconds per process
(the unpacking side is :mod:`dlrm_platform.train.batches`).

The pipeline's last operator (``batch``) turns preprocessed rows into *packed
batches*: one Arrow row per training batch, so that the feed service
(:mod:`.feed_service`) hands whole batches to trainers and the trainer's only host-side work is one copy of
each buffer into a tensor.

A packed row holds, for a batch of ``B`` samples, ``D`` dense features and
``F`` sparse features (keys in :attr:`DatasetSchema.sparse_features` order)::

    num_samples : int32                       B
    labels      : list<float32>   [B]         click / no click
    dense       : list<float32>   [B * D]     row-major, already transformed
    lengths     : list<int32>     [F * B]     KJT lengths, feature-major
    values      : list<int64>     [sum(lengths)]  hashed ids, feature-major

which :func:`dlrm_platform.train.batches.unpack_batch` turns into a TorchRec ``Batch``::

    dense_features  : float32 [B, D]
    sparse_features : KeyedJaggedTensor, keys F, stride B
    labels          : float32 [B]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

PACKED_SCHEMA = pa.schema(
    [
        ("num_samples", pa.int32()),
        ("labels", pa.large_list(pa.float32())),
        ("dense", pa.large_list(pa.float32())),
        ("lengths", pa.large_list(pa.int32())),
        ("values", pa.large_list(pa.int64())),
    ]
)


def list_lengths_and_values(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (int32) and flat values (int64) of a list column; nulls count as empty lists."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    values = col.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return lengths, values


def pack_table(table: pa.Table, dense_columns: Sequence[str], sparse_features: Sequence[str],
               multi_hot: Sequence[str], label: str) -> pa.Table:
    """Pack a preprocessed table (dense already float, ids already hashed) into one packed row."""
    n = table.num_rows
    labels = table.column(label).to_numpy().astype(np.float32, copy=False)
    if dense_columns:
        dense = np.stack(
            [table.column(c).to_numpy(zero_copy_only=False).astype(np.float32, copy=False) for c in dense_columns],
            axis=1,
        ).reshape(-1)
    else:
        dense = np.zeros(0, dtype=np.float32)
    all_lengths, all_values = [], []
    multi_hot_set = set(multi_hot)
    for name in sparse_features:
        col = table.column(name)
        if name in multi_hot_set:
            lengths, values = list_lengths_and_values(col)
        else:
            values = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            lengths = np.ones(n, dtype=np.int32)
        all_lengths.append(lengths)
        all_values.append(values)
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int32)
    values = np.concatenate(all_values) if all_values else np.zeros(0, np.int64)
    return pa.Table.from_arrays(
        [
            pa.array([n], pa.int32()),
            _single_list(labels, pa.float32()),
            _single_list(dense, pa.float32()),
            _single_list(lengths, pa.int32()),
            _single_list(values, pa.int64()),
        ],
        schema=PACKED_SCHEMA,
    )


def _single_list(arr: np.ndarray, typ: pa.DataType) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array([0, len(arr)], pa.int64()), pa.array(arr, typ))


def _row_values(table: pa.Table, column: str, row: int) -> np.ndarray:
    chunked = table.column(column)
    # Locate the row's chunk, then take its values slice without copying.
    for chunk in chunked.chunks:
        if row < len(chunk):
            offsets = chunk.offsets.to_numpy()
            start, end = offsets[row], offsets[row + 1]
            return chunk.values.slice(start, end - start).to_numpy(zero_copy_only=False)
        row -= len(chunk)
    raise IndexError(row)


def packed_digest(table: pa.Table, row: int = 0) -> str:
    """A content digest of packed row ``row``: the identity a checkpoint records for a trained batch.

    The pipeline's batches are deterministic (fixed file, block and session
    order), so the same batch gets the same digest in every run: a resumed
    epoch skips exactly the batches its checkpoint says were trained.
    """
    h = hashlib.blake2b(digest_size=12)
    one = table.slice(row, 1) if table.num_rows > 1 else table
    for name in one.column_names:
        col = one.column(name)
        arr = col.chunk(0) if isinstance(col, pa.ChunkedArray) and col.num_chunks == 1 else col
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_large_list(arr.type) or pa.types.is_list(arr.type):
            h.update(np.ascontiguousarray(arr.flatten().to_numpy(zero_copy_only=False)).tobytes())
        else:
            h.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- re-cutting (coordinated reads)


def packed_num_samples(table: pa.Table) -> list[int]:
    """Samples of every packed row of ``table`` (its ``num_samples`` column)."""
    return [int(x) for x in table.column("num_samples").to_pylist()]


def _jagged_take(lengths: np.ndarray, values: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns ``idx`` of a feature-major jagged array (``lengths`` [F, n]): new lengths [F, len(idx)] and values.

    Values stay feature-major: feature 0's bags of ``idx`` first, then feature 1's, ...
    """
    f, n = lengths.shape
    offsets = np.zeros(f * n + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    new_lengths = lengths[:, idx]
    flat = new_lengths.reshape(-1).astype(np.int64)
    total = int(flat.sum())
    if total == 0:
        return new_lengths, values[:0]
    starts = offsets[:-1].reshape(f, n)[:, idx].reshape(-1)
    new_offsets = np.cumsum(flat) - flat
    pos = np.repeat(starts - new_offsets, flat) + np.arange(total, dtype=np.int64)
    return new_lengths, values[pos]


def _jagged_concat(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Feature-major jagged arrays side by side (same features): lengths [F, sum n_i] and values."""
    per_feature: list[list[np.ndarray]] = []
    for lengths, values in parts:
        sums = lengths.sum(axis=1).astype(np.int64)
        cuts = np.concatenate([[0], np.cumsum(sums)])
        for f in range(lengths.shape[0]):
            if len(per_feature) <= f:
                per_feature.append([])
            per_feature[f].append(values[cuts[f]:cuts[f + 1]])
    lengths = np.concatenate([p[0] for p in parts], axis=1)
    values = np.concatenate([v for feature in per_feature for v in feature]) if per_feature else parts[0][1][:0]
    return lengths, values


class _Unpacked:
    """One packed row as numpy arrays (plain or dedup), with the widths read from the row itself."""

    def __init__(self, table: pa.Table, row: int = 0) -> None:
        one = table.slice(row, 1) if table.num_rows > 1 else table
        self.dedup = "inverse" in one.schema.names
        self.b = int(one.column("num_samples")[0].as_py())
        col = {name: _row_values(one, name, 0) for name in one.column_names if name not in ("num_samples", "num_users")}
        b = max(self.b, 1)
        self.labels = col["labels"]
        self.dense = col["dense"].reshape(self.b, len(col["dense"]) // b)
        self.lengths = col["lengths"].reshape(len(col["lengths"]) // b, self.b)
        self.values = col["values"]
        if self.dedup:
            self.u = int(one.column("num_users")[0].as_py())
            u = max(self.u, 1)
            self.user_dense = col["user_dense"].reshape(self.u, len(col["user_dense"]) // u)
            self.user_lengths = col["user_lengths"].reshape(len(col["user_lengths"]) // u, self.u)
            self.user_values = col["user_values"]
            self.inverse = col["inverse"].astype(np.int64)

    def take(self, lo: int, hi: int) -> _Unpacked:
        out = object.__new__(_Unpacked)
        out.dedup, out.b = self.dedup, hi - lo
        idx = np.arange(lo, hi)
        out.labels, out.dense = self.labels[lo:hi], self.dense[lo:hi]
        out.lengths, out.values = _jagged_take(self.lengths, self.values, idx)
        if self.dedup:
            users, inverse = np.unique(self.inverse[lo:hi], return_inverse=True)
            out.u, out.inverse = len(users), inverse.reshape(-1).astype(np.int64)
            out.user_dense = self.user_dense[users]
            out.user_lengths, out.user_values = _jagged_take(self.user_lengths, self.user_values, users)
        return out

    def pack(self) -> pa.Table:
        if self.dedup:
            from dlrm_platform.ingest.dedup_batching import pack_dedup_arrays

            return pack_dedup_arrays(
                labels=self.labels, item_dense=self.dense, item_lengths=self.lengths.reshape(-1),
                item_values=self.values, user_dense=self.user_dense, user_lengths=self.user_lengths.reshape(-1),
                user_values=self.user_values, inverse=self.inverse, num_users=self.u)
        return pa.Table.from_arrays(
            [
                pa.array([self.b], pa.int32()),
                _single_list(self.labels.astype(np.float32, copy=False), pa.float32()),
                _single_list(self.dense.astype(np.float32, copy=False).reshape(-1), pa.float32()),
                _single_list(self.lengths.astype(np.int32, copy=False).reshape(-1), pa.int32()),
                _single_list(self.values.astype(np.int64, copy=False), pa.int64()),
            ],
            schema=PACKED_SCHEMA,
        )


def concat_packed(pieces: Sequence[tuple[pa.Table, int, int]]) -> pa.Table:
    """One packed row made of samples ``[lo, hi)`` of each ``(packed row, lo, hi)``, in order.

    Plain and dedup rows alike (all pieces the same kind): the feed service's
    coordinated reads cut the pipeline's batches (whole sessions, variable
    sizes) into per-step batches of equal size with it. A piece that is a
    whole row passes through unchanged when it is the only one.
    """
    if not pieces:
        raise ValueError("concat_packed needs at least one piece")
    if len(pieces) == 1:
        table, lo, hi = pieces[0]
        if lo == 0 and hi == int(table.column("num_samples")[0].as_py()):
            return table
    parts = [_Unpacked(t).take(lo, hi) for t, lo, hi in pieces]
    out = object.__new__(_Unpacked)
    out.dedup = parts[0].dedup
    if any(p.dedup != out.dedup for p in parts):
        raise ValueError("concat_packed: plain and dedup rows mixed")
    out.b = sum(p.b for p in parts)
    out.labels = np.concatenate([p.labels for p in parts])
    out.dense = np.concatenate([p.dense for p in parts])
    out.lengths, out.values = _jagged_concat([(p.lengths, p.values) for p in parts])
    if out.dedup:
        shift = np.cumsum([0] + [p.u for p in parts[:-1]])
        out.u = sum(p.u for p in parts)
        out.inverse = np.concatenate([p.inverse + s for p, s in zip(parts, shift, strict=True)])
        out.user_dense = np.concatenate([p.user_dense for p in parts])
        out.user_lengths, out.user_values = _jagged_concat([(p.user_lengths, p.user_values) for p in parts])
    return out.pack()
