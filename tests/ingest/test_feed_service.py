"""The feed service's protocol, on fake datasets (no Ray cluster): exactly once, restarts, ahead, bounds, errors.

The real thing (a Ray actor over Ray Data executions, feeding Ray Train
workers) is exercised by tests/integration/test_feed_service.py and every
job-level integration test.
"""

from __future__ import annotations

import threading
import time

import pytest
from feed_fakes import FakeDataset

from dlrm_platform.ingest.feed_service import FeedService


def _drain(service: FeedService, name: str, epoch: int, rank: int, gen: int) -> list[str]:
    got = []
    while True:
        blocks = service.take(name, epoch, gen, rank, timeout_s=0.5)
        if blocks is None:
            return got
        if isinstance(blocks, str):
            continue
        got.extend(b.ref for b in blocks)


def _wait(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_two_workers_get_every_block_exactly_once_per_pass():
    ds = FakeDataset("train", blocks=40, delay_s=0.001)
    service = FeedService({"train": ds}, consumers=2)
    results: dict[int, list[str]] = {}

    def worker(rank: int) -> None:
        gen = service.open("train", 0, rank)
        results[rank] = _drain(service, "train", 0, rank, gen)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    together = results[0] + results[1]
    assert sorted(together) == sorted(f"train-x1-b{i}" for i in range(40))
    assert abs(len(results[0]) - len(results[1])) <= 3, "coordinated reads: about half each"
    assert ds.executions == 1
    (passed,) = service.describe().passes
    assert passed.rows == 160 and passed.blocks == 40
    assert sum(passed.handed.values()) == 160  # rows


def test_each_epoch_is_a_new_execution():
    ds = FakeDataset("train", blocks=3)
    service = FeedService({"train": ds})
    for epoch in range(3):
        gen = service.open("train", epoch, 0)
        assert _drain(service, "train", epoch, 0, gen) == [f"train-x{epoch + 1}-b{i}" for i in range(3)]
    assert ds.executions == 3


def test_ahead_passes_run_before_anyone_asks_and_in_order():
    train, evals = FakeDataset("train", blocks=5), FakeDataset("eval", blocks=2)
    service = FeedService({"train": train, "eval": evals}, ahead=[("train", 0), ("eval", 0)])
    _wait(lambda: train.pulled == 5 and evals.pulled == 2)  # both passes produced with no worker yet
    gen = service.open("train", 0, 0)
    assert len(_drain(service, "train", 0, 0, gen)) == 5
    gen = service.open("eval", 0, 0)
    assert len(_drain(service, "eval", 0, 0, gen)) == 2
    assert train.executions == evals.executions == 1  # the workers joined the passes run ahead
    passes = {p.name: p for p in service.describe().passes}
    assert passes["train"].first_open_s >= passes["train"].produced_s  # ready before it was asked for


def test_a_resumed_run_drops_the_passes_run_ahead_for_epochs_it_skips():
    train = FakeDataset("train", blocks=200, delay_s=0.005)
    service = FeedService({"train": train}, ahead=[("train", 0)])
    _wait(lambda: train.pulled > 0)
    gen = service.open("train", 3, 0)  # the checkpoint says epoch 3
    assert _drain(service, "train", 3, 0, gen) == [f"train-x2-b{i}" for i in range(200)]
    time.sleep(0.05)
    pulled = train.pulled
    time.sleep(0.1)
    assert train.pulled == pulled, "the dropped speculative pass kept executing"
    with pytest.raises(RuntimeError, match="gone"):
        service.take("train", 0, 1, 0)  # its generation no longer exists


def test_a_restarted_worker_restarts_the_pass_and_the_others_join_it():
    ds = FakeDataset("train", blocks=10)
    service = FeedService({"train": ds}, consumers=2)
    g1 = service.open("train", 0, 0)
    service.open("train", 0, 1)
    first = service.take("train", 0, g1, 0)
    assert first[0].ref == "train-x1-b0"
    # Ray Train restarts the group: both ranks open the pass again.
    g2 = service.open("train", 0, 0)
    assert g2 == g1 + 1
    assert service.open("train", 0, 1) == g2  # joins, does not restart again
    with pytest.raises(RuntimeError, match="restarted"):
        service.take("train", 0, g1, 1)  # a straggler of the old group
    got = _drain(service, "train", 0, 0, g2)
    assert got == [f"train-x2-b{i}" for i in range(10)]  # the whole pass again, from a new execution


def test_blocks_ahead_are_bounded():
    ds = FakeDataset("train", blocks=50, nbytes=100)
    service = FeedService({"train": ds}, max_ahead_bytes=1_000)
    gen = service.open("train", 0, 0)
    _wait(lambda: ds.pulled >= 10)
    time.sleep(0.3)
    assert ds.pulled <= 11, f"pulled {ds.pulled} blocks of 100 B ahead with a 1000 B bound"
    assert len(_drain(service, "train", 0, 0, gen)) == 50


def test_a_failed_pass_raises_in_the_worker():
    ds = FakeDataset("train", blocks=5, fail_at=2)
    service = FeedService({"train": ds})
    gen = service.open("train", 0, 0)
    with pytest.raises(OSError, match="shard 2 unreadable"):
        _drain(service, "train", 0, 0, gen)


def test_unknown_dataset_is_named():
    service = FeedService({"train": FakeDataset("train", blocks=1)})
    with pytest.raises(KeyError, match="no dataset 'eval'"):
        service.open("eval", 0, 0)


def test_take_returns_retry_instead_of_blocking_forever():
    ds = FakeDataset("train", blocks=2, delay_s=1.0)
    service = FeedService({"train": ds})
    gen = service.open("train", 0, 0)
    assert service.take("train", 0, gen, 0, timeout_s=0.05) == "retry"


def test_a_worker_ahead_of_the_others_waits_for_them():
    ds = FakeDataset("train", blocks=30, rows=4)
    service = FeedService({"train": ds}, ahead=[("train", 0)], consumers=2)
    _wait(lambda: ds.pulled == 30)
    gen = service.open("train", 0, 0)
    taken = []
    while True:  # rank 1 has not opened yet: rank 0 gets two bundles' worth, then is held back
        blocks = service.take("train", 0, gen, 0, timeout_s=0.2)
        if isinstance(blocks, str):
            break
        taken.extend(blocks)
    assert len(taken) == 2
    gen1 = service.open("train", 0, 1)
    results = {0: [b.ref for b in taken], 1: []}

    def worker(rank: int, g: int) -> None:
        results[rank].extend(_drain(service, "train", 0, rank, g))

    threads = [threading.Thread(target=worker, args=(0, gen)), threading.Thread(target=worker, args=(1, gen1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results[0] + results[1]) == sorted(f"train-x1-b{i}" for i in range(30))
    assert abs(len(results[0]) - len(results[1])) <= 3, (len(results[0]), len(results[1]))
    (passed,) = service.describe().passes
    assert passed.unbalanced == 0


def test_a_worker_held_back_too_long_takes_anyway():
    ds = FakeDataset("train", blocks=10, rows=4)
    service = FeedService({"train": ds}, consumers=2)
    gen = service.open("train", 0, 0)
    service.open("train", 0, 1)  # rank 1 opened but never takes (its read-ahead is full, say)
    start = time.monotonic()
    assert len(_drain(service, "train", 0, 0, gen)) == 10  # never deadlocks
    assert time.monotonic() - start < 30
    assert service.describe().passes[0].unbalanced > 0
