"""Epoch cache and read-ahead on a real local Ray cluster: every sample exactly once per epoch.

Two levels: ShardFeeders over the job's feed service and over real
``streaming_split`` iterators (one per consumer thread, sample ids counted),
and Ray Train jobs with 1 and 2
workers, cache on and off, on the job's own fused dedup pipeline.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.config import JobConfig
from dlrm_platform.train.feed import ShardFeeder

pytestmark = pytest.mark.integration

EPOCHS = 3


def _feeder_job(tmp_path: Path, mode: str) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": str(tmp_path), "columns": {"label": "label", "item": {"dense": ["d"], "categorical": ["c"]}}},
        "ingest": {"cache": {"mode": mode}},
        "train": {"epochs": EPOCHS},
    })


def _id_tables(n_batches: int, size: int) -> list[pa.Table]:
    return [pa.table({"num_samples": pa.array([size], pa.int32()),
                      "ids": pa.array([list(range(i * size, (i + 1) * size))], pa.large_list(pa.int64()))})
            for i in range(n_batches)]


@pytest.mark.parametrize("source", ["service", "split"])
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_two_consumers_see_every_id_once_per_epoch(ray_cluster, tmp_path, mode, source):
    import ray.data

    from dlrm_platform.ingest.feed_client import FeedClient, start_feed_service

    ds = ray.data.from_arrow(_id_tables(23, 7))  # odd count: the consumers get different numbers
    if source == "service":
        service = start_feed_service({"train": ds}, consumers=2, ahead=[("train", 0)])
        splits = [FeedClient(service, "train", r) for r in range(2)]
    else:
        splits = ds.streaming_split(2, equal=False)
    votes, lock, barrier = [], threading.Lock(), threading.Barrier(2, timeout=60)

    def all_reduce_min(v: int) -> int:
        with lock:
            votes.append(v)
        barrier.wait()
        result = min(votes[-2:])
        barrier.wait()
        return result

    order = [("train", e) for e in range(EPOCHS)]
    seen: list[list[list[int]]] = [[], []]
    feeders = [ShardFeeder(_feeder_job(tmp_path, mode), {"train": (splits[r], [])}, order, tmp_path / "spill",
                           rank=r) for r in range(2)]

    def consume(r: int) -> None:
        for epoch in range(EPOCHS):
            seen[r].append([i for t in feeders[r].tables("train", epoch) for i in t.column("ids")[0].as_py()])
            feeders[r].decide("train", all_reduce_min)

    threads = [threading.Thread(target=consume, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    sources = [[f.stats("train", e).source for e in range(EPOCHS)] for f in feeders]
    for f in feeders:
        f.close()
    for epoch in range(EPOCHS):
        both = Counter(seen[0][epoch] + seen[1][epoch])
        assert both == Counter(range(23 * 7)), f"epoch {epoch}: not every id exactly once"
    expected = ["pipeline"] + ["cache" if mode == "auto" else "pipeline"] * (EPOCHS - 1)
    assert sources == [expected, expected]


@pytest.fixture(scope="module")
def session_data(tmp_path_factory):
    from dlrm_platform.config import load_job_config
    from dlrm_platform.ingest.synthetic_data import generate_dataset

    root = tmp_path_factory.mktemp("cache-data")
    job = load_job_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", [
        f"data.path={root / 'demo'}", "data.synthetic.num_sessions=600", "data.synthetic.rows_per_shard=1500",
    ])
    generate_dataset(job.data, overwrite=True, progress=False)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "mode"), [(1, "auto"), (2, "auto"), (2, "off")])
def test_job_trains_every_sample_once_per_epoch_with_cache_on_and_off(ray_cluster, session_data, tmp_path, workers, mode):
    from dlrm_platform.config import load_job_config
    from dlrm_platform.job import run_job
    from dlrm_platform.ingest.source import validate_dataset

    job = load_job_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", [
        f"data.path={session_data / 'demo'}", f"tracking.runs_dir={tmp_path / 'runs'}",
        f"train.epochs={EPOCHS}", f"train.num_workers={workers}", "train.cpus_per_worker=0.5",
        "ingest.batch_size=128", f"ingest.cache.mode={mode}", "tracking.log_model=false",
    ])
    train_rows = validate_dataset(job.data).train_rows
    summary = run_job(job)
    assert summary.samples == EPOCHS * train_rows  # every sample exactly once per epoch
    sources = [e.source for e in summary.epochs]
    assert sources == ["pipeline"] + (["cache"] if mode == "auto" else ["pipeline"]) * (EPOCHS - 1)
    assert summary.pipeline.startswith("fused")
    assert summary.epoch_cache["train"].state == ("complete" if mode == "auto" else "off")
    assert np.isfinite(summary.auc) and summary.auc > 0.6
    assert not list((tmp_path / "runs" / "epoch_cache").glob("**/*.arrow"))  # spills removed at the end
    if workers > 1:  # per-step straggler wait at the lockstep collective, for coordinated reads
        from mlflow.tracking import MlflowClient

        history = MlflowClient(summary.mlflow_tracking_uri).get_metric_history(summary.mlflow_run_id, "straggler_wait_s")
        assert len(history) >= summary.steps // 2 and all(m.value >= 0 for m in history)
