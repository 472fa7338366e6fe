"""`dlrm-platform run` end to end on a local Ray cluster: summary, MLflow run contents, what the terminal
shows and what the run's log file keeps, errors."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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
            # The feed service runs this tiny pass in 1-2 s: tick often enough that the tuner records some.
            "tuner.interval_s=0.2",
        ],
    )
    generate_dataset(job.data, progress=False)
    return job


@contextlib.contextmanager
def _terminal() -> Iterator[dict[str, str]]:
    """What the process writes on fds 1 and 2 (Python, Ray's threads, C++), as {"out": ..., "err": ...}.

    pytest's own capture points sys.stdout/sys.stderr elsewhere: they are pointed at the fds meanwhile.
    """
    sys.stdout.flush(), sys.stderr.flush()
    files = {name: tempfile.TemporaryFile(mode="w+b") for name in ("out", "err")}
    saved = {name: os.dup(fd) for name, fd in (("out", 1), ("err", 2))}
    streams = sys.stdout, sys.stderr
    text: dict[str, str] = {}
    try:
        os.dup2(files["out"].fileno(), 1)
        os.dup2(files["err"].fileno(), 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        yield text
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved["out"], 1), os.dup2(saved["err"], 2)
        for name, f in files.items():
            os.close(saved[name])
            f.seek(0)
            text[name] = f.read().decode(errors="replace")
            f.close()


# Lines of libraries and Ray that the terminal does not show without --verbose (the run's log file has them).
NOISE = ("[TBE=", "Planner Statistics", "is_fx_tracing", "Progress bars disabled")


@pytest.fixture(scope="module")
def cli_run(ray_cluster, small_job, tmp_path_factory):
    """`dlrm-platform run` through the CLI entry point, in-process (it reuses the module's Ray cluster)."""
    tmp = tmp_path_factory.mktemp("cli_run")
    config = tmp / "job.yaml"
    config.write_text(yaml.safe_dump(small_job.model_dump(mode="json")))
    summary_path = tmp / "summary.json"
    with _terminal() as terminal:
        rc = main(["run", str(config), "--summary-json", str(summary_path)])
    assert rc == 0, terminal["err"][-3000:]
    return JobSummary.from_json(summary_path.read_text()), terminal


def test_run_command_logs_a_complete_mlflow_run(cli_run, small_job):
    summary, _ = cli_run
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
    (first,) = [p for p in summary.feed.passes if (p.name, p.epoch) == ("train", 0)]
    assert first.rows == sum(first.handed.values()) > 0
    assert run.data.tags["feed_service"].startswith("1 train pass(es) run")
    # The tuner's decisions and throughput over time: a plot and the raw history.
    assert {"tuner_allocation.png", "tuner_history.json", "tuner_summary.json", "tuner_decisions.json",
            "tuner_report.txt"} <= artifacts
    assert client.get_metric_history(run.info.run_id, "tuner/samples_per_s")
    # The default policy, auto, on the demo's fused pipeline: it holds, and the report says why.
    assert small_job.tuner.policy == "auto"
    report = Path(client.download_artifacts(run.info.run_id, "tuner_report.txt")).read_text()
    assert "auto chose static: one operator" in report, report
    assert "training epoch 1: replayed from the epoch cache" in report, report
    assert client.list_artifacts(run.info.run_id, "model"), "model checkpoint artifact is empty"


def test_terminal_shows_stages_progress_and_summary_and_the_log_file_the_rest(cli_run, small_job):
    summary, terminal = cli_run
    out, err = terminal["out"], terminal["err"]
    for marker in NOISE:
        assert marker not in out + err, marker
    lines = out.splitlines()
    # One line per stage, in order; plain progress lines (stdout is not a terminal here); the summary.
    expected = ["data checked:", "run log:", "pipeline built:", "trainers starting:", "epoch 0: training",
                "epoch 0: trained", "epoch 0: evaluating", "epoch 0: held-out AUC", "epoch 1: training",
                "epoch 1: held-out AUC", "model export:", f"== {small_job.name}: done =="]
    at = [next((i for i, line in enumerate(lines) if line.startswith(prefix)), -1) for prefix in expected]
    assert -1 not in at and at == sorted(at), (expected, out)
    assert err == "", err
    log_file = Path(summary.log_file)
    assert any(line.startswith("  run log ") and line.endswith(str(log_file)) for line in lines), out
    text = log_file.read_text()
    for marker in NOISE + ("data checked:", "epoch 1 step 5: loss"):
        assert marker in text, marker


def test_a_worker_failure_reaches_the_terminal_and_fails_the_run(ray_cluster, small_job, tmp_path):
    # A config value only a worker acts on: the checkpoint to resume from does not exist.
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(small_job.model_dump(mode="json")))
    missing = tmp_path / "no-such-checkpoint"
    with _terminal() as terminal:
        rc = main(["run", str(config), "--set", f"train.resume_from={missing}", "--set", "train.max_failures=0"])
    assert rc == 1
    err = terminal["err"]
    assert "the job failed:" in err and "CheckpointCorruptError" in err and str(missing) in err
    assert "train_loop_per_worker" in err  # the worker's traceback, once
    assert err.count("CheckpointCorruptError: no intact checkpoint") == 1
    assert "job failed; the run log has everything:" in terminal["out"]


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
