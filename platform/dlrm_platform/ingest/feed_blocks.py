"""What the feed service hands a worker, and how both sides read it: block refs, steps, sample counts.

Apart from :mod:`.feed_service` because both ends use these: the service (an actor)
builds them from Ray Data's bundles and deals them, a worker's
:class:`~.feed_client.FeedClient` turns them back into packed rows. In *blocks* mode
a worker gets :class:`BlockRef` s (whole blocks, or a bundle's slice of one); in
*steps* mode :class:`Step` s, each a run of :class:`Piece` s of packed rows that
:func:`step_tables` joins into one batch of the step's size. To cut steps the
service needs each packed row's sample count: :func:`ray_sample_counts` reads
it next to the block, so no block crosses the network for its counts.

No torch here: the feed service's actor imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["BlockRef", "Piece", "Step", "bundle_block_refs", "ray_sample_counts", "step_table", "step_tables"]


@dataclass(frozen=True)
class BlockRef:
    """One block of a pass: its object ref and, when the bundle sliced it, the rows ``[start, end)``."""

    ref: Any  # ray.ObjectRef[pyarrow.Table]
    start: int | None = None
    end: int | None = None

    def rows_of(self, table: pa.Table) -> pa.Table:
        """This block's rows of ``table``, the fetched value of :attr:`ref`."""
        return _slice(table, self.start, self.end)


def _slice(table: pa.Table, start: int | None, end: int | None) -> pa.Table:
    return table if start is None else table.slice(start, end - start)


@dataclass(frozen=True)
class Piece:
    """Samples ``[lo, hi)`` of packed row ``row`` of a block (``row`` counts from the block's slice start)."""

    block: BlockRef
    row: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Step:
    """One worker's batch of one step (coordinated reads, *steps* mode): pieces joined in order."""

    pieces: tuple[Piece, ...]
    samples: int


def bundle_block_refs(bundle: Any) -> tuple[list[BlockRef], int, int, float]:
    """A Ray Data ``RefBundle`` as (block refs with their slices, bytes, rows, CPU-seconds of producing them)."""
    slices = getattr(bundle, "slices", None) or (None,) * len(bundle.blocks)
    blocks, nbytes, rows, cpu_s = [], 0, 0, 0.0
    for entry, piece in zip(bundle.blocks, slices, strict=True):
        meta = entry.metadata
        if piece is None:
            blocks.append(BlockRef(entry.ref))
            rows += meta.num_rows or 0
        else:
            blocks.append(BlockRef(entry.ref, piece.start_offset, piece.end_offset))
            rows += piece.end_offset - piece.start_offset
        nbytes += meta.size_bytes or 0
        stats = getattr(meta, "exec_stats", None)
        cpu_s += float(getattr(stats, "cpu_time_s", None) or 0.0)
    return blocks, nbytes, rows, cpu_s


def _count_samples(table: pa.Table, start: int | None, end: int | None) -> list[int]:
    from dlrm_platform.ingest.batching import packed_num_samples

    return packed_num_samples(_slice(table, start, end))


_count_task = None


def ray_sample_counts(blocks: list[BlockRef]) -> list[list[int]]:
    """Samples of each packed row of each block: read here when the block is on this node (zero-copy from the
    object store), else by a zero-CPU task where it lives (no block crosses the network for its counts)."""
    import ray
    from ray.experimental import get_object_locations

    global _count_task
    here = ray.get_runtime_context().get_node_id()
    try:
        where = get_object_locations([b.ref for b in blocks])
    except Exception:  # noqa: BLE001 - no location: let a task find it
        where = {}
    out: list[Any] = []
    for b in blocks:
        if here in (where.get(b.ref) or {}).get("node_ids", []):
            out.append(_count_samples(ray.get(b.ref), b.start, b.end))
        else:
            if _count_task is None:
                _count_task = ray.remote(num_cpus=0)(_count_samples)
            out.append(_count_task.remote(b.ref, b.start, b.end))
    pending = [i for i, x in enumerate(out) if not isinstance(x, list)]
    for i, counts in zip(pending, ray.get([out[i] for i in pending]), strict=True):
        out[i] = counts
    return out


def step_tables(steps: Sequence[Step], get: Callable[[list], list]) -> list[pa.Table]:
    """Each :class:`Step`'s pieces joined into one packed row; their blocks fetched at once (``get``: ``ray.get``)."""
    from dlrm_platform.ingest.batching import concat_packed

    refs = list({_ref_key(p.block.ref): p.block.ref for step in steps for p in step.pieces}.values())
    fetched = dict(zip((_ref_key(r) for r in refs), get(refs), strict=True))
    out = []
    for step in steps:
        parts = []
        for p in step.pieces:
            table = p.block.rows_of(fetched[_ref_key(p.block.ref)])
            parts.append((table.slice(p.row, 1), p.lo, p.hi))
        out.append(concat_packed(parts))
    return out


def step_table(step: Step, get: Callable[[list], list]) -> pa.Table:
    """One :class:`Step` as a packed row (see :func:`step_tables`)."""
    return step_tables([step], get)[0]


def _ref_key(ref: Any) -> Any:
    """An object ref's identity across pickling (its id), or the value itself (fakes in tests)."""
    return ref.hex() if hasattr(ref, "hex") and callable(ref.hex) else ref
