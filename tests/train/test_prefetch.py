"""Background read-ahead of unpacked batches, and the lockstep loop on top of it."""

from __future__ import annotations

import threading

import pytest
import torch

from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.train.lockstep import BatchPrefetcher, lockstep_batches

SPARSE = ["uc", "hist", "ic"]
CPU = torch.device("cpu")


class CountingIterator:
    """An iterator over tables that counts how many were taken; tests can wait for a count."""

    def __init__(self, tables) -> None:
        self._it = iter(tables)
        self.taken = 0
        self.threads: set[str] = set()
        self._changed = threading.Condition()

    def __iter__(self):
        return self

    def __next__(self):
        self.threads.add(threading.current_thread().name)
        item = next(self._it)
        with self._changed:
            self.taken += 1
            self._changed.notify_all()
        return item

    def wait_taken(self, n: int, timeout_s: float = 10.0) -> bool:
        """True once ``n`` tables have been taken; False if that has not happened within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: self.taken >= n, timeout=timeout_s)


class FakeShard:
    def __init__(self, tables) -> None:
        self.tables = tables
        self.iterators: list[CountingIterator] = []

    def iter_batches(self, *, batch_size: int, batch_format: str, prefetch_batches: int):
        assert (batch_size, batch_format) == (1, "pyarrow")
        it = CountingIterator(self.tables)
        self.iterators.append(it)
        return it


def _unpack(table):
    return unpack_batch(table, SPARSE, 3)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_every_batch_once_in_order(packed_batch, depth) -> None:
    tables = [packed_batch(n, seed=i) for i, n in enumerate([8, 5, 3, 7])]
    source = CountingIterator(tables)
    with BatchPrefetcher(source, _unpack, CPU, depth) as batches:
        got = []
        while (item := batches.get()) is not None:
            batch, stats = item.batch, item.stats
            got.append(int(batch.labels.numel()))
            assert stats["batch_bytes"] > 0 and stats["dedup_factor"] == 1.0
        assert batches.get() is None  # and stays exhausted
    assert got == [8, 5, 3, 7]
    assert source.threads == ({"dlrm-batch-prefetch"} if depth else {threading.current_thread().name})


@pytest.mark.parametrize("depth", [1, 3])
def test_reads_ahead_while_the_consumer_computes(packed_batch, depth) -> None:
    # The consumer holds its first batch and asks for nothing more (it is "computing"): the
    # producer still reads the next ``depth`` tables, which are then handed over in order.
    tables = [packed_batch(n, seed=i) for i, n in enumerate([6, 5, 4, 3, 2, 1])]
    source = CountingIterator(tables)
    with BatchPrefetcher(source, _unpack, CPU, depth=depth) as batches:
        first = batches.get()
        assert first is not None and int(first[0].labels.numel()) == 6
        assert source.wait_taken(1 + depth), f"read {source.taken} table(s) while the consumer computed"
        got = []
        while (item := batches.get()) is not None:
            got.append(int(item[0].labels.numel()))
    assert got == [5, 4, 3, 2, 1]


def test_without_read_ahead_nothing_is_read_until_asked(packed_batch) -> None:
    source = CountingIterator([packed_batch(4, seed=i) for i in range(3)])
    with BatchPrefetcher(source, _unpack, CPU, depth=0) as batches:
        assert batches.get() is not None
        assert source.taken == 1  # read on the training thread, by the get() itself
        assert batches.get() is not None and source.taken == 2


@pytest.mark.parametrize("depth", [0, 2])
def test_reads_no_more_than_the_limit(packed_batch, depth) -> None:
    source = CountingIterator([packed_batch(4, seed=i) for i in range(6)])
    with BatchPrefetcher(source, _unpack, CPU, depth, limit=2) as batches:
        assert batches.get() is not None and batches.get() is not None
        assert batches.get() is None
        if batches._thread is not None:  # the producer ends by itself at the limit, before any close()
            batches._thread.join(timeout=10)
            assert not batches._thread.is_alive()
    assert source.taken == 2  # the rest stays in the shard, as without read-ahead


@pytest.mark.parametrize("depth", [0, 2])
def test_errors_reach_the_training_thread(packed_batch, depth) -> None:
    def unpack(table):
        if int(table.column("num_samples")[0].as_py()) == 5:
            raise ValueError("bad packed batch")
        return _unpack(table)

    source = CountingIterator([packed_batch(4), packed_batch(5), packed_batch(6)])
    with BatchPrefetcher(source, unpack, CPU, depth) as batches:
        assert batches.get() is not None
        with pytest.raises(ValueError, match="bad packed batch"):
            batches.get()
        assert batches.get() is None


def test_close_stops_a_producer_blocked_on_a_full_queue(packed_batch) -> None:
    source = CountingIterator([packed_batch(4, seed=i) for i in range(50)])
    batches = BatchPrefetcher(source, _unpack, CPU, depth=1)
    assert batches.get() is not None
    # one table handed over, one in the queue, the third read and blocked on the full queue
    assert source.wait_taken(3)
    batches.close(timeout_s=5)
    assert not batches._thread.is_alive()
    assert source.taken == 3


def test_lockstep_with_read_ahead_stops_reading_at_max_steps(tiny_job, packed_batch, gloo_group) -> None:
    shard = FakeShard([packed_batch(n, seed=i) for i, n in enumerate([8, 5, 3, 6, 2])])
    job = tiny_job()
    assert job.ingest.prefetch_batches >= 1
    steps = list(lockstep_batches(shard, job, CPU, max_steps=2))
    assert [(s.num_samples, s.global_samples) for s in steps] == [(8, 8), (5, 5)]
    assert shard.iterators[-1].taken == 2
    steps = list(lockstep_batches(shard, job, CPU))
    assert [s.num_samples for s in steps] == [8, 5, 3, 6, 2]
    assert all(s.stats["batch_bytes"] > 0 for s in steps)


def test_lockstep_without_read_ahead(tiny_job, packed_batch, gloo_group) -> None:
    job = tiny_job()
    job = job.model_copy(update={"ingest": job.ingest.model_copy(update={"prefetch_batches": 0})})
    shard = FakeShard([packed_batch(n, seed=i) for i, n in enumerate([8, 5])])
    assert [s.num_samples for s in lockstep_batches(shard, job, CPU)] == [8, 5]
    assert shard.iterators[-1].threads == {threading.current_thread().name}


def test_the_cuda_prefetch_thread_sets_a_device_with_an_index(monkeypatch) -> None:
    # Ray Train's get_device() may hand over torch.device("cuda"); torch.cuda.set_device raises
    # ValueError for a device without an index (found on an H100: the benchmark died before its first step).
    seen = []

    def set_device(device):
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError("Expected a cuda device with a specified index or an integer, but got: cuda")
        seen.append(device)

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    with BatchPrefetcher(iter([]), _unpack, torch.device("cuda"), depth=1) as prefetcher:
        assert prefetcher.get() is None  # the thread ran, set its device and found no tables
    assert seen == [torch.device("cuda", 3)]
