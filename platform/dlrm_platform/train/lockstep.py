"""Lockstep input: every worker's batch of one step, read and unpacked ahead.

Before each step the workers all-reduce ``[has_batch, num_samples]``: they stop
when no worker has a batch, and a worker that is out of data steps on a
one-sample dummy batch (the loop gives it zero weight). A background thread
(:class:`BatchPrefetcher`) reads and unpacks the next batches while the current
step computes; the all-reduce stays on the training thread. Why, and how the
loss is weighted: :mod:`.loop`'s docstring ("Lockstep", "Overlap", "Data wait").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import packed_digest
from dlrm_platform.ingest.dedup_batching import packed_batch_stats
from dlrm_platform.train.dedup_model import batch_codec
from dlrm_platform.train.feed import Decoded
from dlrm_platform.train.perf import indexed_device

__all__ = ["BatchPrefetcher", "Fetched", "StepBatch", "all_reduce_sum", "lockstep_batches"]


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a small CPU tensor over all workers (on the GPU under nccl, which only reduces CUDA tensors)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t
    if dist.get_backend() == "nccl":
        out = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(out)
        return out.cpu()
    dist.all_reduce(t)
    return t


@dataclass
class StepBatch:
    """One worker's input to one lockstep step."""

    batch: Batch  # a real batch, or a one-sample dummy when this worker is out of data
    num_samples: int  # this worker's real samples in the step (0 for a dummy)
    global_samples: int  # real samples of all workers in the step
    wait_s: float  # time until every worker had its batch
    stats: dict[str, float] = field(default_factory=dict)  # packed_batch_stats: batch_bytes, dedup_factor
    digest: str | None = None  # the packed batch's identity (ingest.batching.packed_digest); None for a dummy
    straggler_s: float = 0.0  # of wait_s: after this worker's batch was ready, waiting for the others'


class Fetched(NamedTuple):
    """What :meth:`BatchPrefetcher.get` hands over: the batch as tensors, its stats and its digest."""

    batch: Any
    stats: dict[str, float]
    digest: str | None


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class BatchPrefetcher:
    """This worker's next batches, read from its shard and unpacked up to ``depth`` steps ahead.

    ``get() -> Fetched(batch, stats, digest) | None`` (None once the shard is exhausted, and
    on every call after that). With ``depth >= 1`` a background thread reads
    the packed Arrow rows, unpacks them into tensors (and on CUDA pins them
    and copies them to the device on a side stream) while the trainer
    computes; with ``depth == 0`` each ``get`` does that work itself. At most
    ``limit`` tables are read. An error of the reading thread is raised by
    ``get``. :meth:`close` stops the thread; call it (or use ``with``).
    """

    def __init__(self, tables: Iterator[Any], unpack: Callable[[Any], Any], device: torch.device,
                 depth: int, limit: int | None = None) -> None:
        self._tables = tables
        self._unpack = unpack
        self._device = indexed_device(device)  # the thread's set_device needs an index
        self._limit = limit
        self._read = 0
        self._done = False
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._produce, name="dlrm-batch-prefetch", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ producer side

    def _next_table(self) -> Any | None:
        if self._limit is not None and self._read >= self._limit:
            return None
        table = next(self._tables, None)
        if table is not None:
            self._read += 1
        return table

    def _assemble(self, table: Any, stream: Any) -> tuple[Fetched, Any]:
        if isinstance(table, Decoded):  # unpacked by the feeder (once, then kept by the epoch cache)
            batch, stats, digest = table.value
        else:
            batch = self._unpack(table)  # host tensors
            stats, digest = packed_batch_stats(table), packed_digest(table)
        if self._device.type != "cuda":
            return Fetched(batch, stats, digest), None
        if stream is None:  # synchronous mode
            return Fetched(batch.to(self._device), stats, digest), None
        batch = batch.pin_memory()  # pinning only exists with CUDA (it raises on the CPU build)
        with torch.cuda.stream(stream):
            batch = batch.to(self._device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return Fetched(batch, stats, digest), event

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            stream = None
            if self._device.type == "cuda":
                torch.cuda.set_device(self._device)  # the current device is per thread
                stream = torch.cuda.Stream(device=self._device)
            while not self._stop.is_set():
                table = self._next_table()
                if table is None:
                    break
                if not self._put(self._assemble(table, stream)):
                    return
            self._put(_END)
        except BaseException as err:  # handed to the training thread
            self._put(_Failure(err))

    # ------------------------------------------------------------ consumer side

    def get(self) -> Fetched | None:
        if self._done:
            return None
        if self._thread is None:
            try:
                table = self._next_table()
                item = _END if table is None else self._assemble(table, None)
            except Exception as err:
                item = _Failure(err)
        else:
            item = self._queue.get()
        if item is _END:
            self._done = True
            return None
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        fetched, event = item
        if event is not None:  # the copy ran on the side stream: order it before the step's kernels
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            fetched.batch.record_stream(current)
        return fetched

    def close(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is None:
            return
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("batch prefetch thread still reading after %.0f s; leaving it (daemon)", timeout_s)

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lockstep_batches(source: Any, job: JobConfig, device: torch.device,
                     max_steps: int | None = None) -> Iterator[StepBatch]:
    """Yield this worker's batches in lockstep with the other workers (see module docstring).

    ``source``: the packed tables of this pass (a :class:`~.feed.ShardFeeder` pass), or a
    dataset shard (anything with ``iter_batches``), read here. Ends for all workers at
    once: when none has a batch left, or after ``max_steps``. Batches are unpacked ahead
    by a :class:`BatchPrefetcher` (``ingest.prefetch_batches`` deep).
    """
    unpack, dummy = batch_codec(job, torch.device("cpu"))  # plain Batch or DedupBatch (ingest.dedup), on the host
    if device.type != "cpu":
        dummy = batch_codec(job, device)[1]
    if hasattr(source, "iter_batches"):
        tables = iter(source.iter_batches(batch_size=1, batch_format="pyarrow",
                                          prefetch_batches=job.ingest.prefetch_batches))
    else:
        tables = iter(source)
    with BatchPrefetcher(tables, unpack, device, job.ingest.prefetch_batches, max_steps) as batches:
        steps = 0
        while max_steps is None or steps < max_steps:
            start = time.perf_counter()
            item = batches.get()
            batch, stats, digest = item if item is not None else (None, {}, None)
            n = 0 if batch is None else int(batch.labels.shape[0])
            ready = time.perf_counter()
            flags = all_reduce_sum(torch.tensor([int(batch is not None), n], dtype=torch.int64))
            if int(flags[0]) == 0:
                return
            end = time.perf_counter()
            yield StepBatch(batch if batch is not None else dummy, n, int(flags[1]),
                            end - start, stats, digest, straggler_s=end - ready)
            steps += 1
