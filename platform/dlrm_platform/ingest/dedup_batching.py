"""Deduplicated training batches (IKJT): the packed contract of the dedup pipeline and its tensors.

A dedup batch of ``B`` samples drawn from whole sessions carries each
session's user-side features once, in ``U <= B`` *user rows*, plus one
inverse index per sample naming its user row; item-side features stay per
sample in an ordinary ``KeyedJaggedTensor``. The user side is an *inverse
keyed jagged tensor* (IKJT): a KJT of stride ``U`` (the unique values) and
the inverse indices (which user row each sample reads). All user-side
features of a sample come from the same session, so one inverse vector
serves every user-side feature (one feature group). Example: user features
``u_cat_0`` (one id) and ``u_history`` (a list), item feature ``i_cat_0``;
5 samples from 3 sessions, the last session cut by the batch boundary::

    sample             0        1        2        3        4
    session            s7       s7       s7       s2       s9  (s9 goes on in the next batch)
    inverse            0        0        0        1        2   -> user row of each sample

    user rows: IKJT values, stride U = 3           item KJT, stride B = 5
                  0         1       2                           0    1    2    3    4
    u_cat_0     [17]      [4]     [9]            i_cat_0      [5]  [8]  [2]  [5]  [7]
    u_history   [3,1,4]   [1,5]   []
    user_dense  [.1 .7]   [.3 .2] [.0 .9]        item dense   [B, Di]      labels [B]

    expanded (what the plain pipeline would have shipped for the same samples):
    u_cat_0     [17] [17] [17] [4] [9]      u_history [3,1,4] [3,1,4] [3,1,4] [1,5] []

Packed as one Arrow row per batch (:data:`DEDUP_PACKED_SCHEMA`). The first
five columns keep the names and types of the plain contract
(:data:`~dlrm_platform.ingest.batching.PACKED_SCHEMA`) and hold the
*item* side, so code that only knows plain batches still reads the labels and
sample counts; the user side is in new columns::

    num_samples  : int32                        B
    labels       : list<float32>   [B]
    dense        : list<float32>   [B * Di]     item-side dense, row-major
    lengths      : list<int32>     [Fi * B]     item KJT lengths, feature-major
    values       : list<int64>                  item KJT values (hashed ids)
    num_users    : int32                        U
    user_dense   : list<float32>   [U * Du]     user-side dense, row-major
    user_lengths : list<int32>     [Fu * U]     user KJT lengths, feature-major
    user_values  : list<int64>                  user KJT values (hashed ids)
    inverse      : list<int32>     [B]          user row of each sample, in [0, U)

A plain packed row has no ``inverse`` column (:func:`is_dedup_packed`):
:func:`~dlrm_platform.train.batches.unpack_batch` keeps reading plain rows
unchanged, :func:`~dlrm_platform.train.batches.unpack_dedup_batch` reads dedup
rows into a :class:`~dlrm_platform.train.batches.DedupBatch` (this module is the
packing side and imports no torch), and ``DedupBatch.expand`` turns one into the plain
``Batch`` of the same samples (dense = user then item columns, KJT keys =
user then item features: the order of :class:`~dlrm_platform.config.DatasetSchema`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dlrm_platform.ingest.batching import PACKED_SCHEMA, _single_list

__all__ = [
    "DEDUP_COLUMNS",
    "DEDUP_PACKED_SCHEMA",
    "is_dedup_packed",
    "pack_dedup_arrays",
    "packed_batch_stats",
]

DEDUP_COLUMNS = ("num_users", "user_dense", "user_lengths", "user_values", "inverse")
DEDUP_PACKED_SCHEMA = pa.schema(
    [
        *PACKED_SCHEMA,
        ("num_users", pa.int32()),
        ("user_dense", pa.large_list(pa.float32())),
        ("user_lengths", pa.large_list(pa.int32())),
        ("user_values", pa.large_list(pa.int64())),
        ("inverse", pa.large_list(pa.int32())),
    ]
)


def is_dedup_packed(table: pa.Table | pa.Schema) -> bool:
    """Whether packed rows follow the dedup contract (they have an ``inverse`` column)."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    return "inverse" in schema.names


def pack_dedup_arrays(
    *,
    labels: np.ndarray,
    item_dense: np.ndarray,
    item_lengths: np.ndarray,
    item_values: np.ndarray,
    user_dense: np.ndarray,
    user_lengths: np.ndarray,
    user_values: np.ndarray,
    inverse: np.ndarray,
    num_users: int,
) -> pa.Table:
    """One packed dedup row from flat numpy buffers (already in the layout of the module docstring)."""
    return pa.Table.from_arrays(
        [
            pa.array([len(labels)], pa.int32()),
            _single_list(labels.astype(np.float32, copy=False), pa.float32()),
            _single_list(item_dense.astype(np.float32, copy=False).reshape(-1), pa.float32()),
            _single_list(item_lengths.astype(np.int32, copy=False), pa.int32()),
            _single_list(item_values.astype(np.int64, copy=False), pa.int64()),
            pa.array([num_users], pa.int32()),
            _single_list(user_dense.astype(np.float32, copy=False).reshape(-1), pa.float32()),
            _single_list(user_lengths.astype(np.int32, copy=False), pa.int32()),
            _single_list(user_values.astype(np.int64, copy=False), pa.int64()),
            _single_list(inverse.astype(np.int32, copy=False), pa.int32()),
        ],
        schema=DEDUP_PACKED_SCHEMA,
    )


def packed_batch_stats(table: pa.Table, row: int = 0) -> dict[str, float]:
    """What a run logs per batch: ``batch_bytes`` (the packed row) and ``dedup_factor`` (samples per user row).

    Works on plain rows too (dedup factor 1: every sample carries its own user features).
    """
    one = table.slice(row, 1) if table.num_rows > 1 else table
    b = int(one.column("num_samples")[0].as_py())
    u = int(one.column("num_users")[0].as_py()) if is_dedup_packed(one) else b
    return {"batch_bytes": float(one.nbytes), "dedup_factor": b / max(u, 1)}
