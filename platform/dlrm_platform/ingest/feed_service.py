"""The job's feed service: one Ray actor runs the job's dataset passes and hands every block to exactly one trainer.

Why not Ray Train's ``streaming_split``. Its coordinator actor is created only
when the training workers first ask for their shards (Ray Train V2 does that per
worker-group start), and it starts executing only when every worker has asked.
So the pipeline's cold start (the coordinator's and the read tasks' processes,
the executor, Ray Data's stats actor: 5-10 s on 2 cores) began after the
trainers' own start-up (~20 s from ``fit()`` to the loop) instead of under it,
and epoch 0 waited for its first batch. The driver creates this service before
the ``TorchTrainer`` and it starts the first passes at once: by the time a
worker asks, its epoch is streaming or already done.

A *pass* is one execution of a dataset, named ``(dataset, epoch)``. The service
hands each block of a pass to whichever worker asks next, so every sample
reaches exactly one worker once per pass; a worker more than two bundles ahead
of the others waits for them (coordinated reads: the workers step in lockstep,
see :mod:`dlrm_platform.train.lockstep`, and one that took more than its share
would train alone while the others run empty steps). Protocol, per worker and
pass::

    generation = open(name, epoch, rank)      starts the pass if nobody has
    take(name, epoch, generation) -> blocks   until it returns None (the end)

Restarts. A worker that opens a pass it has already opened was restarted (Ray
Train restarts the whole worker group after a failure): the pass starts over as
a new generation, which the other restarted workers join when they open it;
calls with an older generation fail. Exactly-once over a restart is the
trainer's part: its checkpoint lists the batches trained (see
:mod:`dlrm_platform.train.checkpoint`), and the resumed feeder skips them.

Ahead. ``ahead`` passes (the first train and eval passes) start when the service
does, one after the other, as if opened by nobody (*speculative*); opening a
later pass of the same dataset drops them (a resumed run starts at a later
epoch). At most ``max_ahead_bytes`` of blocks wait in the object store per pass
before the service stops pulling (then Ray Data's own backpressure holds the
executor).

No torch here: the actor imports only Ray Data and the ingest operators.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["FeedClient", "FeedService", "PassKey", "start_feed_service"]

log = logging.getLogger("dlrm_platform.ingest.feed")

PassKey = tuple[str, int]  # (dataset name, epoch)
_RETRY = "retry"  # take() found nothing within its timeout: ask again (keeps actor threads free)
_MB = 1 << 20


@dataclass(frozen=True)
class BlockRef:
    """One block of a pass: its object ref and, when the bundle sliced it, the rows ``[start, end)``."""

    ref: Any  # ray.ObjectRef[pyarrow.Table]
    start: int | None = None
    end: int | None = None


@dataclass
class _Pass:
    """One generation of one pass, as the service runs it."""

    name: str
    epoch: int
    generation: int
    speculative: bool
    opened_by: set[int] = field(default_factory=set)
    queue: deque[tuple[list[BlockRef], int, int]] = field(default_factory=deque)  # (blocks, bytes, rows)
    ahead_bytes: int = 0
    done: bool = False
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    started_s: float = 0.0
    first_block_s: float | None = None  # seconds from start to the first block produced
    produced_s: float | None = None  # seconds from start to the last block produced
    first_open_s: float | None = None  # seconds from start to the first worker's open()
    blocks: int = 0
    rows: int = 0
    max_bundle_rows: int = 1
    handed: dict[int, int] = field(default_factory=dict)  # rank -> rows (packed batches) handed to it
    balance_since: dict[int, float] = field(default_factory=dict)  # rank -> since when it waits for the others
    unbalanced: int = 0  # hand-outs that gave up waiting for the others (see FeedService._may_take)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "epoch": self.epoch, "generation": self.generation,
            "blocks": self.blocks, "rows": self.rows,
            "first_block_s": _round(self.first_block_s), "produced_s": _round(self.produced_s),
            "first_open_s": _round(self.first_open_s),
            "handed": {str(k): v for k, v in sorted(self.handed.items())}, "unbalanced": self.unbalanced,
            "error": repr(self.error) if self.error is not None else None,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class FeedService:
    """The actor (see the module docstring). ``datasets``: name -> ray Dataset of packed batches."""

    def __init__(self, datasets: dict[str, Any], ahead: Sequence[PassKey] = (),
                 max_ahead_bytes: int = 256 * _MB, consumers: int = 1) -> None:
        from ray.data import DataContext

        if not datasets:
            raise ValueError("FeedService needs at least one dataset")
        first = next(iter(datasets.values()))
        DataContext._set_current(first.context.copy())  # as Ray's SplitCoordinator does: this process executes them
        self._datasets = dict(datasets)
        self._max_ahead = int(max_ahead_bytes)
        self._consumers = max(1, int(consumers))
        self._lock = threading.Condition()
        self._passes: dict[PassKey, _Pass] = {}
        self._generations: dict[PassKey, int] = {}
        self._ahead = [(str(n), int(e)) for n, e in ahead if n in self._datasets]
        if self._ahead:
            threading.Thread(target=self._run_ahead, name="feed-ahead", daemon=True).start()

    # ----------------------------------------------------------------- workers

    def open(self, name: str, epoch: int, rank: int) -> int:
        """Join pass ``(name, epoch)`` (starting it if needed); returns its generation for :meth:`take`."""
        if name not in self._datasets:
            raise KeyError(f"feed service has no dataset {name!r} (has {sorted(self._datasets)})")
        key = (name, int(epoch))
        with self._lock:
            for other_key, other in list(self._passes.items()):  # a resumed run starts later: drop what it skips
                if other.speculative and other_key[0] == name and other_key[1] < key[1]:
                    self._drop(other)
            p = self._passes.get(key)
            if p is not None and rank in p.opened_by:  # this rank opened it before: its worker was restarted
                log.info("feed: %s epoch %d opened again by rank %d: the pass starts over", name, epoch, rank)
                self._drop(p)
                p = None
            if p is None:
                p = self._start(key, speculative=False)
            if p.first_open_s is None:
                p.first_open_s = time.perf_counter() - p.started_s
            p.speculative = False
            p.opened_by.add(rank)
            return p.generation

    def take(self, name: str, epoch: int, generation: int, rank: int, timeout_s: float = 2.0) -> Any:
        """The next blocks of the pass (a list of :class:`BlockRef`), None at its end, or ``"retry"``."""
        key = (name, int(epoch))
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                p = self._passes.get(key)
                if p is None or p.generation != generation:
                    raise RuntimeError(f"feed: pass {name} epoch {epoch} generation {generation} is gone "
                                       f"(a restarted worker started it over, or a resumed run skipped it)")
                if p.queue and self._may_take(p, rank):
                    blocks, nbytes, rows = p.queue.popleft()
                    p.ahead_bytes -= nbytes
                    p.handed[rank] = p.handed.get(rank, 0) + rows
                    self._lock.notify_all()
                    return blocks
                if p.error is not None:
                    raise p.error
                if p.done and not p.queue:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return _RETRY
                self._lock.wait(min(left, 0.1) if p.queue else left)  # held back by _may_take: look again soon

    def _may_take(self, p: _Pass, rank: int) -> bool:
        """Whether ``rank`` may take the next blocks now: coordinated reads.

        The workers step in lockstep, so a worker that takes more than its share
        only makes the others run empty steps while it trains alone. A worker
        more than two bundles ahead of the one with the least waits for the
        others: up to 60 s while some have not opened the pass yet (they are
        still starting), 2 s once all have (then a worker whose own read-ahead
        is full cannot hold the others up for long).
        """
        if self._consumers == 1:
            return True
        lead = p.handed.get(rank, 0) - min(p.handed.get(r, 0) for r in range(self._consumers))
        now = time.monotonic()
        if lead < 2 * p.max_bundle_rows:
            p.balance_since.pop(rank, None)
            return True
        since = p.balance_since.setdefault(rank, now)
        if now - since > (2.0 if len(p.opened_by) >= self._consumers else 60.0):
            p.balance_since.pop(rank, None)
            p.unbalanced += 1
            return True
        return False

    def describe(self) -> dict[str, Any]:
        """Every pass run so far (latest generation), for the run's summary."""
        with self._lock:
            return {"passes": [p.describe() for p in self._passes.values()]}

    # ----------------------------------------------------------------- producers

    def _start(self, key: PassKey, speculative: bool) -> _Pass:
        """A new generation of ``key``, its producer thread started (call with the lock held)."""
        generation = self._generations.get(key, 0) + 1
        self._generations[key] = generation
        p = _Pass(key[0], key[1], generation, speculative, started_s=time.perf_counter())
        self._passes[key] = p
        threading.Thread(target=self._produce, args=(p,), name=f"feed-{key[0]}-{key[1]}", daemon=True).start()
        return p

    def _drop(self, p: _Pass) -> None:
        """Stop ``p``'s producer and forget it (call with the lock held)."""
        if self._passes.get((p.name, p.epoch)) is p:
            del self._passes[(p.name, p.epoch)]
        p.stop.set()
        p.queue.clear()
        p.ahead_bytes = 0
        self._lock.notify_all()

    def _run_ahead(self) -> None:
        """Start the ``ahead`` passes one after the other (each when the previous has produced its last block)."""
        for key in self._ahead:
            with self._lock:
                p = self._passes.get(key) or self._start(key, speculative=True)
                while not (p.done or p.error is not None or p.stop.is_set()):
                    self._lock.wait(0.2)
                if p.stop.is_set() or p.error is not None:  # dropped (a resumed run) or failed: stop guessing
                    return

    def _produce(self, p: _Pass) -> None:
        try:
            for bundle in self._datasets[p.name].iter_internal_ref_bundles():
                if p.stop.is_set():
                    return
                blocks, nbytes, rows = _block_refs(bundle)
                with self._lock:
                    # Bounded ahead; the first bundle always goes in (a block larger than the bound).
                    while p.ahead_bytes and p.ahead_bytes + nbytes > self._max_ahead and not p.stop.is_set():
                        self._lock.wait(0.2)
                    if p.stop.is_set():
                        return
                    p.queue.append((blocks, nbytes, rows))
                    p.ahead_bytes += nbytes
                    p.blocks += len(blocks)
                    p.rows += rows
                    p.max_bundle_rows = max(p.max_bundle_rows, rows)
                    if p.first_block_s is None:
                        p.first_block_s = time.perf_counter() - p.started_s
                    self._lock.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the workers that take from this pass
            log.warning("feed: %s epoch %d failed: %s", p.name, p.epoch, err)
            with self._lock:
                p.error = err
                self._lock.notify_all()
            return
        with self._lock:
            p.done = True
            p.produced_s = time.perf_counter() - p.started_s
            self._lock.notify_all()


def _block_refs(bundle: Any) -> tuple[list[BlockRef], int, int]:
    """A Ray Data ``RefBundle`` as (block refs with their slices, bytes, rows)."""
    slices = getattr(bundle, "slices", None) or (None,) * len(bundle.blocks)
    blocks, nbytes, rows = [], 0, 0
    for entry, piece in zip(bundle.blocks, slices, strict=True):
        meta = entry.metadata
        if piece is None:
            blocks.append(BlockRef(entry.ref))
            rows += meta.num_rows or 0
        else:
            blocks.append(BlockRef(entry.ref, piece.start_offset, piece.end_offset))
            rows += piece.end_offset - piece.start_offset
        nbytes += meta.size_bytes or 0
    return blocks, nbytes, rows


def start_feed_service(datasets: dict[str, Any], *, consumers: int, ahead: Sequence[PassKey],
                       max_ahead_bytes: int = 256 * _MB, name: str | None = None) -> Any:
    """Create the :class:`FeedService` actor on this node (no CPU: its work is Ray Data's scheduling)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(FeedService).options(
        name=name,
        num_cpus=0,
        # Killed (its process or node gone), Ray starts it again with the same datasets; the workers' calls in
        # flight are retried there and find their passes gone, so Ray Train restarts the group from its last
        # checkpoint, whose data position makes the resumed epochs exactly-once (tests/chaos).
        max_restarts=-1,
        max_task_retries=-1,
        # Each worker holds at most one take() and one open(); +2 for describe() and the ahead thread's peers.
        max_concurrency=2 * max(1, consumers) + 2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
    )
    return actor.remote(datasets, ahead=list(ahead), max_ahead_bytes=max_ahead_bytes, consumers=consumers)


class FeedClient:
    """A worker's view of one dataset of the service: ``iter_pass(epoch)`` yields its share of the pass.

    Yields one-row Arrow tables (one packed batch each), as
    ``DataIterator.iter_batches(batch_size=1, batch_format="pyarrow")`` would.
    The next ``take`` is in flight while the current blocks are yielded.
    """

    def __init__(self, service: Any, name: str, rank: int) -> None:
        self.service = service
        self.name = name
        self.rank = rank

    def iter_pass(self, epoch: int) -> Iterator[pa.Table]:
        import ray

        generation = ray.get(self.service.open.remote(self.name, epoch, self.rank))
        pending = self.service.take.remote(self.name, epoch, generation, self.rank)
        while True:
            blocks = ray.get(pending)
            if blocks is None:
                return
            pending = self.service.take.remote(self.name, epoch, generation, self.rank)
            if isinstance(blocks, str):  # _RETRY: nothing yet
                continue
            tables = ray.get([b.ref for b in blocks])
            for b, table in zip(blocks, tables, strict=True):
                if b.start is not None:
                    table = table.slice(b.start, b.end - b.start)
                for i in range(table.num_rows):
                    yield table.slice(i, 1)
