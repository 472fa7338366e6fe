"""The feed service: one Ray actor runs dataset passes and hands every block to exactly one trainer.

Why not Ray Train's ``streaming_split``. Its coordinator actor is created only
when the training workers first ask for their shards (Ray Train V2 does that per
worker-group start), and it starts executing only when every worker has asked.
So the pipeline's cold start (the coordinator's and the read tasks' processes,
the executor, Ray Data's stats actor: 5-10 s on 2 cores) began after the
trainers' own start-up (~20 s from ``fit()`` to the loop) instead of under it,
and epoch 0 waited for its first batch. The driver creates this service before
the ``TorchTrainer`` and it starts the first passes at once: by the time a
worker asks, its epoch is streaming or already done.

A *stream* is one execution of a dataset pass ``(dataset, epoch)``; a job reads
a stream through its *pass* (its own cursor). Each block a job reads goes to
whichever of its workers asks next, so every sample reaches exactly one worker
of the job once per pass. Protocol, per worker and pass::

    generation = open(name, epoch, rank, job)      joins (or starts) the pass's stream
    take(name, epoch, generation, rank, job=job)   blocks (or a Step) until None (the end)

Coordinated reads (two modes, per job):

* *blocks* (``step_samples`` None): a worker more than two bundles ahead of
  the others waits for them (the workers step in lockstep, see
  :mod:`dlrm_platform.train.lockstep`; one that took more than its share
  would train alone while the others run empty steps). The pipeline's batches
  are whole sessions, so their sizes still differ from worker to worker.
* *steps* (``step_samples`` = the batch size): the service deals *steps*. It
  knows each packed batch's sample count and cuts the stream into steps of
  ``consumers`` batches of exactly ``step_samples`` samples each, one per worker
  (:class:`~.feed_blocks.Step`: pieces of the pipeline's batches, which the worker's
  :class:`~.feed_client.FeedClient` joins with :func:`~dlrm_platform.ingest.batching.concat_packed`).
  Every step gives every worker a batch of the same size, so none waits at the
  collective for another's (longer) step; only a pass's last step can differ,
  by at most one sample per worker.

Sharing. A service started by :func:`~.feed_client.start_shared_feed_service` is a named,
detached actor keyed by the pipeline's fingerprint (the epoch cache's,
:func:`dlrm_platform.train.feed.batch_fingerprint`): a second job whose
pipelines have the same fingerprint attaches to it instead of executing its
own. Streams keep the blocks their readers have passed (up to
``retain_bytes``), so a job that opens a pass late reads the same stream from
its first block: it sees every sample of its epoch and pays no preprocessing.
A stream whose first blocks are gone cannot be joined: the late job gets a
stream of its own. A stream is dropped as soon as no job reads it, the service
when no job is attached (:meth:`FeedService.detach`, or a job silent longer
than its lease). ``describe(job)`` (a :class:`~.feed_report.FeedReport`) says whether a job was served
from a shared stream and the CPU-seconds it saved (the producing tasks' CPU time, from the
blocks' exec stats: the whole pipeline when fused, its last operator otherwise).

Restarts. A worker that opens a pass it has already opened was restarted (Ray
Train restarts the whole worker group after a failure): the job's pass starts
over as a new generation, which its other restarted workers join when they
open it; calls with an older generation fail. The new generation replays the
same stream when its first block is still held, else runs a new one.
Exactly-once over a restart is the trainer's part: its checkpoint lists the
batches trained (see :mod:`dlrm_platform.train.checkpoint`), and the resumed
feeder skips them.

Ahead. ``ahead`` passes (the first train and eval passes) start when a job
attaches, one after the other, before anyone reads them (*speculative*);
opening a later pass of the same dataset drops those nobody reads (a resumed
run starts at a later epoch). At most ``max_ahead_bytes`` of blocks not yet read
by every reader wait in the object store per stream before the service stops
pulling (then Ray Data's own backpressure holds the executor).

This module is the actor; the job's side (start, attach, read a pass) is :mod:`.feed_client`, what it hands
out :mod:`.feed_blocks`, its report :mod:`.feed_report`. No torch: the actor imports only Ray Data and ingest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlrm_platform.ingest.feed_blocks import BlockRef, Piece, Step, bundle_block_refs, ray_sample_counts
from dlrm_platform.ingest.feed_report import FeedReport, PassStats, SharingStats

__all__ = ["DEFAULT_JOB", "FeedService", "PassKey"]

log = logging.getLogger("dlrm_platform.ingest.feed")

PassKey = tuple[str, int]  # (dataset name, epoch)
_RETRY = "retry"  # take() found nothing within its timeout: ask again (keeps actor threads free)
_MB = 1 << 20
DEFAULT_JOB = ""  # the job of a service started for one job (start_feed_service)


@dataclass
class _Bundle:
    blocks: list[BlockRef]
    nbytes: int
    rows: int
    counts: list[list[int]] | None  # samples of each packed row, per block (steps mode)
    cpu_s: float


@dataclass
class _Stream:
    """One execution of one pass, with the blocks its readers have not all passed (and some they have)."""

    name: str
    epoch: int
    started_s: float
    bundles: deque[_Bundle] = field(default_factory=deque)
    base: int = 0  # index of bundles[0]; the ones before are released (a job cannot join from the start)
    done: bool = False
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    readers: dict[str, _Pass] = field(default_factory=dict)  # job -> its pass, while it reads
    jobs: list[str] = field(default_factory=list)  # every job that read it, first (the one that paid) first
    cpu_s: float = 0.0
    blocks: int = 0
    rows: int = 0
    max_bundle_rows: int = 1
    first_block_s: float | None = None
    produced_s: float | None = None

    @property
    def end(self) -> int:
        return self.base + len(self.bundles)

    def bytes_from(self, index: int) -> int:
        return sum(b.nbytes for b in list(self.bundles)[max(0, index - self.base):])


@dataclass
class _Pass:
    """One job's reading of a stream (one generation)."""

    job: str
    name: str
    epoch: int
    generation: int
    stream: _Stream
    started_s: float
    cursor: int = 0
    opened_by: set[int] = field(default_factory=set)
    first_open_s: float | None = None
    handed: dict[int, int] = field(default_factory=dict)  # rank -> packed batches (blocks) or samples (steps)
    balance_since: dict[int, float] = field(default_factory=dict)  # rank -> since when it waits for the others
    unbalanced: int = 0  # hand-outs that gave up waiting for the others (see FeedService._may_take)
    joined_late: bool = False  # the stream had produced blocks before this pass joined it
    # steps mode: samples not dealt yet, and each rank's dealt steps
    pool: deque[list] = field(default_factory=deque)  # [BlockRef, row, lo, hi]: batches of another size, or cut
    whole: deque[list] = field(default_factory=deque)  # [BlockRef, row, 0, size]: batches of exactly the step size
    pool_samples: int = 0  # in pool and whole
    rest_samples: int = 0  # in pool
    recut_steps: int = 0  # per-rank batches joined from pieces (the others are the pipeline's batches as they are)
    ready: dict[int, deque[Step]] = field(default_factory=dict)
    steps: int = 0
    uneven_steps: int = 0

    def describe(self) -> PassStats:
        s = self.stream
        return PassStats(
            name=self.name, epoch=self.epoch, generation=self.generation, blocks=s.blocks, rows=s.rows,
            first_block_s=_round(s.first_block_s), produced_s=_round(s.produced_s),
            first_open_s=_round(self.first_open_s),
            handed={str(k): v for k, v in sorted(self.handed.items())}, unbalanced=self.unbalanced,
            steps=self.steps, uneven_steps=self.uneven_steps, recut=self.recut_steps,
            shared=len(s.jobs) > 1, paid=bool(s.jobs) and s.jobs[0] == self.job,
            joined_late=self.joined_late, cpu_s=round(s.cpu_s, 3),
            error=repr(s.error) if s.error is not None else None,
        )


@dataclass
class _Job:
    consumers: int
    step_samples: int | None
    seen: float


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class FeedService:
    """The actor (see the module docstring). ``datasets``: name -> ray Dataset of packed batches.

    ``consumers``, ``step_samples`` and ``ahead`` are the default job's (``job=""``);
    other jobs say theirs in :meth:`attach`. ``retain_bytes``: blocks kept after
    every reader passed them, for jobs that join late (0: none, no sharing).
    ``sample_counts(blocks) -> [[samples of each packed row] per block]`` (steps
    mode; default: a zero-CPU Ray task next to each block reads its ``num_samples``).
    """

    def __init__(self, datasets: dict[str, Any], ahead: Sequence[PassKey] = (),
                 max_ahead_bytes: int = 256 * _MB, consumers: int = 1, step_samples: int | None = None,
                 retain_bytes: int = 0, sample_counts: Callable[[list[BlockRef]], list[list[int]]] | None = None,
                 lease_s: float | None = None) -> None:
        from ray.data import DataContext

        if not datasets:
            raise ValueError("FeedService needs at least one dataset")
        first = next(iter(datasets.values()))
        DataContext._set_current(first.context.copy())  # as Ray's SplitCoordinator does: this process executes them
        self._datasets = dict(datasets)
        self._max_ahead = int(max_ahead_bytes)
        self._retain = max(0, int(retain_bytes))
        self._sample_counts = sample_counts or ray_sample_counts
        self._lease_s = lease_s
        self._lock = threading.Condition()
        self._streams: dict[PassKey, _Stream] = {}  # the joinable stream of each pass
        self._passes: dict[tuple[str, str, int], _Pass] = {}
        self._finished: list[_Pass] = []  # passes a newer generation replaced, for describe()
        self._generations: dict[tuple[str, str, int], int] = {}
        self._jobs: dict[str, _Job] = {}
        self._closing = False
        self._attach_locked(DEFAULT_JOB, consumers, step_samples, ahead)
        self._watch_nodes()
        if lease_s is not None:
            threading.Thread(target=self._reap, name="feed-lease", daemon=True).start()

    @staticmethod
    def _watch_nodes() -> None:
        """Data nodes that join while a pass streams get its tasks within seconds (elastic scale-out).

        Ray Data's own view of the cluster lags up to 20 s; the hook lives in the tuner's
        ``ray_hooks``, the one module allowed to touch Ray Data internals.
        """
        import ray

        if ray.is_initialized():
            from dlrm_platform.tuner.ray_hooks import keep_cluster_view_fresh

            keep_cluster_view_fresh()

    # ----------------------------------------------------------------- jobs

    def attach(self, job: str, consumers: int, step_samples: int | None = None,
               ahead: Sequence[PassKey] = ()) -> int:
        """Register ``job`` (its workers, its coordinated-reads mode) and start its ``ahead`` passes.

        Returns how many jobs are attached now. Raises when the service is closing
        (its last job detached): the caller starts a new one.
        """
        with self._lock:
            if self._closing:
                raise RuntimeError("feed service is closing")
            self._attach_locked(job, consumers, step_samples, ahead)
            return len(self._jobs)

    def _attach_locked(self, job: str, consumers: int, step_samples: int | None, ahead: Sequence[PassKey]) -> None:
        self._jobs[job] = _Job(max(1, int(consumers)), int(step_samples) if step_samples else None, time.monotonic())
        keys = [(str(n), int(e)) for n, e in ahead if n in self._datasets]
        if keys:
            threading.Thread(target=self._run_ahead, args=(keys,), name="feed-ahead", daemon=True).start()

    def heartbeat(self, job: str) -> bool:
        with self._lock:
            if job in self._jobs:
                self._jobs[job].seen = time.monotonic()
                return True
            return False

    def detach(self, job: str) -> int:
        """``job`` is done: it stops reading its streams. Returns the jobs left; at 0 the service closes."""
        with self._lock:
            self._detach_locked(job)
            left = len([j for j in self._jobs if j != DEFAULT_JOB or self._lease_s is None])
            if left == 0 and self._lease_s is not None:
                self._closing = True
            return left

    def _detach_locked(self, job: str) -> None:
        self._jobs.pop(job, None)
        for key, p in list(self._passes.items()):
            if key[0] == job:
                self._leave(p)
        self._lock.notify_all()

    def _reap(self) -> None:
        """Jobs silent longer than the lease are detached; with none left the actor exits."""
        while True:
            time.sleep(min(5.0, self._lease_s or 5.0))
            with self._lock:
                now = time.monotonic()
                for job, info in list(self._jobs.items()):
                    if job != DEFAULT_JOB and now - info.seen > self._lease_s:
                        log.warning("feed: job %s silent for %.0f s: detached", job, now - info.seen)
                        self._detach_locked(job)
                if not [j for j in self._jobs if j != DEFAULT_JOB]:
                    self._closing = True
            if self._closing:
                _end_this_actor()
                return

    def _job(self, job: str) -> _Job:
        info = self._jobs.get(job)
        if info is None:
            raise KeyError(f"feed service: job {job!r} is not attached")
        info.seen = time.monotonic()
        return info

    # ----------------------------------------------------------------- workers

    def open(self, name: str, epoch: int, rank: int, job: str = DEFAULT_JOB) -> int:
        """Join pass ``(name, epoch)`` (starting its stream if needed); returns its generation for :meth:`take`."""
        if name not in self._datasets:
            raise KeyError(f"feed service has no dataset {name!r} (has {sorted(self._datasets)})")
        key = (job, name, int(epoch))
        with self._lock:
            info = self._job(job)
            for skey, s in list(self._streams.items()):  # a resumed run starts later: drop what nobody reads
                if skey[0] == name and skey[1] < key[2] and not s.readers and not s.jobs:
                    self._drop_stream(s)
            p = self._passes.get(key)
            if p is not None and rank in p.opened_by:  # this rank opened it before: its worker was restarted
                log.info("feed: %s epoch %d opened again by rank %d of job %r: the pass starts over",
                         name, epoch, rank, job)
                old = p.stream
                old.readers.pop(job, None)
                self._finished.append(p)
                p = self._join(key, info)
                self._release(old)
            elif p is None:
                p = self._join(key, info)
            if p.first_open_s is None:
                p.first_open_s = time.perf_counter() - p.stream.started_s
            p.opened_by.add(rank)
            return p.generation

    def _join(self, key: tuple[str, str, int], info: _Job) -> _Pass:
        job, name, epoch = key
        s = self._streams.get((name, epoch))
        if s is None or s.base > 0 or s.error is not None or s.stop.is_set():
            s = self._start((name, epoch))
        generation = self._generations.get(key, 0) + 1
        self._generations[key] = generation
        p = _Pass(job, name, epoch, generation, s, started_s=time.perf_counter(),
                  joined_late=s.blocks > 0 and bool(s.jobs))
        p.ready = {r: deque() for r in range(info.consumers)}
        s.readers[job] = p
        if job not in s.jobs:
            s.jobs.append(job)
        self._passes[key] = p
        return p

    def take(self, name: str, epoch: int, generation: int, rank: int, timeout_s: float = 2.0,
             job: str = DEFAULT_JOB) -> Any:
        """The next blocks of the pass (a list of :class:`BlockRef`; in steps mode a list of :class:`Step`),
        None at its end, or ``"retry"``."""
        key = (job, name, int(epoch))
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                p = self._passes.get(key)
                if p is None or p.generation != generation:
                    raise RuntimeError(f"feed: pass {name} epoch {epoch} generation {generation} is gone "
                                       f"(a restarted worker started it over, or a resumed run skipped it)")
                info = self._jobs.get(job)
                if info is None:
                    raise RuntimeError(f"feed: job {job!r} was detached")
                info.seen = time.monotonic()
                s = p.stream
                if info.step_samples:
                    steps = self._next_steps(p, rank, info)
                    if steps:
                        p.handed[rank] = p.handed.get(rank, 0) + sum(x.samples for x in steps)
                        return steps
                    exhausted = s.done and p.cursor == s.end and not p.pool and not p.whole
                elif p.cursor < s.end and self._may_take(p, rank, info.consumers):
                    bundle = s.bundles[p.cursor - s.base]
                    p.cursor += 1
                    p.handed[rank] = p.handed.get(rank, 0) + bundle.rows
                    self._release(s)
                    self._lock.notify_all()
                    return bundle.blocks
                else:
                    exhausted = s.done and p.cursor == s.end
                if s.error is not None:
                    raise s.error
                if exhausted:
                    if s.readers.get(job) is p:  # done with the stream (dealt steps hold their own refs)
                        del s.readers[job]
                        self._release(s)
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return _RETRY
                self._lock.wait(min(left, 0.1) if p.cursor < s.end else left)

    def _may_take(self, p: _Pass, rank: int, consumers: int) -> bool:
        """Whether ``rank`` may take the next blocks now (coordinated reads, *blocks* mode).

        A worker more than two bundles ahead of the one with the least waits for
        the others: up to 60 s while some have not opened the pass yet (they are
        still starting), 2 s once all have (then a worker whose own read-ahead
        is full cannot hold the others up for long).
        """
        if consumers == 1:
            return True
        lead = p.handed.get(rank, 0) - min(p.handed.get(r, 0) for r in range(consumers))
        now = time.monotonic()
        if lead < 2 * p.stream.max_bundle_rows:
            p.balance_since.pop(rank, None)
            return True
        since = p.balance_since.setdefault(rank, now)
        if now - since > (2.0 if len(p.opened_by) >= consumers else 60.0):
            p.balance_since.pop(rank, None)
            p.unbalanced += 1
            return True
        return False

    def _next_steps(self, p: _Pass, rank: int, info: _Job, most: int = 8) -> list[Step]:
        """``rank``'s next steps (steps mode; up to ``most`` per call: one actor call per step would cost more
        than the step), dealing new steps to every rank while the stream has the samples."""
        queue = p.ready.setdefault(rank, deque())
        while len(queue) < most and self._deal(p, info):
            pass
        return [queue.popleft() for _ in range(min(most, len(queue)))]

    def _deal(self, p: _Pass, info: _Job) -> bool:
        """Deal one step to every rank from what the stream has produced; False when it cannot yet."""
        n, size, s = info.consumers, info.step_samples or 1, p.stream
        while p.pool_samples < n * size and p.cursor < s.end:  # read what the stream has, up to one step
            bundle = s.bundles[p.cursor - s.base]
            p.cursor += 1
            if bundle.counts is None:  # produced before a job in steps mode attached
                bundle.counts = self._sample_counts(bundle.blocks)
            for block, counts in zip(bundle.blocks, bundle.counts, strict=True):
                for row, samples in enumerate(counts):
                    if samples > 0:
                        (p.whole if samples == size else p.pool).append([block, row, 0, samples])
                        p.pool_samples += samples
                        p.rest_samples += 0 if samples == size else samples
            self._release(s)
            self._lock.notify_all()
        if p.pool_samples >= n * size:
            sizes = [size] * n
        elif s.done and p.cursor == s.end and p.pool_samples > 0:  # the last step: as even as it gets
            q, r = divmod(p.pool_samples, n)
            sizes = [q + (1 if i < r else 0) for i in range(n)]
            p.uneven_steps += int(r > 0)
        else:
            return False
        for i, want in enumerate(sizes):
            if want == size and p.whole and p.rest_samples < size:  # a pipeline batch of the step's size: as is
                block, row, lo, hi = p.whole.popleft()
                pieces = [Piece(block, row, lo, hi)]
                p.pool_samples -= size
            else:  # re-cut: the short batches first (they never pile up past one step), then whole ones
                pieces = []
                while want > 0:
                    source = p.pool if p.pool else p.whole
                    entry = source[0]
                    block, row, lo, hi = entry
                    cut = min(hi, lo + want)
                    pieces.append(Piece(block, row, lo, cut))
                    want -= cut - lo
                    p.pool_samples -= cut - lo
                    if source is p.pool:
                        p.rest_samples -= cut - lo
                    if cut == hi:
                        source.popleft()
                    else:
                        entry[2] = cut
                        if source is p.whole:  # what is left of a cut whole batch is a short one now
                            p.pool.append(source.popleft())
                            p.rest_samples += hi - cut
                p.recut_steps += 1
            if sizes[i]:
                p.ready.setdefault(i, deque()).append(Step(tuple(pieces), sizes[i]))
        p.steps += 1
        return True

    def describe(self, job: str = DEFAULT_JOB) -> FeedReport:
        """``job``'s passes (latest generation), and whether it was served from shared streams, for its summary."""
        with self._lock:
            passes = [p for k, p in self._passes.items() if k[0] == job]
            streams = {id(p.stream): p.stream for p in passes + [q for q in self._finished if q.job == job]}
            shared = [s for s in streams.values() if len(s.jobs) > 1]
            saved = sum(s.cpu_s for s in streams.values() if s.jobs and s.jobs[0] != job)
            paid = sum(s.cpu_s for s in streams.values() if s.jobs and s.jobs[0] == job)
            return FeedReport(
                passes=[p.describe() for p in passes],
                sharing=SharingStats(
                    shared_streams=len(shared), streams=len(streams),
                    served_from_shared_stream=any(s.jobs[0] != job for s in streams.values() if s.jobs),
                    cpu_s_saved=round(saved, 3), cpu_s_paid=round(paid, 3),
                    jobs_attached=len([j for j in self._jobs if j != DEFAULT_JOB])),
            )

    # ----------------------------------------------------------------- producers

    def _start(self, key: PassKey) -> _Stream:
        """A new stream of ``key``, its producer thread started (call with the lock held)."""
        s = _Stream(key[0], key[1], started_s=time.perf_counter())
        old = self._streams.get(key)
        if old is not None and not old.readers:
            self._drop_stream(old)
        self._streams[key] = s
        threading.Thread(target=self._produce, args=(s,), name=f"feed-{key[0]}-{key[1]}", daemon=True).start()
        return s

    def _drop_stream(self, s: _Stream) -> None:
        """Stop ``s``'s producer and release its blocks (call with the lock held)."""
        if self._streams.get((s.name, s.epoch)) is s:
            del self._streams[(s.name, s.epoch)]
        s.stop.set()
        s.base = s.end
        s.bundles.clear()
        self._lock.notify_all()

    def _leave(self, p: _Pass) -> None:
        if self._passes.get((p.job, p.name, p.epoch)) is p:
            del self._passes[(p.job, p.name, p.epoch)]
            self._finished.append(p)
        if p.stream.readers.get(p.job) is p:
            del p.stream.readers[p.job]
        p.pool.clear()
        p.whole.clear()
        p.ready.clear()
        self._release(p.stream)

    def _release(self, s: _Stream) -> None:
        """Release the blocks every reader has passed, beyond ``retain_bytes`` (all, once nobody reads)."""
        if not s.jobs:  # speculative: nobody has read it yet
            return
        if not s.readers:  # ephemeral: nobody reads it any more
            self._drop_stream(s)
            return
        low = min(p.cursor for p in s.readers.values())
        kept = sum(b.nbytes for b in list(s.bundles)[: max(0, low - s.base)])
        while s.base < low and s.bundles and kept > self._retain:
            kept -= s.bundles.popleft().nbytes
            s.base += 1
        self._lock.notify_all()

    def _unread_bytes(self, s: _Stream) -> int:
        low = min((p.cursor for p in s.readers.values()), default=s.base)
        return s.bytes_from(low)

    def _run_ahead(self, keys: list[PassKey]) -> None:
        """Start the ``ahead`` passes one after the other (each when the previous has produced its last block)."""
        for key in keys:
            with self._lock:
                s = self._streams.get(key)
                if s is None or s.stop.is_set() or s.error is not None:
                    s = self._start(key)
                while not (s.done or s.error is not None or s.stop.is_set()):
                    self._lock.wait(0.2)
                if s.stop.is_set() or s.error is not None:  # dropped (a resumed run) or failed: stop guessing
                    return

    def _produce(self, s: _Stream) -> None:
        try:
            for bundle in self._datasets[s.name].iter_internal_ref_bundles():
                if s.stop.is_set():
                    return
                blocks, nbytes, rows, cpu_s = bundle_block_refs(bundle)
                counts = self._sample_counts(blocks) if self._counts_needed() else None
                with self._lock:
                    # Bounded ahead; the first bundle always goes in (a block larger than the bound).
                    while not s.stop.is_set():
                        unread = self._unread_bytes(s)
                        if not unread or unread + nbytes <= self._max_ahead:
                            break
                        self._lock.wait(0.2)
                    if s.stop.is_set():
                        return
                    s.bundles.append(_Bundle(blocks, nbytes, rows, counts, cpu_s))
                    s.blocks += len(blocks)
                    s.rows += rows
                    s.cpu_s += cpu_s
                    s.max_bundle_rows = max(s.max_bundle_rows, rows)
                    if s.first_block_s is None:
                        s.first_block_s = time.perf_counter() - s.started_s
                    self._lock.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the workers that take from this pass
            log.warning("feed: %s epoch %d failed: %s", s.name, s.epoch, err)
            with self._lock:
                s.error = err
                self._lock.notify_all()
            return
        with self._lock:
            s.done = True
            s.produced_s = time.perf_counter() - s.started_s
            self._lock.notify_all()

    def _counts_needed(self) -> bool:
        with self._lock:
            return any(j.step_samples for j in self._jobs.values())


def _end_this_actor() -> None:
    """Kill the actor this runs in; nothing outside an actor (a service built in-process, as unit tests do).

    Checked before asking Ray: ``ray.get_runtime_context()`` in a process without Ray starts a
    local cluster (Ray's auto-init), from this daemon thread, which nobody then shuts down.
    """
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return
    ray.kill(ray.get_runtime_context().current_actor)
