"""`dlrm-platform run` end to end on a local Ray cluster: summary, MLflow run contents, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from dlrm_platform.config import load_job_config
from dlrm_platform.ingest.synthetic_data import generate_dataset
from dlrm_platform.cli import main
from dlrm_platform.job import JobSummary

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_job(tmp_path_factory):
    root = tmp_path_factory.mktemp("job")
    job = load_job_config(
        REPO / "configs" / "demo.yaml",
        [
            f"data.path={root / 'data'}",
            "data.synthetic.num_sessions=1500",
            "data.synthetic.rows_per_shard=4000",
            f"tracking.runs_dir={root / 'runs'}",
            "ingest.batch_size=256",
            "train.epochs=2",
            "train.log_every_steps=5",
        ],
    )
    generate_dataset(job.data, progress=False)
    return job


def test_run_command_logs_a_complete_mlflow_run(ray_cluster, small_job, tmp_path):
    # Through the CLI entry point, in-process: it reuses the module's Ray cluster.
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(small_job.model_dump(mode="json")))
    summary_path = tmp_path / "summary.json"
    assert main(["run", str(config), "--summary-json", str(summary_path)]) == 0
    summary = JobSummary(**json.loads(summary_path.read_text()))
    assert summary.samples > 0 and summary.steps > 0
    assert 0.0 <= summary.data_wait_fraction <= 1.0
    assert 0.5 < summary.auc <= 1.0 and summary.logloss > 0

    client = MlflowClient(summary.mlflow_tracking_uri)
    run = client.get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED"
    # The resolved config as params, flattened by section.
    assert run.data.params["train.epochs"] == "2"
    assert run.data.params["ingest.batch_size"] == "256"
    assert run.data.params["data.columns.session_key"] == "session_id"
    # Per-step series and final figures.
    for key in ("loss", "samples_per_s", "data_wait_fraction"):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) >= 2, key
    assert run.data.metrics["auc"] == pytest.approx(summary.auc)
    assert run.data.metrics["logloss"] == pytest.approx(summary.logloss)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "summary.json" in artifacts
    assert "model" in artifacts
    # The feed service ran the first train pass, which handed every batch to the trainer.
    assert "feed_service.json" in artifacts
    (first,) = [p for p in summary.feed["passes"] if (p["name"], p["epoch"]) == ("train", 0)]
    assert first["rows"] == sum(first["handed"].values()) > 0
    assert run.data.tags["feed_service"].startswith("1 train pass(es) run")
    # The tuner's decisions and throughput over time: a plot and the raw history.
    assert {"tuner_allocation.png", "tuner_history.json", "tuner_summary.json"} <= artifacts
    assert client.get_metric_history(run.info.run_id, "tuner/samples_per_s")
    assert client.list_artifacts(run.info.run_id, "model"), "model checkpoint artifact is empty"


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlrm_platform.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_rejects_bad_config_before_starting_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs" / "demo.yaml").read_text().replace("epochs: 2", "epochs: two"))
    out = _cli("run", str(bad), "--set", f"tracking.runs_dir={tmp_path / 'runs'}")
    assert out.returncode == 2
    assert "train.epochs" in out.stderr and str(bad) in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # no MLflow run, no Ray


def test_cli_names_missing_dataset_and_how_to_make_it(tmp_path):
    out = _cli("run", "configs/demo.yaml", "--set", f"data.path={tmp_path / 'nothing'}",
               "--set", f"tracking.runs_dir={tmp_path / 'runs'}")
    assert out.returncode == 2
    assert "gen-data" in out.stderr
    assert "Traceback" not in out.stderr
