"""ShardFeeder and EpochCache: every sample once per pass, replay in a fresh order, bounds, invalidation."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.config import JobConfig
from dlrm_platform.train.feed import CacheOverflow, EpochCache, ShardFeeder, batch_fingerprint

COLUMNS = {"label": "label", "user": {"dense": ["d"], "categorical": ["c"]}}


def _job(tmp_path: Path, **cache) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": str(tmp_path), "columns": COLUMNS},
        "ingest": {"batch_size": 4, "cache": cache},
        "train": {"epochs": 3},
    })


def _table(ids: list[int]) -> pa.Table:
    """A stand-in packed batch: ``num_samples`` (what the feeder reads) and the samples' ids."""
    return pa.table({"num_samples": pa.array([len(ids)], pa.int32()),
                     "ids": pa.array([ids], pa.large_list(pa.int64()))})


class FakeShard:
    """A dataset shard: every ``iter_batches`` call is a new epoch over the same batches."""

    def __init__(self, batches: list[list[int]], fail_at: int | None = None) -> None:
        self.batches = batches
        self.epochs = 0
        self.fail_at = fail_at

    def iter_batches(self, **_):
        self.epochs += 1
        for i, ids in enumerate(self.batches):
            if self.fail_at == i:
                raise RuntimeError("the pipeline broke")
            yield _table(ids)


def _batches(n_batches: int, size: int = 4, start: int = 0) -> list[list[int]]:
    return [list(range(start + i * size, start + (i + 1) * size)) for i in range(n_batches)]


def _ids(tables) -> list[int]:
    return [i for t in tables for i in t.column("ids")[0].as_py()]


def _order(epochs: int, eval_: bool = False) -> list[tuple[str, int]]:
    return [(n, e) for e in range(epochs) for n in (("train", "eval") if eval_ else ("train",))]


def _run(feeder: ShardFeeder, epochs: int, names=("train",), vote=lambda v: v) -> list[dict[str, list[int]]]:
    out = []
    for epoch in range(epochs):
        seen = {}
        for name in names:
            seen[name] = _ids(feeder.tables(name, epoch))
            feeder.decide(name, vote)
        out.append(seen)
    return out


def _data_file(tmp_path: Path) -> Path:
    f = tmp_path / "part-0.parquet"
    f.write_bytes(b"x" * 100)
    return f


def test_first_pass_streams_later_passes_replay_every_sample_once_in_a_fresh_order(tmp_path):
    shard, evals = FakeShard(_batches(12)), FakeShard(_batches(3, start=1000))
    f = _data_file(tmp_path)
    with ShardFeeder(_job(tmp_path), {"train": (shard, [f]), "eval": (evals, [f])}, _order(3, True),
                     tmp_path / "spill") as feeder:
        epochs = _run(feeder, 3, ("train", "eval"))
        assert [feeder.stats("train", e).source for e in range(3)] == ["pipeline", "cache", "cache"]
        assert feeder.cache("train").describe().state == "complete"
    assert shard.epochs == 1 and evals.epochs == 1  # the pipelines ran once
    expected = list(range(48))
    for seen in epochs:
        assert sorted(seen["train"]) == expected  # exactly once per epoch
        assert sorted(seen["eval"]) == list(range(1000, 1012))
    assert epochs[1]["train"] != epochs[0]["train"] != epochs[2]["train"]  # a fresh order each replay


def test_cache_off_runs_the_pipeline_every_epoch(tmp_path):
    shard = FakeShard(_batches(5))
    with ShardFeeder(_job(tmp_path, mode="off"), {"train": (shard, [])}, _order(3), tmp_path) as feeder:
        epochs = _run(feeder, 3)
        assert {feeder.stats("train", e).source for e in range(3)} == {"pipeline"}
    assert shard.epochs == 3
    assert all(sorted(e["train"]) == list(range(20)) for e in epochs)


def test_memory_bound_spills_to_disk_and_replays_from_it(tmp_path):
    shard = FakeShard(_batches(40))
    one = _table(list(range(4))).nbytes
    job = _job(tmp_path, memory_mb=5 * one / 2**20)  # room for 5 batches in memory
    with ShardFeeder(job, {"train": (shard, [])}, _order(2), tmp_path / "spill") as feeder:
        epochs = _run(feeder, 2)
        cache = feeder.cache("train")
        assert cache.num_batches == 40 and cache.memory_bytes <= 5 * one
        assert cache.disk_bytes > 0 and cache.spill_path.is_file()
        assert feeder.stats("train", 1).source == "cache"
        spill = cache.spill_path
    assert sorted(epochs[1]["train"]) == list(range(160))
    assert not spill.exists()  # closing the feeder removes its spill


def test_outgrowing_the_bounds_gives_up_the_cache_under_auto(tmp_path):
    shard = FakeShard(_batches(10))
    with ShardFeeder(_job(tmp_path, memory_mb=0, disk_mb=0), {"train": (shard, [])}, _order(2),
                     tmp_path) as feeder:
        epochs = _run(feeder, 2)
        assert feeder.stats("train", 1).source == "pipeline"
        assert "outgrew" in feeder.cache("train").describe().reason
    assert shard.epochs == 2 and all(sorted(e["train"]) == list(range(40)) for e in epochs)


def test_outgrowing_the_bounds_fails_under_on_naming_the_fields(tmp_path):
    with ShardFeeder(_job(tmp_path, mode="on", memory_mb=0, disk_mb=0), {"train": (FakeShard(_batches(3)), [])},
                     _order(1), tmp_path) as feeder:
        with pytest.raises(CacheOverflow, match="ingest.cache.memory_mb"):
            list(feeder.tables("train", 0))


def test_a_changed_input_file_is_never_replayed(tmp_path):
    shard, f = FakeShard(_batches(3)), _data_file(tmp_path)
    with ShardFeeder(_job(tmp_path), {"train": (shard, [f])}, _order(2), tmp_path) as feeder:
        assert sorted(_ids(feeder.tables("train", 0))) == list(range(12))
        f.write_bytes(b"y" * 101)  # the input changes between epochs
        assert feeder.decide("train", lambda v: v) is False
        assert sorted(_ids(feeder.tables("train", 1))) == list(range(12))
        assert feeder.stats("train", 1).source == "pipeline"
    assert shard.epochs == 2


def test_one_incomplete_worker_makes_every_worker_stream(tmp_path):
    # Two workers: rank 1's cache overflows. Both must stream epoch 1, or streaming_split would
    # hand rank 1 the whole dataset while rank 0 replays (samples twice).
    votes, lock, barrier = [], threading.Lock(), threading.Barrier(2)

    def all_reduce_min(v: int) -> int:
        with lock:
            votes.append(v)
        barrier.wait()
        return min(votes[-2:])

    shards = [FakeShard(_batches(4)), FakeShard(_batches(4, start=100))]
    jobs = [_job(tmp_path), _job(tmp_path, memory_mb=0, disk_mb=0)]
    feeders = [ShardFeeder(jobs[r], {"train": (shards[r], [])}, _order(2), tmp_path, rank=r) for r in range(2)]
    results: list = [None, None]

    def worker(r: int) -> None:
        results[r] = _run(feeders[r], 2, vote=all_reduce_min)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for f in feeders:
        f.close()
    assert [f.stats("train", 1).source for f in feeders] == ["pipeline", "pipeline"]
    assert [s.epochs for s in shards] == [2, 2]
    assert sorted(results[0][1]["train"] + results[1][1]["train"]) == sorted(
        list(range(16)) + list(range(100, 116)))


def test_step_limit_reads_no_more_batches_than_the_steps_take(tmp_path):
    shard = FakeShard(_batches(10))
    with ShardFeeder(_job(tmp_path), {"train": (shard, [])}, _order(2), tmp_path, limits={"train": 3}) as feeder:
        epochs = _run(feeder, 2)
    assert [len(e["train"]) for e in epochs] == [12, 12]
    assert sorted(epochs[1]["train"]) == sorted(epochs[0]["train"])  # the same 3 batches, replayed


def test_without_a_cache_the_next_epoch_streams_while_the_trainer_is_in_this_one(tmp_path):
    """No cache to replay: the next pass runs the pipeline once the trainer is in the pass before it,
    without waiting for the end-of-pass decision; never two passes of a dataset ahead of the trainer."""
    shard, evals = FakeShard(_batches(5)), FakeShard(_batches(2, start=1000))
    with ShardFeeder(_job(tmp_path, mode="off"), {"train": (shard, []), "eval": (evals, [])}, _order(3, True),
                     tmp_path) as feeder:
        later = feeder._passes[("train", 1)]
        assert not later.finished.wait(0.3)  # the trainer has not started epoch 0
        it = feeder.tables("train", 0)
        first = next(it)
        assert later.finished.wait(10)  # epoch 1 read while the trainer is in epoch 0, undecided
        assert feeder.replays("train") is None
        assert not feeder._passes[("train", 2)].finished.wait(0.3)  # epoch 2 waits for the trainer
        assert shard.epochs == 2
        seen = {("train", 0): _ids([first, *it])}
        feeder.decide("train", lambda v: v)
        for name, epoch in _order(3, True)[1:]:
            seen[(name, epoch)] = _ids(feeder.tables(name, epoch))
            feeder.decide(name, lambda v: v)
    assert {k: sorted(v) for k, v in seen.items()} == {
        (n, e): list(range(20)) if n == "train" else list(range(1000, 1008)) for n, e in _order(3, True)}
    assert shard.epochs == 3 and evals.epochs == 3


def test_streaming_passes_stay_one_ahead_of_the_trainer_after_the_decision(tmp_path):
    shard = FakeShard(_batches(3))
    with ShardFeeder(_job(tmp_path, mode="off"), {"train": (shard, [])}, _order(4), tmp_path) as feeder:
        assert len(_ids(feeder.tables("train", 0))) == 12
        assert feeder._passes[("train", 1)].finished.wait(10)
        assert not feeder.decide("train", lambda v: v)
        assert not feeder._passes[("train", 2)].finished.wait(0.3)  # the trainer has not asked for epoch 1
        assert shard.epochs == 2
        assert len(_ids(feeder.tables("train", 1))) == 12
        assert feeder._passes[("train", 2)].finished.wait(10)
        assert not feeder._passes[("train", 3)].finished.wait(0.3)
        assert [len(_ids(feeder.tables("train", e))) for e in (2, 3)] == [12, 12]
    assert shard.epochs == 4


def test_a_cache_that_may_replay_waits_for_the_decision(tmp_path):
    shard = FakeShard(_batches(5))
    with ShardFeeder(_job(tmp_path), {"train": (shard, [])}, _order(2), tmp_path) as feeder:
        epoch0 = _ids(feeder.tables("train", 0))
        assert not feeder._passes[("train", 1)].finished.wait(0.3)  # replay or stream: not known yet
        assert shard.epochs == 1
        feeder.decide("train", lambda v: v)
        assert sorted(_ids(feeder.tables("train", 1))) == sorted(epoch0) == list(range(20))
        assert feeder.stats("train", 1).source == "cache"
    assert shard.epochs == 1


def test_a_pipeline_error_reaches_the_training_thread(tmp_path):
    with ShardFeeder(_job(tmp_path), {"train": (FakeShard(_batches(5), fail_at=2), [])}, _order(2),
                     tmp_path) as feeder:
        with pytest.raises(RuntimeError, match="pipeline broke"):
            list(feeder.tables("train", 0))


def test_feeder_reads_ahead_before_the_trainer_asks(tmp_path):
    shard = FakeShard(_batches(6))
    with ShardFeeder(_job(tmp_path), {"train": (shard, [])}, _order(1), tmp_path) as feeder:
        feeder._passes[("train", 0)].finished.wait(10)  # nobody consumed yet: the whole pass is in
        stats = feeder.stats("train", 0)
        assert stats.batches == 6 and stats.source_s is not None and stats.first_batch_s is not None
        assert len(_ids(feeder.tables("train", 0))) == 24


def test_batch_fingerprint_changes_with_inputs_and_shaping_config(tmp_path):
    f = _data_file(tmp_path)
    job = _job(tmp_path)
    base = batch_fingerprint(job, [f])
    assert batch_fingerprint(job, [f]) == base
    other = job.model_copy(update={"ingest": job.ingest.model_copy(update={"batch_size": 8})})
    assert batch_fingerprint(other, [f]) != base
    other = job.model_copy(update={"ingest": job.ingest.model_copy(update={"max_history_length": 3})})
    assert batch_fingerprint(other, [f]) != base
    f.write_bytes(b"z" * 7)
    assert batch_fingerprint(job, [f]) != base


def test_epoch_cache_replay_orders_differ_by_seed(tmp_path):
    cache = EpochCache("train", _job(tmp_path).ingest.cache, tmp_path, "k")
    for ids in _batches(20):
        assert cache.add(_table(ids)) == "memory"
    cache.seal()
    a, b = _ids(cache.replay(1)), _ids(cache.replay(2))
    assert sorted(a) == sorted(b) == list(range(80)) and a != b
    assert Counter(a) == Counter(range(80))
    cache.close()
    assert cache.num_batches == 0 and np.isclose(cache.memory_bytes, 0)


def test_without_read_ahead_a_pass_starts_only_when_the_trainer_asks(tmp_path):
    shard = FakeShard(_batches(4))
    job = _job(tmp_path, mode="off")
    job = job.model_copy(update={"ingest": job.ingest.model_copy(update={"read_ahead": False})})
    with ShardFeeder(job, {"train": (shard, [])}, _order(2), tmp_path) as feeder:
        assert not feeder._passes[("train", 0)].finished.wait(0.3)  # nothing read before asked
        assert shard.epochs == 0
        assert len(_ids(feeder.tables("train", 0))) == 16
        feeder.decide("train", lambda v: v)
        assert len(_ids(feeder.tables("train", 1))) == 16


def test_a_resumed_pass_leaves_out_the_batches_its_checkpoint_trained_but_caches_them(tmp_path):
    shard = FakeShard(_batches(6))
    digest = lambda t: str(t.column("ids")[0].as_py()[0])  # noqa: E731 - first id names the batch here
    trained = frozenset({"0", "8", "20"})  # batches 0, 2 and 5 were trained before the restart
    with ShardFeeder(_job(tmp_path), {"train": (shard, [])}, [("train", 1), ("train", 2)], tmp_path,
                     digest=digest, skip={("train", 1): trained}) as feeder:
        resumed = _ids(feeder.tables("train", 1))
        feeder.decide("train", lambda v: v)
        assert feeder.stats("train", 1).skipped == 3
        full = _ids(feeder.tables("train", 2))
    assert sorted(resumed) == [i for i in range(24) if i // 4 not in (0, 2, 5)]
    assert sorted(full) == list(range(24))  # the next epoch replays the whole shard
