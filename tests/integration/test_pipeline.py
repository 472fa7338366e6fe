"""The Ray Data pipeline end to end on a local cluster: every row arrives once, bad rows are quarantined."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_platform.config import DatasetSchema, JobConfig, OperatorConfig
from dlrm_platform.errors import UserError
from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.ingest.batching import packed_num_samples
from dlrm_platform.ingest.pipeline import build_job_datasets, cpu_budget, fused_train_source
from dlrm_platform.ingest.transforms import count_quarantined

pytestmark = pytest.mark.integration

COLUMNS = {
    "label": "label",
    "session_key": "sid",
    "user": {"dense": ["ud"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["id"], "categorical": ["ic"]},
}


def _job(tmp_path, **ingest) -> JobConfig:
    return JobConfig.model_validate(
        {
            "data": {"path": str(tmp_path), "columns": COLUMNS},
            "ingest": {"batch_size": 64, "hash_size": 1000, "dedup": False, **ingest},
            "train": {"num_workers": 2, "cpus_per_worker": 0.5},
        }
    )


def _write_shards(tmp_path, n_files=3, rows=250, bad_labels=(5, 17)):
    rng = np.random.default_rng(0)
    files = []
    for f in range(n_files):
        labels = rng.integers(0, 2, rows).astype(object)
        if f == 0:
            for i in bad_labels:
                labels[i] = None
        table = pa.table(
            {
                "label": pa.array(list(labels), pa.int64()),
                "sid": pa.array(rng.integers(0, 50, rows)),
                "ud": pa.array(rng.random(rows)),
                "uc": pa.array(rng.integers(0, 10**9, rows)),
                "hist": pa.array([list(rng.integers(0, 100, rng.integers(0, 8))) for _ in range(rows)],
                                 pa.list_(pa.int64())),
                "id": pa.array(rng.random(rows).astype(np.float32)),
                # A unique id per row lets the test count deliveries.
                "ic": pa.array(np.arange(rows) + f * rows),
            }
        )
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(table, path)
        files.append(str(path))
    return files


@pytest.mark.parametrize("fused_op", [None, OperatorConfig(concurrency=2, num_cpus=0.5)], ids=["split", "fused"])
def test_every_row_arrives_exactly_once_in_packed_batches(ray_cluster, tmp_path, fused_op):
    job = _job(tmp_path, hash_size=10**9)  # big table: hashed ids stay distinct
    files = _write_shards(tmp_path)
    pds = build_job_datasets(job, files, files[:1], tmp_path / "quarantine", fused_op=fused_op)
    schema: DatasetSchema = job.data.columns
    seen, sizes = [], []
    for packed in pds.train.iter_batches(batch_size=1, batch_format="pyarrow"):
        batch = unpack_batch(packed, schema.sparse_features, len(schema.dense_columns))
        sizes.append(batch.labels.numel())
        seen.extend(batch.sparse_features["ic"].values().tolist())
    assert sum(sizes) == 3 * 250 - 2
    assert len(seen) == len(set(seen)) == 3 * 250 - 2
    assert max(sizes) <= 64
    assert count_quarantined(tmp_path / "quarantine") == {"label missing or not 0/1": 2}


def test_fused_train_source_runs_the_fused_pipelines_work_without_ray(ray_cluster, tmp_path):
    """benchmarks/ingest.py's ceiling calls these read tasks in one process: the same blocks as the pipeline."""
    job = _job(tmp_path, hash_size=10**9)
    files = _write_shards(tmp_path)
    fused_op = OperatorConfig(concurrency=2, num_cpus=0.5)
    pds = build_job_datasets(job, files, files[:1], tmp_path / "q1", fused_op=fused_op)
    tasks = fused_train_source(job, files, files[:1], tmp_path / "q2").get_read_tasks(1)
    local = [block for task in tasks for block in task()]
    remote = list(pds.train.iter_batches(batch_size=None, batch_format="pyarrow"))

    def samples(blocks):
        return sorted(n for b in blocks for n in packed_num_samples(b))

    assert len(tasks) == 3
    assert samples(local) == samples(remote) and sum(samples(local)) == 3 * 250 - 2
    assert max(sum(packed_num_samples(b)) for b in local) <= pds.block_rows


def test_streaming_split_gives_each_trainer_whole_batches(ray_cluster, tmp_path):
    job = _job(tmp_path)
    files = _write_shards(tmp_path, n_files=2, bad_labels=())
    pds = build_job_datasets(job, files, files, tmp_path / "q")
    splits = pds.train.streaming_split(2, equal=False)
    import ray

    @ray.remote(num_cpus=0)
    def consume(it):
        return sum(int(b["num_samples"][0].as_py()) for b in it.iter_batches(batch_size=1, batch_format="pyarrow"))

    counts = ray.get([consume.remote(s) for s in splits])
    assert sum(counts) == 500


def test_cpu_budget_split_and_errors(tmp_path):
    job = _job(tmp_path)
    budget = cpu_budget(job, 2.0)
    assert (budget.train, budget.data) == (1.0, 1.0)
    with pytest.raises(UserError, match="cpus_per_worker"):
        cpu_budget(job, 1.0)
    with pytest.raises(UserError, match="num_cpus"):
        cpu_budget(_job(tmp_path, data_cpus=0.1), 2.0)


def test_fused_pipeline_ships_each_planned_block_alone(ray_cluster, tmp_path):
    # Ray Data merges a read task's blocks up to its target block size (128 MiB: a whole file);
    # the job sets the target from a measured block, so the trainer gets blocks as they are made.
    job = _job(tmp_path, block_rows=128)  # 2 batches of 64 per block
    files = _write_shards(tmp_path, n_files=2, rows=1000, bad_labels=())
    pds = build_job_datasets(job, files, files[:1], tmp_path / "q", fused_op=OperatorConfig(concurrency=2, num_cpus=0.5))
    assert pds.block_bytes and "samples per block (~" in pds.describe()
    import ray

    rows = [ray.get(entry.ref).num_rows for bundle in pds.train.iter_internal_ref_bundles() for entry in bundle.blocks]
    assert sum(rows) == 2 * 16  # 16 packed batches per file (15 full + 1 short)
    assert len(rows) >= 2 * 1000 // 128, f"blocks of {rows} batches: merged, not one per planned block"
    assert max(rows) <= 2


def test_a_job_pipeline_starts_every_pass_at_full_width(ray_cluster, tmp_path):
    """Each execution (epoch, evaluation) runs its tasks side by side from its first second, not one at a time."""
    import ray.data

    from dlrm_platform.ingest.pipeline import starts_at_full_width

    def timed_sleep(batch: pa.Table, latency_s: float) -> pa.Table:  # defined here: Ray ships it by value
        import time

        start = time.time()
        time.sleep(latency_s)
        return pa.table({"start": [start]})

    def starts_of_one_pass() -> list[float]:
        ds = ray.data.range(8, override_num_blocks=8).map_batches(
            timed_sleep, fn_kwargs={"latency_s": 0.5}, batch_size=None, batch_format="pyarrow",
            num_cpus=1, concurrency=4)
        return sorted(r["start"] for r in starts_at_full_width(ds).iter_rows())

    starts_of_one_pass()  # the worker processes start once
    starts = starts_of_one_pass()
    # Ray Data alone runs one of them for the pass's first second (its CPU limit reads 0 until its coordinator answers)
    assert sum(s < starts[0] + 0.4 for s in starts) >= 3, [round(s - starts[0], 2) for s in starts]
