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
