"""Coordinated reads (equal-sized steps) and shared streams of the feed service, on fakes (no Ray cluster).

Packed-row re-cutting (``concat_packed``) runs on real packed rows, plain and dedup.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
from feed_fakes import FakeDataset

from dlrm_platform.ingest.batching import concat_packed, pack_table, packed_num_samples
from dlrm_platform.ingest.dedup_batching import pack_dedup_arrays
from dlrm_platform.ingest.feed_blocks import Step, step_table
from dlrm_platform.ingest.feed_service import FeedService


def _samples(ref: str, row: int) -> int:
    """Session-sized packed batches: 1..60 samples, fixed per (block, row)."""
    b = int(ref.rsplit("-b", 1)[1])
    return 1 + (b * 37 + row * 11) % 60


def _counts(blocks) -> list[list[int]]:
    return [[_samples(b.ref, r) for r in range(4)] for b in blocks]


def _drain(service, name, epoch, rank, gen, job="") -> list:
    got = []
    while True:
        item = service.take(name, epoch, gen, rank, timeout_s=0.5, job=job)
        if item is None:
            return got
        if isinstance(item, str):
            continue
        got.extend(item) if item and isinstance(item[0], Step) else got.extend(b.ref for b in item)


def _run_workers(service, ranks, job="", name="train", epoch=0) -> dict[int, list]:
    results: dict[int, list] = {}

    def worker(rank: int) -> None:
        gen = service.open(name, epoch, rank, job)
        results[rank] = _drain(service, name, epoch, rank, gen, job)

    threads = [threading.Thread(target=worker, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results


# --------------------------------------------------------------------------- equal-sized steps


@pytest.mark.parametrize("workers", [2, 3])
def test_steps_mode_gives_every_worker_a_batch_of_equal_size_every_step(workers):
    ds = FakeDataset("train", blocks=30, delay_s=0.001)
    service = FeedService({"train": ds}, consumers=workers, step_samples=64, sample_counts=_counts)
    results = _run_workers(service, range(workers))
    steps = [results[r] for r in range(workers)]
    assert len({len(s) for s in steps}) == 1, "every worker gets one batch per step"
    for k, row in enumerate(zip(*steps, strict=True)):
        sizes = [s.samples for s in row]
        if k < len(steps[0]) - 1:
            assert sizes == [64] * workers, (k, sizes)
        else:  # the pass's last step: as even as the remaining samples allow
            assert max(sizes) - min(sizes) <= 1
    # Every sample of every packed batch exactly once, over all workers.
    covered: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for s in steps:
        for step in s:
            assert sum(p.hi - p.lo for p in step.pieces) == step.samples
            for p in step.pieces:
                covered.setdefault((p.block.ref, p.row), []).append((p.lo, p.hi))
    for i in range(30):
        for r in range(4):
            spans = sorted(covered.pop((f"train-x1-b{i}", r)))
            assert spans[0][0] == 0 and spans[-1][1] == _samples(f"train-x1-b{i}", r)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert not covered
    (passed,) = service.describe().passes
    assert passed.steps == len(steps[0])


def test_blocks_mode_sizes_differ_per_step():
    """The baseline the steps mode fixes: handing out whole session-sized batches, steps are uneven."""
    ds = FakeDataset("train", blocks=20)
    service = FeedService({"train": ds}, consumers=2, sample_counts=_counts)
    results = _run_workers(service, [0, 1])
    assert sorted(results[0] + results[1]) == sorted(f"train-x1-b{i}" for i in range(20))


def _plain_row(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    t = pa.table({
        "label": rng.integers(0, 2, n).astype(np.float32),
        "d0": rng.random(n).astype(np.float32), "d1": rng.random(n).astype(np.float32),
        "c0": rng.integers(0, 100, n),
        "h": pa.array([list(rng.integers(0, 100, rng.integers(0, 4))) for _ in range(n)], pa.list_(pa.int64())),
    })
    return pack_table(t, ["d0", "d1"], ["c0", "h"], ["h"], "label")


def _dedup_row(sessions: list[int], seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    b, u = sum(sessions), len(sessions)
    inverse = np.repeat(np.arange(u), sessions)
    item_lengths = np.concatenate([np.ones(b, np.int32), rng.integers(0, 3, b).astype(np.int32)])
    user_lengths = np.concatenate([np.ones(u, np.int32), rng.integers(0, 4, u).astype(np.int32)])
    return pack_dedup_arrays(
        labels=rng.integers(0, 2, b).astype(np.float32), item_dense=rng.random((b, 2)),
        item_lengths=item_lengths, item_values=rng.integers(0, 1000, int(item_lengths.sum())),
        user_dense=rng.random((u, 3)), user_lengths=user_lengths,
        user_values=rng.integers(0, 1000, int(user_lengths.sum())), inverse=inverse, num_users=u)


def _expanded(row: pa.Table) -> list[tuple]:
    """Each sample as a tuple of everything it sees (user side expanded), in order."""
    from dlrm_platform.ingest.batching import _Unpacked

    x = _Unpacked(row)

    def bags(lengths, values):
        offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
        f, n = lengths.shape
        return [[tuple(values[offsets[i * n + j]:offsets[i * n + j + 1]]) for i in range(f)] for j in range(n)]

    item = bags(x.lengths, x.values)
    out = []
    for j in range(x.b):
        sample = (float(x.labels[j]), tuple(x.dense[j].round(6)), tuple(item[j]))
        if x.dedup:
            user = bags(x.user_lengths, x.user_values)[x.inverse[j]]
            sample += (tuple(x.user_dense[x.inverse[j]].round(6)), tuple(user))
        out.append(sample)
    return out


@pytest.mark.parametrize("kind", ["plain", "dedup"])
def test_recut_batches_keep_every_sample_in_order(kind):
    rows = [_plain_row(n, s) for s, n in enumerate([7, 3, 12])] if kind == "plain" else [
        _dedup_row(sessions, s) for s, sessions in enumerate([[3, 1, 4], [2], [5, 5, 1]])]
    everything = [s for r in rows for s in _expanded(r)]
    n = len(everything)
    # Cut the rows' samples into batches of 5 (pieces spanning row boundaries), then join them back.
    spans, start = [], 0
    for r in rows:
        b = packed_num_samples(r)[0]
        spans.append((r, start, start + b))
        start += b
    rebuilt = []
    for lo in range(0, n, 5):
        hi = min(lo + 5, n)
        pieces = [(r, max(lo, a) - a, min(hi, b) - a) for r, a, b in spans if a < hi and b > lo]
        batch = concat_packed(pieces)
        assert packed_num_samples(batch) == [hi - lo]
        rebuilt.extend(_expanded(batch))
    assert rebuilt == everything
    assert concat_packed([(rows[0], 0, packed_num_samples(rows[0])[0])]) is rows[0]  # whole row: unchanged


def test_step_table_joins_pieces_of_sliced_blocks():
    block = pa.concat_tables([_plain_row(4, 1), _plain_row(6, 2), _plain_row(5, 3)])
    from dlrm_platform.ingest.feed_blocks import BlockRef, Piece

    sliced = BlockRef("blk", 1, 3)  # the bundle holds rows 1..2 of the block
    step = Step((Piece(sliced, 0, 2, 6), Piece(sliced, 1, 0, 3)), 7)
    table = step_table(step, lambda refs: [block for _ in refs])
    assert packed_num_samples(table) == [7]
    assert _expanded(table) == _expanded(block.slice(1, 1))[2:6] + _expanded(block.slice(2, 1))[:3]


# --------------------------------------------------------------------------- shared streams


def test_a_job_joining_late_reads_the_same_stream_from_its_start():
    ds = FakeDataset("train", blocks=40, delay_s=0.002)
    service = FeedService({"train": ds}, retain_bytes=10_000)
    service.attach("a", consumers=2)
    gen_a0, gen_a1 = service.open("train", 0, 0, "a"), service.open("train", 0, 1, "a")
    early = []
    while len(early) < 10:  # job a is well into its pass
        item = service.take("train", 0, gen_a0, 0, job="a")
        if isinstance(item, list):
            early.extend(b.ref for b in item)
    service.attach("b", consumers=1)
    gen_b = service.open("train", 0, 0, "b")  # joins 10 blocks into job a's pass
    results: dict[str, list] = {"a": list(early), "b": []}

    def a(rank, gen):
        results["a"].extend(_drain(service, "train", 0, rank, gen, "a"))

    def b():
        results["b"].extend(_drain(service, "train", 0, 0, gen_b, "b"))

    threads = [threading.Thread(target=a, args=(0, gen_a0)), threading.Thread(target=a, args=(1, gen_a1)),
               threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    every = sorted(f"train-x1-b{i}" for i in range(40))
    assert sorted(results["a"]) == every  # each job: the full epoch, exactly once
    assert sorted(results["b"]) == every
    assert ds.executions == 1, "the late job read the running stream, not an execution of its own"
    a_desc, b_desc = service.describe("a"), service.describe("b")
    assert b_desc.sharing.served_from_shared_stream and b_desc.sharing.cpu_s_saved == pytest.approx(20.0)
    assert not a_desc.sharing.served_from_shared_stream and a_desc.sharing.cpu_s_paid == pytest.approx(20.0)
    assert b_desc.passes[0].joined_late and b_desc.passes[0].shared
    assert not service._streams, "the stream is dropped once no job reads it"


def test_without_retention_a_late_job_gets_its_own_stream():
    ds = FakeDataset("train", blocks=10)
    service = FeedService({"train": ds})  # retain_bytes=0: what a job's own service does
    service.attach("a", consumers=1)
    gen = service.open("train", 0, 0, "a")
    assert service.take("train", 0, gen, 0, job="a")[0].ref == "train-x1-b0"
    service.attach("b", consumers=1)
    got = _drain(service, "train", 0, 0, service.open("train", 0, 0, "b"), "b")
    assert got == [f"train-x2-b{i}" for i in range(10)]
    assert ds.executions == 2
    assert not service.describe("b").sharing.served_from_shared_stream


def test_retention_is_bounded():
    ds = FakeDataset("train", blocks=30)
    service = FeedService({"train": ds}, retain_bytes=500)
    service.attach("a", consumers=1)
    assert len(_drain(service, "train", 0, 0, service.open("train", 0, 0, "a"), "a")) == 30
    service.attach("b", consumers=1)
    service.attach("c", consumers=1)
    gb = service.open("train", 0, 0, "b")
    for _ in range(20):
        service.take("train", 0, gb, 0, job="b")
    stream = service._passes[("b", "train", 0)].stream
    assert sum(x.nbytes for x in stream.bundles) <= 500 + 100 * 2


def test_steps_mode_on_a_shared_stream_deals_each_job_its_own_steps():
    ds = FakeDataset("train", blocks=20)
    service = FeedService({"train": ds}, retain_bytes=1 << 20, sample_counts=_counts)
    service.attach("a", consumers=2, step_samples=32)
    service.attach("b", consumers=1)
    gens = {("a", 0): service.open("train", 0, 0, "a"), ("a", 1): service.open("train", 0, 1, "a"),
            ("b", 0): service.open("train", 0, 0, "b")}  # both jobs read the pass at the same time
    got: dict[tuple[str, int], list] = {}
    threads = [threading.Thread(target=lambda k=k, g=g: got.setdefault(k, _drain(service, "train", 0, k[1], g, k[0])))
               for k, g in gens.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    ra, rb = {r: got[("a", r)] for r in (0, 1)}, {0: got[("b", 0)]}
    total = sum(_samples(f"train-x1-b{i}", r) for i in range(20) for r in range(4))
    assert sum(s.samples for r in ra.values() for s in r) == total
    assert sorted(rb[0]) == sorted(f"train-x1-b{i}" for i in range(20))
    assert ds.executions == 1


def test_detach_counts_the_jobs_left_and_a_closing_service_refuses_new_ones():
    service = FeedService({"train": FakeDataset("train", blocks=1)}, lease_s=3600)
    assert service.attach("a", 1) == 2  # the default job counts in attach, not in detach
    assert service.attach("b", 1) == 3
    assert service.detach("a") == 1
    assert service.detach("b") == 0
    with pytest.raises(RuntimeError, match="closing"):
        service.attach("c", 1)


def test_a_closing_service_outside_an_actor_starts_no_ray():
    """The lease thread ends the actor it runs in; built in-process it must not auto-start a local Ray cluster."""
    import ray

    from dlrm_platform.ingest import feed_service

    assert not ray.is_initialized()
    feed_service._end_this_actor()
    assert not ray.is_initialized()
