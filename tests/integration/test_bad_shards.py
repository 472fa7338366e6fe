"""A corrupt Parquet shard in a training job: `data.on_bad_shard: fail` (default) stops the job before
Ray or MLflow start, naming the file; `skip` trains without it and reports it in the summary and MLflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from dlrm_platform.config import load_job_config
from dlrm_platform.ingest.synthetic_data import generate_dataset
from dlrm_platform.job import run_job

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[Path, Path]:
    """A small generated dataset plus one shard whose data pages are corrupt (its footer still reads)."""
    root = tmp_path_factory.mktemp("bad_shards")
    job = load_job_config(REPO / "configs" / "demo.yaml",
                          [f"data.path={root / 'data'}", "data.synthetic.num_sessions=600",
                           "data.synthetic.rows_per_shard=2000"])
    generate_dataset(job.data, progress=False)
    good = sorted((root / "data" / "train").glob("*.parquet"))[0]
    raw = bytearray(good.read_bytes())
    for at in range(8, len(raw) // 2, 5):
        raw[at] ^= 0x5A
    bad = root / "data" / "train" / "part-99999.parquet"
    bad.write_bytes(bytes(raw))
    return root, bad


def _config(root: Path, tmp_path: Path, *extra: str) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    raw["data"]["path"] = str(root / "data")
    raw["tracking"] = {**raw.get("tracking", {}), "runs_dir": str(tmp_path / "runs")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_fail_is_the_default_and_stops_before_ray(damaged, tmp_path) -> None:
    root, bad = damaged
    config = _config(root, tmp_path)
    out = subprocess.run([sys.executable, "-m", "dlrm_platform.cli", "run", str(config)], cwd=REPO,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(bad) in out.stderr and "data.on_bad_shard: skip" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # no MLflow run, no Ray


@pytest.mark.slow
def test_skip_trains_without_the_shard_and_reports_it(damaged, tmp_path, ray_cluster) -> None:
    root, bad = damaged
    job = load_job_config(_config(root, tmp_path), ["data.on_bad_shard=skip", "train.epochs=1",
                                                    "ingest.batch_size=256", "tracking.log_model=false"])
    summary = run_job(job)
    assert [b.split(": ", 1)[0] for b in summary.bad_shards] == [str(bad)]
    assert "cannot read its data" in summary.bad_shards[0]
    assert summary.samples > 0
    assert f"1 ({bad})" in summary.render()
    run = MlflowClient(summary.mlflow_tracking_uri).get_run(summary.mlflow_run_id)
    assert run.data.metrics["bad_shards_skipped"] == 1.0
