"""RecD session blocks: one Arrow row per session, its samples nested, read from a shard pair.

The dedup pipeline streams *session blocks*: one Arrow row per session,
holding the user-side columns once and the session's samples as a list of
structs (label and item-side columns)::

    session_id | u_cat_0 | u_history | u_dense_0 | _samples: [{label, i_cat_0, i_dense_0}, ...]

This module joins a ``users``/``samples`` shard pair (:mod:`.dedup_storage`) into
such a block, takes blocks apart and puts them back together for the operators
(:mod:`.dedup_operators`), and is the Ray Data source of the unfused pipeline
(``ReadSessionParquet``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from dlrm_platform.config import DatasetSchema, revalidate
from dlrm_platform.ingest import transforms
from dlrm_platform.ingest.dedup_storage import (
    SAMPLES_COLUMN,
    column_array,
    item_columns,
    key_array,
    require_key,
    user_columns,
)

__all__ = [
    "NO_USER_ROW",
    "SessionParquetDatasource",
    "join_block",
    "join_sessions",
    "read_session_shard",
    "samples_offsets",
    "session_block_to_flat",
    "session_order_of_keys",
    "split_block",
]

NO_USER_ROW = "no user row for the session key"
_IN_MEMORY_FACTOR = 4  # decoded Arrow vs zstd Parquet, roughly


def join_sessions(users: pa.Table, samples: pa.Table, columns: DatasetSchema,
                  quarantine_dir: str | None = None) -> pa.Table:
    """Merge a ``users`` and a ``samples`` table into a session block (one row per session).

    Samples whose key has no user row are quarantined (``parse-*.parquet``,
    reason ``no user row for the session key``). A key twice in ``users`` is an error.
    """
    key = require_key(columns)
    users, samples = users.combine_chunks(), samples.combine_chunks()
    if users.column(key).null_count:
        raise ValueError(f"users table: {users.column(key).null_count} rows without a session key")
    ukeys = key_array(users.column(key))
    if len(ukeys) > 1 and not np.all(ukeys[1:] > ukeys[:-1]):
        order = np.argsort(ukeys, kind="stable")
        users, ukeys = users.take(pa.array(order)), ukeys[order]
        dup = ukeys[1:] == ukeys[:-1]
        if dup.any():
            raise ValueError(f"users table: session key {int(ukeys[1:][dup][0])} appears more than once")
    skey_col = samples.column(key)
    svalid = skey_col.is_valid().to_numpy(zero_copy_only=False) if skey_col.null_count else None
    skeys = pc.fill_null(skey_col, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if len(skeys) > 1 and not np.all(skeys[1:] >= skeys[:-1]):
        order = np.argsort(skeys, kind="stable")
        samples, skeys = samples.take(pa.array(order)), skeys[order]
        svalid = svalid[order] if svalid is not None else None
    pos = np.searchsorted(ukeys, skeys)
    matched = np.zeros(len(skeys), dtype=bool)
    inside = pos < len(ukeys)
    matched[inside] = ukeys[pos[inside]] == skeys[inside]
    if svalid is not None:
        matched &= svalid
    if not matched.all():
        transforms.quarantine(samples.filter(pa.array(~matched)), NO_USER_ROW, quarantine_dir)
        samples = samples.filter(pa.array(matched))
        pos = pos[matched]
    counts = np.bincount(pos, minlength=len(ukeys)).astype(np.int64)
    offsets = np.zeros(len(ukeys) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    names = item_columns(columns)
    struct = pa.StructArray.from_arrays([column_array(samples.column(c)) for c in names], names=names)
    nested = pa.LargeListArray.from_arrays(pa.array(offsets), struct)
    block = users.select([key, *user_columns(columns)])
    return block.append_column(SAMPLES_COLUMN, nested)



def read_session_shard(users_path: str, samples_path: str, columns: DatasetSchema,
                       quarantine_dir: str | None = None) -> pa.Table:
    """Read one shard pair into a session block."""
    key = require_key(columns)
    users = pq.read_table(users_path, columns=[key, *user_columns(columns)])
    samples = pq.read_table(samples_path, columns=[key, *item_columns(columns)])
    return join_sessions(users, samples, columns, quarantine_dir)


def samples_offsets(block: pa.Table) -> np.ndarray:
    """int64 [S + 1]: where each session's samples start in a session block (from 0)."""
    nested = column_array(block.column(SAMPLES_COLUMN))
    offsets = np.asarray(nested.offsets, dtype=np.int64)
    return offsets - offsets[0]


def split_block(block: pa.Table) -> tuple[dict[str, pa.Array], np.ndarray, dict[str, pa.Array]]:
    """(top-level columns by name, sample offsets [S + 1] from 0, per-sample fields by name)."""
    top: dict[str, pa.Array] = {}
    for name in block.column_names:
        if name != SAMPLES_COLUMN:
            top[name] = column_array(block.column(name))
    nested = column_array(block.column(SAMPLES_COLUMN))
    offsets = np.asarray(nested.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    struct = nested.flatten()
    fields = {struct.type.field(i).name: arr for i, arr in enumerate(struct.flatten())}
    return top, offsets, fields


def join_block(top: dict[str, pa.Array], offsets: np.ndarray, fields: dict[str, pa.Array]) -> pa.Table:
    struct = pa.StructArray.from_arrays(list(fields.values()), names=list(fields))
    nested = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), struct)
    return pa.table({**top, SAMPLES_COLUMN: nested})


def session_block_to_flat(block: pa.Table) -> pa.Table:
    """The flat rows of a session block (user columns repeated per sample): for tests and checks."""
    top, offsets, fields = split_block(block)
    counts = np.diff(offsets)
    rep = pa.array(np.repeat(np.arange(len(counts)), counts))
    out = {name: arr.take(rep) for name, arr in top.items()}
    out.update(fields)
    return pa.table(out)


def session_order_of_keys(keys: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random order of a block's sessions (keyed by its keys): batches mix sessions
    from all over the shard, as the plain path's random row order does, yet an epoch is reproducible."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    seed = int(np.bitwise_xor.reduce(keys.astype(np.uint64)) & np.uint64(0xFFFFFFFF)) ^ len(keys)
    return np.random.default_rng(seed).permutation(len(keys))


class SessionParquetDatasource(Datasource):
    """Ray Data source of session blocks: one read task per shard pair (operator ``ReadSessionParquet``)."""

    def __init__(self, shards: Sequence[tuple[str, str]], columns: DatasetSchema, quarantine_dir: str | None) -> None:
        super().__init__()
        self.shards = list(shards)
        self.columns = columns
        self.quarantine_dir = quarantine_dir

    def get_name(self) -> str:
        return "SessionParquet"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(_IN_MEMORY_FACTOR * (os.path.getsize(u) + os.path.getsize(s)) for u, s in self.shards)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        tasks = []
        for u, s in self.shards:
            meta = BlockMetadata(
                num_rows=pq.ParquetFile(u).metadata.num_rows,
                size_bytes=int(_IN_MEMORY_FACTOR * (os.path.getsize(u) + os.path.getsize(s))),
                input_files=[u, s],
                exec_stats=None,
            )
            tasks.append(ReadTask(_ShardReadTask(u, s, self.columns, self.quarantine_dir), meta))
        return tasks


@dataclass(frozen=True)
class _ShardReadTask:
    """Read one shard pair as one session block: a module-level callable, pickled by reference (Ray Data
    pickles every read task at each execution's start; a closure would go by value, code and all)."""

    users_path: str
    samples_path: str
    columns: DatasetSchema
    quarantine_dir: str | None

    def __call__(self) -> Iterable[pa.Table]:  # a Ray Data read task: the schema crossed a Ray boundary
        yield read_session_shard(self.users_path, self.samples_path, revalidate(self.columns), self.quarantine_dir)


