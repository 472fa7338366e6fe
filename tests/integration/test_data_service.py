"""The feed service on a real local Ray cluster: equal-sized steps across workers and a shared stream
that a job joins late, over Ray Data executions (``ingest/feed_service.py``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.ingest.batching import pack_table
from dlrm_platform.ingest.feed_client import (
    FeedClient,
    read_feed_report,
    start_feed_service,
    start_shared_feed_service,
    stop_feed_service,
)

pytestmark = pytest.mark.integration

SESSIONS = 400


def _sessions_dataset(delay_s: float = 0.0):
    """Packed batches of whole sessions (variable sizes); the dense value of each sample is its id."""
    import ray

    rng = np.random.default_rng(3)
    lengths = np.clip(rng.poisson(8, SESSIONS), 1, 40)
    ids = np.arange(int(lengths.sum()), dtype=np.float32)
    cuts = np.concatenate([[0], np.cumsum(lengths)])

    def pack(batch: dict) -> pa.Table:
        time.sleep(delay_s)
        rows = []
        for first in batch["first"]:  # 10 sessions per packed batch: 10..400 samples
            lo, hi = cuts[first], cuts[min(first + 10, SESSIONS)]
            t = pa.table({"label": np.zeros(hi - lo, np.float32), "d0": ids[lo:hi], "c0": np.arange(hi - lo)})
            rows.append(pack_table(t, ["d0"], ["c0"], [], "label"))
        return pa.concat_tables(rows)

    items = [{"first": f} for f in range(0, SESSIONS, 10)]
    ds = ray.data.from_items(items, override_num_blocks=10).map_batches(pack, batch_size=None, batch_format="numpy")
    return ds, ids


def _sample_ids(table: pa.Table) -> np.ndarray:
    return table.column("dense").chunk(0).values.to_numpy()


def test_every_step_gives_every_worker_a_batch_of_equal_size(ray_cluster):
    ds, ids = _sessions_dataset()
    service = start_feed_service({"train": ds}, consumers=2, ahead=[("train", 0)], step_samples=64)
    got: dict[int, list[pa.Table]] = {}
    try:
        threads = [threading.Thread(target=lambda r=r: got.setdefault(r, list(FeedClient(service, "train", r)
                                                                               .iter_pass(0)))) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        ray_cluster.kill(service)
    sizes = [[int(t.column("num_samples")[0].as_py()) for t in got[r]] for r in (0, 1)]
    assert len(sizes[0]) == len(sizes[1]) and len(sizes[0]) > 10
    assert all(a == b == 64 for a, b in zip(sizes[0][:-1], sizes[1][:-1], strict=True)), sizes
    assert abs(sizes[0][-1] - sizes[1][-1]) <= 1
    seen = np.sort(np.concatenate([_sample_ids(t) for r in (0, 1) for t in got[r]]))
    np.testing.assert_array_equal(seen, ids)  # every sample exactly once


def test_a_job_joining_a_shared_stream_late_gets_its_full_epoch(ray_cluster):
    ds, ids = _sessions_dataset(delay_s=0.2)
    feeds = {"a": start_shared_feed_service({"train": ds}, fingerprint="test-late-join", job="a", consumers=1,
                                            ahead=[])}
    got: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    a_quarter = threading.Event()

    def read(job: str) -> None:
        for t in FeedClient(feeds[job], "train", 0).iter_pass(0):
            got[job].append(_sample_ids(t))
            if len(got[job]) >= 10:
                a_quarter.set()
        a_quarter.set()

    ta = threading.Thread(target=read, args=("a",))
    ta.start()
    assert a_quarter.wait(120)
    feeds["b"] = start_shared_feed_service({"train": ds}, fingerprint="test-late-join", job="b", consumers=1,
                                           ahead=[])
    assert feeds["b"].actor._actor_id == feeds["a"].actor._actor_id  # the same service
    tb = threading.Thread(target=read, args=("b",))
    tb.start()
    ta.join(120)
    tb.join(120)
    for job in ("a", "b"):
        np.testing.assert_array_equal(np.sort(np.concatenate(got[job])), ids)  # every sample, once each
    described = {j: read_feed_report(f) for j, f in feeds.items()}
    (late,) = described["b"].passes
    assert late.joined_late and late.shared and not late.paid
    assert described["b"].sharing.served_from_shared_stream
    assert not described["a"].sharing.served_from_shared_stream
    assert described["a"].sharing.cpu_s_paid > 0
    assert described["b"].sharing.cpu_s_saved == pytest.approx(described["a"].sharing.cpu_s_paid)
    stop_feed_service(feeds["a"])
    stop_feed_service(feeds["b"])  # the last job: the service ends
    time.sleep(1)
    with pytest.raises(ValueError):
        ray_cluster.get_actor("dlrm-feed-test-late-join", namespace="dlrm_platform")
