"""Telemetry: the plot and the MLflow logging of a tuner's history."""

from __future__ import annotations

from dlrm_platform.tuner.recorder import TunerHandle, plot_history
from dlrm_platform.tuner.spec import OpSpec, TunerSpec


def _ticks(n=12):
    out = []
    for i in range(n):
        alloc = {"read": 2, "parse": 2 + (i >= 5) * 3}
        out.append({"type": "tick", "t": 1000.0 + i, "elapsed": float(i), "epoch": 1 + (i >= 8),
                    "throughput": 100.0 * (1 + (i >= 5)), "allocation": alloc, "mem_used": 1e6 * i,
                    "mem_fraction": 0.01 * i, "data_wait": 0.5, "decision": {"parse": 3} if i == 5 else None})
    return out


def test_plot_is_a_png(tmp_path):
    path = plot_history(_ticks(), tmp_path / "a" / "tuner.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_and_mlflow_logging(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    spec = TunerSpec("rec-test", "plumber", 8.0, [OpSpec("read", 1.0), OpSpec("parse", 1.0)])
    handle = TunerHandle(spec)
    handle._cache = _ticks()
    s = handle.summary()
    assert s["final_allocation"] == {"read": 2, "parse": 5} and s["decisions"] == 1 and s["epochs"] == 2
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("tuner-test", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(exp)
    handle.log_to_mlflow(client, run.info.run_id, artifact_dir=tmp_path / "art")
    hist = client.get_metric_history(run.info.run_id, "tuner/slots/parse")
    assert [m.value for m in sorted(hist, key=lambda m: m.step)][-1] == 5.0
    assert len(client.get_metric_history(run.info.run_id, "tuner/samples_per_s")) == 12
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"tuner_allocation.png", "tuner_history.json", "tuner_decisions.json", "tuner_report.txt"} <= arts
    del mlflow


def test_report_names_the_choice_each_decision_s_bottleneck_and_gain_the_cost_shifts_and_the_cached_epochs():
    spec = TunerSpec("rec-auto", "auto", 8.0, [OpSpec("read", 1.0), OpSpec("parse", 1.0)])
    handle = TunerHandle(spec)
    ticks = _ticks()
    ticks[5]["explanation"] = {"bottleneck": "parse", "expected_gain": 0.5,
                               "text": "bottleneck parse (100 samples/s); expected 150 samples/s (+50%)"}
    ticks[5]["cost_shifts"] = {"parse": 1.98}  # told in the tick that moved it 2 -> 5
    handle._cache = [{"type": "note", "epoch": 1, "choice": "plumber", "reason": "2 operators"}, *ticks,
                     {"type": "report", "epoch": 1, "text": "bottleneck: parse - lowest capacity"}]
    (move,) = handle.decisions()
    assert move["bottleneck"] == "parse" and move["expected_gain"] == 0.5 and move["change"] == {"parse": 3}
    assert handle.summary()["choices"] == [{"epoch": 1, "choice": "plumber", "reason": "2 operators"}]
    text = handle.report([{"epoch": 0, "source": "pipeline"}, {"epoch": 1, "source": "cache"}])
    assert "pipeline execution 1: auto chose plumber: 2 operators" in text
    assert "parse +3" in text and "expected 150 samples/s (+50%)" in text
    assert "bottleneck: parse - lowest capacity" in text
    assert handle.cost_shifts() == [{"elapsed_s": 5.0, "epoch": 1, "operator": "parse", "ratio": 1.98, "slots": 2}]
    assert "cost shifts told: 1" in text and "t=5.0s execution 1: parse costs 1.98x per row what it did, at 2 slots" in text
    assert "training epoch 1: replayed from the epoch cache" in text and "epoch 0: replayed" not in text
