"""What feeds a trainer its packed batches: a read-ahead thread over its shards, and an epoch cache.

Each training worker consumes its datasets in a fixed order of *passes*::

    train epoch 0, eval epoch 0, train epoch 1, eval epoch 1, ...

A :class:`ShardFeeder` thread walks that order ahead of the training loop,
from the moment the worker starts (the job's feed service,
:mod:`dlrm_platform.ingest.feed_service`, has been running the first passes
since before the workers existed; the feeder takes this worker's share while
the model is being built and sharded), and moves on to the next pass
as soon as the current pass's source is exhausted (so the eval pipeline, and
without a cache the next epoch's, start before the trainer gets there). A
later pass of a dataset whose cache cannot replay (off, or outgrown) streams
once the trainer is in the pass before it: at most one pass of a dataset
ahead of the trainer, and no wait for the end-of-pass replay decision.

The :class:`EpochCache` of a dataset keeps the packed batches of its first
pass (in memory up to a bound, then spilled to local disk as Arrow IPC);
later passes replay them in a fresh order instead of running the Ray Data
pipeline again (tf.data service's ephemeral data, Cachew's autocaching). The
decision to replay is collective (:meth:`ShardFeeder.decide`, called from
the training thread, which owns every collective): every worker replays, or
every worker streams, since a worker that replays while another streams
would let the streaming one take the whole pass from the feed service.
A replay needs every worker's cache complete and the input files unchanged
(:func:`input_fingerprint`). Each sample is delivered exactly once per pass
either way.

Restarts: a worker restored from a checkpoint taken mid-epoch passes the
digests of the batches that epoch already trained (``skip``); the feeder
keeps them out of the pass (the cache still gets them), so over the whole job
every sample of every epoch is trained exactly once.

Memory: a batch kept in the memory cache is already held, so the feeder may
run a whole pass ahead; batches that are spilled or not cached count against
``max_ahead_bytes``, past which the feeder waits for the trainer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dlrm_platform.config import EpochCacheConfig, JobConfig
from dlrm_platform.errors import UserError
from dlrm_platform.train.result import CacheStats, FeederPass, FeederReport

__all__ = [
    "CacheOverflow",
    "Decoded",
    "EpochCache",
    "PassStats",
    "ShardFeeder",
    "batch_fingerprint",
    "input_fingerprint",
]

log = logging.getLogger("dlrm_platform.train")

_MB = 1 << 20


@dataclass(frozen=True)
class Decoded:
    """A packed batch already turned into what the trainer consumes (``ShardFeeder.decode``'s result)."""

    value: Any


class CacheOverflow(UserError):
    """``ingest.cache.mode: on`` and the batches outgrew the configured bounds."""


def _num_samples(table: pa.Table) -> int:
    """Samples in packed batch rows."""
    return int(np.asarray(table.column("num_samples").to_numpy()).sum())


def input_fingerprint(files: Iterable[str | os.PathLike]) -> str:
    """Identifies the bytes a pipeline reads: every file's path, size and modification time."""
    h = hashlib.sha256()
    for f in sorted(str(Path(p).resolve()) for p in files):
        try:
            st = os.stat(f)
            h.update(f"{f}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except FileNotFoundError:
            h.update(f"{f}\tmissing\n".encode())
    return h.hexdigest()[:16]


def batch_fingerprint(job: JobConfig, files: Iterable[str | os.PathLike]) -> str:
    """The cache key of a dataset's packed batches: the input files and everything that shapes a batch.

    Columns, transforms (table sizes, history length, dense transform),
    batch size, dedup, fusion and block size: a change to any of them, or to
    an input file, gives a different key.
    """
    ingest = job.ingest
    shaping = {
        "columns": job.data.columns.model_dump(mode="json"),
        "batch_size": ingest.batch_size,
        "hash_size": ingest.hash_size,
        "hash_sizes": ingest.hash_sizes,
        "max_history_length": ingest.max_history_length,
        "dense_log1p": ingest.dense_log1p,
        "dedup": job.dedup_enabled,
        "fusion": ingest.fusion,
        "block_rows": ingest.block_rows,
    }
    h = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode())
    h.update(input_fingerprint(files).encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- the cache


class EpochCache:
    """The packed batches of one dataset's first pass on this worker: memory first, then local disk.

    :meth:`add` returns whether the batch was kept; once a batch does not fit
    (``auto``) the cache is *abandoned* (it will not be replayed) and frees
    what it held; under ``on`` it raises :class:`CacheOverflow` instead.
    After :meth:`seal` a complete cache replays its batches with
    :meth:`replay`, in an order drawn from ``(seed, pass)``.
    """

    def __init__(self, name: str, config: EpochCacheConfig, spill_dir: Path, key: str) -> None:
        self.name = name
        self.config = config
        self.key = key
        self.spill_dir = Path(spill_dir) / f"{name}-{key}"
        self._memory: list[pa.Table | Decoded | None] = []  # None where the batch was spilled
        self._spilled: dict[int, int] = {}  # batch position -> record batch index in the spill file
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self.memory_bytes = 0
        self.disk_bytes = 0
        self.samples = 0
        self.complete = False
        self.abandoned = config.mode == "off"
        self.reason = "ingest.cache.mode is off" if self.abandoned else ""

    @property
    def enabled(self) -> bool:
        return not self.abandoned

    @property
    def num_batches(self) -> int:
        return len(self._memory)

    @property
    def spill_path(self) -> Path:
        return self.spill_dir / "batches.arrow"

    def add(self, table: pa.Table, decoded: Decoded | None = None) -> str:
        """Keep ``table``: returns ``"memory"``, ``"disk"`` or ``""`` (not kept: cache off or abandoned).

        In memory the cache keeps ``decoded`` when given (the trainer's tensors, about the
        table's size: a replay then costs no unpacking), else the table; on disk, the table.
        """
        if self.abandoned or self.complete:
            return ""
        size = int(table.nbytes)
        if self.memory_bytes + size <= self.config.memory_mb * _MB:
            self._memory.append(decoded if decoded is not None else table)
            self.memory_bytes += size
            self._count(table)
            return "memory"
        if self.disk_bytes + size <= self.config.disk_mb * _MB:
            self._spill(table)
            self.disk_bytes += size
            self._count(table)
            return "disk"
        reason = (f"the {self.name} batches outgrew ingest.cache.memory_mb={self.config.memory_mb:g} + "
                  f"disk_mb={self.config.disk_mb:g} after {self.num_batches} batches")
        if self.config.mode == "on":
            raise CacheOverflow(f"{reason}; raise those bounds, or set ingest.cache.mode: auto to run the "
                                "pipeline every epoch when the batches do not fit")
        self.abandon(reason)
        return ""

    def _count(self, table: pa.Table) -> None:
        self.samples += _num_samples(table)

    def _spill(self, table: pa.Table) -> None:
        if self._writer is None:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            try:
                self._writer = pa.ipc.new_file(str(self.spill_path), table.schema)
            except OSError as err:
                raise UserError(f"cannot spill the epoch cache to {self.spill_path}: {err}; set "
                                "ingest.cache.spill_dir to a writable local directory") from err
        self._spilled[len(self._memory)] = len(self._spilled)
        self._memory.append(None)
        self._writer.write_table(table.combine_chunks())

    def seal(self) -> None:
        """The pass's source is exhausted: the cache holds the whole pass."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self.abandoned:
            self.complete = True

    def abandon(self, reason: str) -> None:
        """Stop caching and free what is held; later passes run the pipeline."""
        if not self.abandoned:
            log.info("epoch cache %s: off for this job (%s)", self.name, reason)
        self.abandoned, self.complete, self.reason = True, False, reason
        self.close()

    def replay(self, seed: int) -> Iterator[pa.Table | Decoded]:
        """Every kept batch once (a table, or what :meth:`add` was given decoded), in an order drawn from ``seed``."""
        if not self.complete:
            raise RuntimeError(f"epoch cache {self.name} is not complete")
        if self._spilled and self._reader is None:
            self._reader = pa.ipc.open_file(pa.memory_map(str(self.spill_path), "r"))
        order = np.random.default_rng(seed).permutation(self.num_batches)
        for i in order:
            table = self._memory[i]
            if table is None:
                table = pa.Table.from_batches([self._reader.get_batch(self._spilled[int(i)])])
            yield table

    def describe(self) -> CacheStats:
        return CacheStats(
            state="complete" if self.complete else ("off" if self.abandoned else "filling"),
            batches=self.num_batches,
            samples=self.samples,
            memory_mb=round(self.memory_bytes / _MB, 2),
            disk_mb=round(self.disk_bytes / _MB, 2),
            reason=self.reason,
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._reader = None
        self._memory, self._spilled = [], {}
        self.memory_bytes = self.disk_bytes = 0
        shutil.rmtree(self.spill_dir, ignore_errors=True)


# --------------------------------------------------------------------------- one pass


@dataclass
class PassStats:
    """How one pass was fed: where from, and how fast."""

    name: str
    epoch: int
    source: str = ""  # "pipeline" or "cache"
    batches: int = 0
    samples: int = 0
    started_s: float = 0.0  # feeder clock: when the source was opened
    skipped: int = 0  # batches a restored checkpoint had already trained in this pass
    first_batch_s: float | None = None  # seconds from opening the source to its first batch
    source_s: float | None = None  # seconds until the source was exhausted

    def report(self) -> FeederPass:
        """The pass as the run's summary reads it (its feeder-clock start left out)."""
        return FeederPass(name=self.name, epoch=self.epoch, source=self.source, batches=self.batches,
                          samples=self.samples, skipped=self.skipped, first_batch_s=self.first_batch_s,
                          source_s=self.source_s)


class _Pass:
    """The hand-off of one pass between the feeder thread and the training thread."""

    def __init__(self, name: str, epoch: int, max_ahead_bytes: int) -> None:
        self.stats = PassStats(name, epoch)
        self._items: deque[tuple[Any, int]] = deque()  # (table or Decoded, bytes counted against the bound)
        self._ahead_bytes = 0
        self._max_ahead = max_ahead_bytes
        self._done = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.finished = threading.Event()  # the producer is done with this pass
        self.requested = threading.Event()  # the trainer asked for this pass

    # producer
    def put(self, item: Any, nbytes: int, bounded: bool, stop: threading.Event) -> bool:
        """Hand ``item`` over; a ``bounded`` one (not held by the cache) waits while too much is ahead."""
        size = nbytes if bounded else 0
        with self._cond:
            while size and self._ahead_bytes and self._ahead_bytes + size > self._max_ahead:
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
            self._items.append((item, size))
            self._ahead_bytes += size
            self._cond.notify_all()
        return True

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._done, self._error = True, error
            self._cond.notify_all()
        self.finished.set()

    # consumer
    def tables(self) -> Iterator[pa.Table]:
        self.requested.set()
        while True:
            with self._cond:
                while not self._items and not self._done:
                    self._cond.wait()
                if self._items:
                    table, size = self._items.popleft()
                    self._ahead_bytes -= size
                    self._cond.notify_all()
                elif self._error is not None:
                    raise self._error
                else:
                    return
            yield table


# --------------------------------------------------------------------------- the feeder


@dataclass
class _Dataset:
    name: str
    shard: Any  # ray.data.DataIterator (or any object with iter_batches)
    files: Sequence[str]
    cache: EpochCache
    replay: bool | None = None  # decided collectively after the first pass: None until then
    fingerprint: str = ""


@dataclass
class ShardFeeder:
    """Reads this worker's passes ahead of the training loop (see the module docstring).

    ``shards``: dataset name -> (shard, input files); ``order``: the passes
    ``[(name, epoch), ...]`` in the order the loop consumes them; ``limits``:
    at most this many batches per pass of a dataset (``max_steps_per_epoch``).
    Use :meth:`tables` for each pass in ``order``, :meth:`decide` after the
    first pass of each dataset (a collective), :meth:`close` at the end.
    """

    job: JobConfig
    shards: dict[str, tuple[Any, Sequence[str]]]
    order: list[tuple[str, int]]
    spill_dir: Path
    rank: int = 0
    limits: dict[str, int | None] = field(default_factory=dict)
    prefetch_batches: int = 2
    max_ahead_bytes: int = 256 * _MB
    decode: Callable[[pa.Table], Any] | None = None  # table -> what the trainer consumes, run on this thread
    digest: Callable[[pa.Table], str] | None = None  # table -> its identity (needed with ``skip``)
    skip: dict[tuple[str, int], frozenset[str]] = field(default_factory=dict)  # pass -> batches already trained
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        cache_cfg = self.job.ingest.cache
        self._datasets: dict[str, _Dataset] = {}
        for name, (shard, files) in self.shards.items():
            key = f"{batch_fingerprint(self.job, files)}-rank{self.rank}"
            self._datasets[name] = _Dataset(name, shard, list(files), EpochCache(name, cache_cfg, self.spill_dir, key),
                                            fingerprint=input_fingerprint(files))
        ahead = self.max_ahead_bytes if self.job.ingest.read_ahead else 0  # off: one batch ahead at most
        self._passes = {p: _Pass(*p, ahead) for p in self.order}
        self._decided = {name: threading.Event() for name in self._datasets}
        self._stop = threading.Event()
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self._run, name="dlrm-shard-feeder", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- training thread

    def tables(self, name: str, epoch: int) -> Iterator[pa.Table | Decoded]:
        """The packed batches of pass ``(name, epoch)`` as the feeder reads them (:class:`Decoded` with ``decode``)."""
        return self._passes[(name, epoch)].tables()

    def stats(self, name: str, epoch: int) -> PassStats:
        return self._passes[(name, epoch)].stats

    def cache(self, name: str) -> EpochCache:
        return self._datasets[name].cache

    def replays(self, name: str) -> bool | None:
        return self._datasets[name].replay

    def decide(self, name: str, all_reduce_min: Callable[[int], int]) -> bool:
        """After this worker consumed the first pass of ``name``: replay its cache in later passes?

        ``all_reduce_min`` takes this worker's vote (1 = my cache is complete and my
        input unchanged) and returns the minimum over all workers: a collective,
        so every worker calls it at the same point of the loop.
        """
        ds = self._datasets[name]
        if ds.replay is not None:
            return ds.replay
        first = next(p for p in self.order if p[0] == name)
        self._passes[first].finished.wait()  # the source is exhausted (or failed) and the cache sealed
        unchanged = input_fingerprint(ds.files) == ds.fingerprint
        mine = int(ds.cache.complete and unchanged)
        ds.replay = bool(all_reduce_min(mine))
        if not ds.replay:
            why = ds.cache.reason or ("an input file changed" if not unchanged else "another worker's cache is incomplete")
            ds.cache.abandon(why)
        self._decided[name].set()
        return ds.replay

    def describe(self) -> FeederReport:
        """Cache state and per-pass figures, for the run's summary."""
        return FeederReport(
            caches={n: d.cache.describe().model_copy(update={"replayed": bool(d.replay)})
                    for n, d in self._datasets.items()},
            passes=[p.stats.report() for p in self._passes.values() if p.stats.source],
        )

    def close(self) -> None:
        self._stop.set()
        for p in self._passes.values():
            p.finish()
        self._thread.join(timeout=5)
        for d in self._datasets.values():
            d.cache.close()

    def __enter__(self) -> ShardFeeder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- feeder thread

    def _run(self) -> None:
        seen: set[str] = set()
        for name, epoch in self.order:
            if self._stop.is_set():
                return
            p = self._passes[(name, epoch)]
            ds = self._datasets[name]
            if not self.job.ingest.read_ahead:  # ingest.read_ahead off: start a pass when it is asked for
                while not p.requested.wait(0.1):
                    if self._stop.is_set():
                        return
            try:
                first_pass = name not in seen
                if not first_pass:
                    if not self._wait_to_follow(name, epoch, ds):
                        return
                    if ds.replay:
                        self._feed_replay(p, ds, epoch)
                        continue
                seen.add(name)
                self._feed_pipeline(p, ds, first_pass=first_pass)
            except BaseException as err:  # noqa: BLE001 - handed to the training thread
                for later in list(self._passes.values())[list(self._passes).index((name, epoch)):]:
                    later.finish(err)
                return

    def _wait_to_follow(self, name: str, epoch: int, ds: _Dataset) -> bool:
        """Before a later pass of ``name``: a replay starts once the collective decision says so. A stream
        starts once the trainer has asked for the pass before it (at most one pass of the dataset ahead of
        the trainer: passes not held by the cache never pile up), without waiting for the decision where
        this worker's own vote already makes it (its cache is incomplete: off, abandoned, outgrown; the
        decision is the minimum over the workers, so every worker streams). False: the feeder is closing.
        """
        before = max(e for n, e in self.order if n == name and e < epoch)
        previous = self._passes[(name, before)]

        def ready() -> bool:
            if self._decided[name].is_set() and ds.replay:
                return True
            streams = self._decided[name].is_set() or not ds.cache.complete
            return streams and previous.requested.is_set()

        while not ready():
            if self._stop.wait(0.1):
                return False
        return True

    def _feed_pipeline(self, p: _Pass, ds: _Dataset, first_pass: bool) -> None:
        p.stats.source, p.stats.started_s = "pipeline", self.clock()
        limit = self.limits.get(ds.name)
        skip = self.skip.get((p.stats.name, p.stats.epoch), frozenset())
        if skip and self.digest is None:
            raise ValueError("ShardFeeder: skipping trained batches needs a digest function")
        if hasattr(ds.shard, "iter_pass"):  # the job's feed service (ingest.feed_client.FeedClient)
            it = iter(ds.shard.iter_pass(p.stats.epoch))
        else:  # a Ray DataIterator: each call is the next execution
            it = iter(ds.shard.iter_batches(batch_size=1, batch_format="pyarrow",
                                            prefetch_batches=max(1, self.prefetch_batches)))
        while limit is None or p.stats.batches + p.stats.skipped < limit:
            table = next(it, None)
            if table is None:
                break
            item = self._decode(table)
            kept = ds.cache.add(table, item if isinstance(item, Decoded) else None) if first_pass else ""
            if skip and self.digest(table) in skip:  # trained before the restart: cached, not handed over
                p.stats.skipped += 1
                continue
            self._record(p, _num_samples(table))
            if not p.put(item, int(table.nbytes), bounded=kept != "memory", stop=self._stop):
                return
        p.stats.source_s = self.clock() - p.stats.started_s
        if first_pass:
            ds.cache.seal()
        p.finish()

    def _feed_replay(self, p: _Pass, ds: _Dataset, epoch: int) -> None:
        p.stats.source, p.stats.started_s = "cache", self.clock()
        for entry in ds.cache.replay(seed=self.job.train.seed * 1_000_003 + epoch * 7919 + self.rank):
            item = entry if isinstance(entry, Decoded) else self._decode(entry)
            self._record(p, 0)  # a decoded entry has no packed row to count: the pass total is the cache's
            if not p.put(item, 0, bounded=False, stop=self._stop):
                return
        p.stats.samples = ds.cache.samples
        p.stats.source_s = self.clock() - p.stats.started_s
        p.finish()

    def _decode(self, table: pa.Table) -> pa.Table | Decoded:
        return Decoded(self.decode(table)) if self.decode is not None else table

    def _record(self, p: _Pass, samples: int) -> None:
        if p.stats.first_batch_s is None:
            p.stats.first_batch_s = self.clock() - p.stats.started_s
        p.stats.batches += 1
        p.stats.samples += samples
