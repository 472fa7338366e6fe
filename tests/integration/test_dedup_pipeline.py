"""The dedup path on a local Ray cluster: converter, pipeline (exactly once per epoch), training end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_platform.config import JobConfig, OperatorConfig
from dlrm_platform.ingest import dedup_convert, dedup_storage
from dlrm_platform.ingest.dedup_batching import is_dedup_packed
from dlrm_platform.train.batches import unpack_dedup_batch
from dlrm_platform.ingest.pipeline import build_job_datasets
from dlrm_platform.ingest.transforms import count_quarantined

pytestmark = pytest.mark.integration

COLUMNS = {
    "label": "label",
    "session_key": "sid",
    "user": {"dense": ["ud"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["idn"], "categorical": ["ic"]},
}
MISSING_KEYS = 5
BAD_LABELS = 3


def _job(data: Path, **ingest) -> JobConfig:
    return JobConfig.model_validate({
        "name": "dedup-test",
        "data": {"path": str(data), "columns": COLUMNS},
        "ingest": {"batch_size": 32, "hash_size": 10**9, **ingest},
        "train": {"num_workers": 1, "cpus_per_worker": 0.5, "embedding_dim": 8, "bottom_mlp": [16, 8],
                  "top_mlp": [16, 1], "log_every_steps": 5},
    })


def _write_flat(root: Path, num_sessions: int, files: int, seed: int, max_len: int = 70) -> list[str]:
    """Flat shards in random order; sessions of up to ``max_len`` samples (some longer than a batch),
    a few samples without a session key or with a bad label; ``ic`` is unique per sample."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, num_sessions)
    n = int(lengths.sum())
    sess = np.repeat(np.arange(num_sessions), lengths)
    uc = rng.integers(0, 1000, num_sessions)
    hist = [rng.integers(0, 500, rng.integers(0, 9)).tolist() for _ in range(num_sessions)]
    keys = (sess * 3 + 11).astype(object)
    keys[rng.choice(n, MISSING_KEYS, replace=False)] = None
    labels = ((uc[sess] + np.arange(n)) % 2).astype(object)
    labels[rng.choice(n, BAD_LABELS, replace=False)] = None
    table = pa.table({
        "sid": pa.array(list(keys), pa.int64()),
        "label": pa.array(list(labels), pa.int64()),
        "ud": pa.array(rng.random(num_sessions)[sess].astype(np.float32)),
        "uc": pa.array(uc[sess]),
        "hist": pa.array([hist[s] for s in sess], pa.list_(pa.int64())),
        "idn": pa.array(rng.random(n).astype(np.float32)),
        "ic": pa.array(np.arange(n) + seed * 10**6),
    }).take(pa.array(rng.permutation(n)))
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i, chunk in enumerate(np.array_split(np.arange(n), files)):
        path = root / f"part-{i:05d}.parquet"
        pq.write_table(table.take(pa.array(chunk)), path)
        out.append(str(path))
    return out


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat") / "data"
    train = _write_flat(root / "train", 60, 3, seed=1)
    eval_ = _write_flat(root / "eval", 12, 1, seed=2)
    return root, train, eval_


def _rows(files: list[str]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


@pytest.mark.slow
def test_converter_counts_sessions_missing_keys_and_shrinks_storage(ray_cluster, flat_data, tmp_path):
    root, train, eval_ = flat_data
    out = tmp_path / "conv"
    # The Ray Data job (the in-process engine has its own tests); one split keeps this test short.
    report = dedup_convert.convert_to_dedup(_job(root).data.columns, {"train": train}, out, rows_per_shard=500, engine="ray")
    assert report.engines == {"train": "ray"}
    tr = report.splits["train"]
    assert tr.samples == _rows(train)  # nothing lost, nothing repeated
    assert tr.missing_session_keys == MISSING_KEYS
    assert tr.sessions == _distinct_keys(train) + MISSING_KEYS  # a sample without a key: its own session
    assert tr.shards >= 2  # cut by rows_per_shard, only between sessions
    assert report.bytes < report.source_bytes  # (tiny test shards: the real ratio is in benchmarks/dedup.py)
    ds = dedup_storage.DedupDataset.open(out)
    assert len(ds.shards("train")) == tr.shards
    assert json.loads((out / dedup_storage.MANIFEST_FILE).read_text())["format"] == dedup_storage.FORMAT_NAME
    # Every shard pair is self-contained and key-sorted; no key in two shards.
    seen = set()
    for u, s in ds.shards("train"):
        ukeys = pq.read_table(u, columns=["sid"]).column(0).to_numpy()
        skeys = pq.read_table(s, columns=["sid"]).column(0).to_numpy()
        assert (np.diff(ukeys) > 0).all() and (np.diff(skeys) >= 0).all()
        assert set(skeys) == set(ukeys) and not seen & set(ukeys)
        seen |= set(ukeys)
    with pytest.raises(Exception, match="already holds"):
        dedup_convert.convert_to_dedup(_job(root).data.columns, {"train": train}, out)


def _distinct_keys(files: list[str]) -> int:
    keys = pa.concat_tables([pq.read_table(f, columns=["sid"]) for f in files]).column("sid").drop_null()
    return len(set(keys.to_pylist()))


def _epoch(ds, job) -> tuple[list[int], list[int], list[float]]:
    cols = job.data.columns
    ids, sizes, factors = [], [], []
    for packed in ds.iter_batches(batch_size=1, batch_format="pyarrow"):
        assert is_dedup_packed(packed)
        b = unpack_dedup_batch(packed, cols.user_sparse_features, cols.item_sparse_features, 1, 1)
        ids += b.item_sparse["ic"].values().tolist()
        sizes.append(b.num_samples)
        factors.append(b.dedup_factor)
    return ids, sizes, factors


@pytest.mark.parametrize("fused_op", [None, OperatorConfig(concurrency=2, num_cpus=0.5)], ids=["split", "fused"])
def test_job_pipeline_trains_every_sample_exactly_once_per_epoch(ray_cluster, flat_data, tmp_path, fused_op):
    root, train, eval_ = flat_data
    job = _job(root)
    assert job.dedup_enabled  # on by default: the data has a session key
    quarantine = tmp_path / "quarantine"
    pds = build_job_datasets(job, train, eval_, quarantine, fused_op=fused_op)
    expected = _rows(train) - BAD_LABELS
    shards = len(dedup_storage.DedupDataset.open(dedup_storage.default_dedup_dir(root)).shards("train"))
    # only the last batch of a shard is short (fused: of a block, short by less than a session)
    short_allowed = shards if fused_op is None else shards + expected // pds.block_rows
    for _ in range(2):  # two epochs: each sample once in each
        ids, sizes, factors = _epoch(pds.train, job)
        assert len(ids) == len(set(ids)) == expected
        assert max(sizes) == 32 and sum(s < 32 for s in sizes) <= short_allowed
        assert np.mean(factors) > 3  # sessions average ~35 samples
    # parse runs in every epoch, but quarantine files are keyed by content, so a bad row is counted once
    assert count_quarantined(quarantine) == {"label missing or not 0/1": BAD_LABELS}
    eval_ids, _, _ = _epoch(pds.eval, job)
    assert len(eval_ids) == len(set(eval_ids)) == _rows(eval_) - BAD_LABELS
    # The converted copy is reused while the source is unchanged, converted again when it changes.
    ds1, rep1 = dedup_convert.ensure_dedup_dataset(job, train, eval_)
    assert rep1 is None
    pq.write_table(pq.read_table(train[0]).slice(0, 100), train[0])
    ds2, rep2 = dedup_convert.ensure_dedup_dataset(job, train, eval_)
    assert rep2 is not None and rep2.splits["train"].samples == _rows(train)


def test_jobs_started_together_convert_once_and_read_a_whole_copy(tmp_path):
    """Several jobs on the same fresh data (the job service starts them together): one converts, the
    others wait for it and reuse its copy; none finds a file of its copy gone (each used to convert
    and replace the directory under the others' readers)."""
    import threading

    root = tmp_path / "data"
    train = _write_flat(root / "train", 30, 2, seed=5, max_len=10)
    eval_ = _write_flat(root / "eval", 5, 1, seed=6, max_len=10)
    job = _job(root)
    results, errors = [], []

    def one_job() -> None:
        try:
            ds, report = dedup_convert.ensure_dedup_dataset(job, train, eval_)
            shards = ds.shards(job.data.train_split)
            results.append((report is not None, [Path(p).stat().st_size for pair in shards for p in pair]))
        except Exception as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=one_job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(converted for converted, _ in results) == 1
    assert len({tuple(sizes) for _, sizes in results}) == 1


@pytest.mark.slow
def test_dedup_job_trains_end_to_end_and_logs_dedup_metrics(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    from dlrm_platform.ingest.pipeline import cpu_budget, execution_options
    from dlrm_platform.train.trainer import run_training

    root = tmp_path / "data"
    train = _write_flat(root / "train", 40, 2, seed=3, max_len=20)
    eval_ = _write_flat(root / "eval", 10, 1, seed=4, max_len=20)
    job = _job(root, hash_size=1000)  # real tables this time (the counting tests hash into 10**9 rows)
    pds = build_job_datasets(job, train, eval_, tmp_path / "q")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("d", artifact_location=(tmp_path / "a").as_uri())).info.run_id
    budget = cpu_budget(job, 4.0)
    result = run_training(job, pds.as_dict(), mlflow_run_id=run_id, tracking_uri=uri,
                          storage_path=str(tmp_path / "ray"), execution_options=execution_options(budget))
    assert result.samples == _rows(train) - BAD_LABELS  # every sample exactly once in the epoch
    assert 0.0 <= result.auc <= 1.0 and math.isfinite(result.logloss)
    history = client.get_metric_history(run_id, "dedup_factor")
    assert history and all(m.value >= 1.0 for m in history) and max(m.value for m in history) > 2
    assert client.get_metric_history(run_id, "batch_bytes")
