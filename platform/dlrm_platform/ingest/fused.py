"""The fused ingest operator: read, parse, dense, sparse and batch in one task.

When no policy steers the pipeline's operators one by one (``ingest.fusion``,
see :func:`fusion_enabled`), the five named operators run as one Ray Data read
operator (``ReadFusedParquet`` / ``ReadFusedSessions``)::

    read task (one per file or shard pair, or per row-group range of a large file)
      read the Parquet columns once
      flat rows:  for every chunk of 1, 2, 4, then 8 blocks' samples:
                      parse -> dense_transform -> sparse_transform -> batch
      sessions:   parse -> dense_transform -> sparse_transform on the whole shard, then
                  for every chunk of 1, 2, 4, then 8 blocks' sessions (whole, in the shard's order):
                      batch
      yield each chunk's packed batches, ~block_rows samples at a time: one Ray Data block each,
      compacted (one chunk per column: what Ray's Arrow serializer handles fastest)

The functions are the very ones the unfused pipeline runs as separate
operators (:mod:`.transforms`, :mod:`.dedup_operators`), so a fused epoch delivers the
same samples, quarantines the same rows (content-keyed files: once across
epochs) and packs the same batch contract. What fusion removes is the
framework's per-operator cost, measured on the demo: four extra tasks per
block, each with its own scheduling, object-store put and get of the
intermediate table, and the operators' minimum CPU reservations; yielding
several blocks per read task lets the trainer start on a block while its file
is still being transformed. Transforming several blocks' samples per call and
cutting the packed output into blocks costs less than transforming block by
block where the per-call cost per feature weighs (the dedup path: the demo's
read tasks take 0.86-0.88x the CPU; flat rows 0.95-1.05x, no gain), and the
chunks grow from one block so the first block comes as early as before. On the
dedup path only ``batch`` runs per chunk: the per-session transforms run once
on the whole shard, and ``batch`` gathers each chunk's sessions from it in the
shard's order, which saves a reordered copy of the shard (in one process, best
of 7: demo 760k -> 946k samples per CPU-second, Criteo-shaped 528k -> 631k, the
latter now level with the four transforms on whole shards).

Nothing here imports torch: Ray Data workers import this module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from dlrm_platform.config import OPERATOR_NAMES, IngestConfig, TunerConfig, revalidate
from dlrm_platform.ingest import dedup_operators, dedup_sessions, transforms
from dlrm_platform.ingest.batching import PACKED_SCHEMA
from dlrm_platform.ingest.transforms import TransformSpec

__all__ = [
    "BlockPlan",
    "FusedParquetDatasource",
    "FusedSessionDatasource",
    "count_read_tasks",
    "fusion_enabled",
    "split_leaves_no_choice",
    "plan_blocks",
    "probe_bytes_per_sample",
    "preprocess_flat",
    "preprocess_sessions",
]

# Policies that do not need the operators apart: `static` holds the config's numbers; `auto` keeps the
# pipeline fused where fusion is on (fusion pays more than any allocation of split operators: tuner/README.md).
_NON_STEERING_POLICIES = frozenset({"static", "auto"})
_TARGET_BLOCK_BYTES = 8 << 20  # upper bound of one yielded block of packed batches
_BATCHES_PER_BLOCK = 8  # default block: enough batches to amortise a block's overhead, early enough to overlap
# Lower bound of a default block: every block pays Ray the same few ms (the worker's put and generator report,
# the executor's bookkeeping, the consumer's get), so small blocks spend more on Ray than on work. Measured on
# the demo (1 data CPU, pipeline alone, 5 interleaved rounds): median warm epoch 0.27-0.40 s with 1 MiB blocks
# (8 batches), 0.21-0.26 s with 2 MiB.
_MIN_BLOCK_BYTES = 2 << 20
_MAX_ROWS_PER_TASK = 1 << 20  # a larger file is read by several tasks (row-group ranges)
_MAX_BLOCKS_PER_CHUNK = 8  # blocks' samples transformed per call, once the chunks have grown


def fusion_enabled(ingest: IngestConfig, tuner: TunerConfig | None, cpu_budget: float | None = None) -> bool:
    """Whether the job's pipeline runs fused: ``ingest.fusion`` on/off, or auto = no per-operator steering.

    With ``cpu_budget`` (the data CPUs the split pools would be sized for), auto also fuses under a
    steering policy when the budget leaves it nothing to steer (:func:`split_leaves_no_choice`).
    """
    if ingest.fusion == "auto":
        if tuner is None or tuner.policy in _NON_STEERING_POLICIES:
            return True
        return cpu_budget is not None and split_leaves_no_choice(ingest, cpu_budget)
    return ingest.fusion == "on"


def split_leaves_no_choice(ingest: IngestConfig, cpu_budget: float) -> bool:
    """Whether ``cpu_budget`` holds one task of every split operator and no second task of any.

    Every operator needs a task, so such a budget has a single allocation: a policy that steers
    operators one by one has nothing to choose, and the split pipeline pays four hand-offs between
    operators for it (measured on the demo's 1 data CPU, `benchmarks/tuner.py --suite`: split under
    rl, plumber or ray_default 160-180k samples/s alone, fused 390k).
    """
    cpus = [getattr(ingest.operators, name).num_cpus for name in OPERATOR_NAMES]
    return cpu_budget + 1e-9 < sum(cpus) + min(cpus)


@dataclass(frozen=True)
class BlockPlan:
    """How many samples one yielded block holds, and why (reported in the run)."""

    rows: int
    source: str  # "config" or "auto"

    def describe(self) -> str:
        return f"{self.rows:,} samples per block ({self.source})"


def plan_blocks(ingest: IngestConfig, bytes_per_sample: float | None = None) -> BlockPlan:
    """Samples per block: ``ingest.block_rows``, else whole batches: at least ~8 batches and ~2 MiB of packed
    batches (``bytes_per_sample``, measured), at most ~8 MiB.

    Fewer, larger blocks leave nothing to overlap (the trainer waits for a whole
    file's work); many small ones pay Ray's per-block cost (scheduling,
    object-store put/get, one split-coordinator round trip each) more often.
    A multiple of the batch size, so that only a task's last batch is short.
    """
    if ingest.block_rows is not None:
        return BlockPlan(ingest.block_rows, "config")
    batch = ingest.batch_size
    rows = _BATCHES_PER_BLOCK * batch
    if bytes_per_sample and bytes_per_sample > 0:
        floor = math.ceil(_MIN_BLOCK_BYTES / bytes_per_sample / batch) * batch
        cap = int(_TARGET_BLOCK_BYTES // bytes_per_sample) // batch * batch
        rows = min(max(rows, floor), max(batch, cap))  # never below one batch
    return BlockPlan(rows, "auto")


# --------------------------------------------------------------------------- the fused functions


def preprocess_flat(table: pa.Table, spec: TransformSpec, batch_size: int) -> pa.Table:
    """Flat rows -> packed batches (``batching.PACKED_SCHEMA``): the plain pipeline's four operators in one call."""
    table = transforms.sparse_transform(transforms.dense_transform(transforms.parse(table, spec), spec), spec)
    if table.num_rows == 0:
        return PACKED_SCHEMA.empty_table()
    return pa.concat_tables([transforms.batch(table.slice(lo, batch_size), spec)
                             for lo in range(0, table.num_rows, batch_size)])


def preprocess_sessions(block: pa.Table, spec: TransformSpec, batch_size: int) -> pa.Table:
    """A session block -> packed IKJT batches: the dedup pipeline's four operators in one call."""
    block = dedup_operators.sparse_transform(dedup_operators.dense_transform(dedup_operators.parse(block, spec), spec), spec)
    return dedup_operators.batch(block, spec, batch_size)


# --------------------------------------------------------------------------- slicing a read into blocks


def _chunk_rows(block_rows: int) -> Iterator[int]:
    """Samples per transform call: 1, 2, 4, then 8 blocks' worth (the first block as early as one block allows)."""
    blocks = 1
    while True:
        yield blocks * block_rows
        blocks = min(2 * blocks, _MAX_BLOCKS_PER_CHUNK)


def _sample_slices(num_rows: int, block_rows: int) -> Iterator[tuple[int, int]]:
    """(first row, rows) chunks of ``num_rows`` flat rows, growing as :func:`_chunk_rows`."""
    lo, sizes = 0, _chunk_rows(block_rows)
    while lo < num_rows:
        n = min(next(sizes), num_rows - lo)
        yield lo, n
        lo += n


def _session_slices(counts: np.ndarray, block_rows: int) -> Iterator[tuple[int, int]]:
    """(first session, number of sessions) chunks of sessions holding ``counts`` samples each (int [S], in the
    order they are batched), growing as :func:`_chunk_rows`.

    Whole sessions, as many as fit (one, if a single session is larger): with
    ``block_rows`` a multiple of the batch size, a chunk's last batch then falls
    short of full by less than one session, instead of holding the few
    samples that overshoot (measured: a tiny last batch per block, each a
    full-weight optimizer step on a handful of samples, cost the demo 0.02 AUC).
    """
    if len(counts) == 0:
        return
    ends = np.cumsum(counts)
    lo, sizes = 0, _chunk_rows(block_rows)
    while lo < len(counts):
        base = ends[lo - 1] if lo else 0
        hi = int(np.searchsorted(ends, base + next(sizes), side="right"))  # sessions ending within the chunk
        hi = min(max(hi, lo + 1), len(counts))
        yield lo, hi - lo
        lo = hi


def _blocks_of(packed: pa.Table, block_rows: int) -> Iterator[pa.Table]:
    """A chunk's packed batches, cut into blocks of whole batches holding at most ``block_rows`` samples
    (at least one batch each)."""
    ends = np.cumsum(np.asarray(packed.column("num_samples"), dtype=np.int64))
    lo, base = 0, 0
    while lo < packed.num_rows:
        hi = max(int(np.searchsorted(ends, base + block_rows, side="right")), lo + 1)
        # One chunk per column, offsets from 0: Ray's Arrow serializer walks every chunk of a sliced
        # multi-chunk table in Python (measured on the demo's blocks: put 6 -> 2.4 ms, get 1.4 -> 0.5 ms).
        yield packed.slice(lo, hi - lo).combine_chunks()
        base, lo = int(ends[hi - 1]), hi


# --------------------------------------------------------------------------- datasources


def _row_group_ranges(path: str, max_rows: int) -> list[tuple[int, int, int]]:
    """(first row group, number of row groups, rows) ranges of ``path``, each at most ~``max_rows`` rows."""
    meta = pq.ParquetFile(path).metadata
    ranges, start, rows = [], 0, 0
    for i in range(meta.num_row_groups):
        n = meta.row_group(i).num_rows
        if rows and rows + n > max_rows:
            ranges.append((start, i - start, rows))
            start, rows = i, 0
        rows += n
    ranges.append((start, meta.num_row_groups - start, rows))
    return ranges


def count_read_tasks(files: Sequence[str]) -> int:
    """The read tasks :class:`FusedParquetDatasource` makes of ``files`` (one per row-group range)."""
    return sum(len(_row_group_ranges(str(f), _MAX_ROWS_PER_TASK)) for f in files)


def probe_bytes_per_sample(source: Datasource) -> float | None:
    """Packed bytes per sample of ``source``'s first block, read and transformed in this process.

    Ray Data merges the blocks a read task yields until they reach the context's
    ``target_max_block_size`` (128 MiB by default: a whole file as one block, the
    first batch only after the whole file is transformed). The job sets that
    target from this measurement so each planned block travels on its own.
    """
    tasks = source.get_read_tasks(1)
    if not tasks:
        return None
    first = next(iter(tasks[0]()), None)
    if first is None or first.num_rows == 0:
        return None
    samples = int(pa.compute.sum(first.column("num_samples")).as_py() or 0)
    return first.nbytes / samples if samples else None


class FusedParquetDatasource(Datasource):
    """Flat Parquet files -> packed batches, one fused read task per file (or row-group range)."""

    def __init__(self, files: Sequence[str], spec: TransformSpec, batch_size: int, block_rows: int) -> None:
        super().__init__()
        self.files = [str(f) for f in files]
        self.spec = spec
        self.batch_size = batch_size
        self.block_rows = block_rows

    def get_name(self) -> str:
        return "FusedParquet"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(os.path.getsize(f) for f in self.files)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        tasks = []
        for path in self.files:
            size = os.path.getsize(path)
            ranges = _row_group_ranges(path, _MAX_ROWS_PER_TASK)
            total = sum(r[2] for r in ranges) or 1
            for first, count, rows in ranges:
                meta = BlockMetadata(num_rows=None, size_bytes=int(size * rows / total),
                                     input_files=[path], exec_stats=None)
                tasks.append(ReadTask(_FlatReadTask(path, first, count, self.spec, self.batch_size, self.block_rows),
                                      meta))
        return tasks


@dataclass(frozen=True)
class _FlatReadTask:
    """One fused read task over a row-group range of one Parquet file.

    A module-level callable, not a closure: Ray Data pickles every read task at the start of every
    execution (each epoch's pass), and cloudpickle serialises a closure by value, walking its code and
    globals (~2 ms a task on the demo, on the critical path before the first task starts); an instance of
    this class pickles as a reference to it plus its fields.
    """

    path: str
    first_group: int
    num_groups: int
    spec: TransformSpec
    batch_size: int
    block_rows: int

    def __call__(self) -> Iterator[pa.Table]:  # a Ray Data read task: the spec crossed a Ray boundary
        spec = revalidate(self.spec)
        f = pq.ParquetFile(self.path)
        groups = list(range(self.first_group, self.first_group + self.num_groups))
        table = f.read_row_groups(groups, columns=spec.columns.columns) if groups else \
            f.schema_arrow.empty_table().select(spec.columns.columns)
        for lo, n in _sample_slices(table.num_rows, self.block_rows):
            yield from _blocks_of(preprocess_flat(table.slice(lo, n), spec, self.batch_size), self.block_rows)


class FusedSessionDatasource(Datasource):
    """Dedup shard pairs -> packed IKJT batches, one fused read task per pair."""

    def __init__(self, shards: Sequence[tuple[str, str]], spec: TransformSpec, batch_size: int,
                 block_rows: int) -> None:
        super().__init__()
        self.shards = [(str(u), str(s)) for u, s in shards]
        self.spec = spec
        self.batch_size = batch_size
        self.block_rows = block_rows

    def get_name(self) -> str:
        return "FusedSessions"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(os.path.getsize(u) + os.path.getsize(s) for u, s in self.shards)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        return [
            ReadTask(_SessionReadTask(u, s, self.spec, self.batch_size, self.block_rows),
                     BlockMetadata(num_rows=None, size_bytes=os.path.getsize(u) + os.path.getsize(s),
                                   input_files=[u, s], exec_stats=None))
            for u, s in self.shards
        ]


@dataclass(frozen=True)
class _SessionReadTask:
    """One fused read task over one dedup shard pair (a module-level callable: see :class:`_FlatReadTask`)."""

    users_path: str
    samples_path: str
    spec: TransformSpec
    batch_size: int
    block_rows: int

    def __call__(self) -> Iterator[pa.Table]:  # a Ray Data read task: the spec crossed a Ray boundary
        spec = revalidate(self.spec)
        block = dedup_sessions.read_session_shard(self.users_path, self.samples_path, spec.columns,
                                                  spec.quarantine_dir)
        # The per-session transforms touch each session once wherever it lands, so they run on the whole
        # shard; only `batch` runs chunk by chunk. Shards are sorted by session key, so the chunks are
        # consecutive slices of the shard's fixed random session order (or each block, and so a run of
        # consecutive steps, would hold one key range only), which `batch` gathers from the shard as it
        # packs: no reordered copy of the shard (measured on Criteo-shaped sessions: the copy and the
        # per-chunk transforms cost the read tasks ~25% of their CPU).
        block = dedup_operators.sparse_transform(
            dedup_operators.dense_transform(dedup_operators.parse(block, spec), spec), spec)
        order = dedup_operators.batch_order(block, spec)
        counts = np.diff(dedup_sessions.samples_offsets(block))[order]
        for lo, n in _session_slices(counts, self.block_rows):
            yield from _blocks_of(dedup_operators.batch(block, spec, self.batch_size, order[lo:lo + n]),
                                  self.block_rows)
