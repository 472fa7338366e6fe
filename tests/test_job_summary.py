"""The job summary: its one-line descriptions, where the run's log is, the run's page on an MLflow server
(no Ray: the summary is plain data)."""

from __future__ import annotations

from dlrm_platform.ingest.feed_report import FeedReport, PassStats, SharingStats
from dlrm_platform.job import JobSummary, describe_feed


def _pass(name="train", epoch=0, rows=141, first_block_s=2.0, produced_s=3.0, first_open_s=10.0) -> PassStats:
    return PassStats(name=name, epoch=epoch, generation=1, blocks=18, rows=rows,
                     first_block_s=first_block_s, produced_s=produced_s, first_open_s=first_open_s,
                     handed={"0": rows}, unbalanced=0, steps=0, uneven_steps=0, recut=0, shared=False, paid=True,
                     joined_late=False, cpu_s=1.0, error=None)


def _report(passes: list[PassStats]) -> FeedReport:
    return FeedReport(passes=passes, sharing=SharingStats(shared_streams=0, streams=len(passes),
                                                          served_from_shared_stream=False, cpu_s_saved=0.0,
                                                          cpu_s_paid=float(len(passes)), jobs_attached=1))


def test_feed_line_says_the_first_pass_was_ready_before_the_trainers_asked():
    line = describe_feed(_report([_pass(), _pass("eval", rows=16), _pass(epoch=1)]))
    assert line == "2 train pass(es) run; epoch 0: 141 batches, all produced 7.0 s before the trainers asked"


def test_feed_line_says_when_the_trainers_waited():
    line = describe_feed(_report([_pass(produced_s=12.5, first_open_s=10.0)]))
    assert "trainers asked 2.5 s before its last batch (first after 2.0 s)" in line


def test_feed_line_without_passes():
    assert describe_feed(None) == "-"
    assert describe_feed(_report([])) == "-"
    assert "epoch 3: 141 batches" in describe_feed(_report([_pass(epoch=3, produced_s=None)]))


def _summary(**extra) -> JobSummary:
    return JobSummary(job="demo", samples_per_s=1000.0, data_wait_fraction=0.1, auc=0.8, logloss=0.4, steps=10,
                      samples=10_000, train_time_s=10.0, wall_time_s=20.0, rows_quarantined=0, mlflow_run_id="abc",
                      mlflow_tracking_uri="sqlite:////x/runs/mlflow.db", checkpoint_path=None, **extra)


def test_summary_names_the_run_log_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = _summary(log_file=str(tmp_path / "runs" / "logs" / "demo-1.log")).render()
    assert "  run log             runs/logs/demo-1.log" in text.splitlines()
    assert "open it: make ui" in text


def test_summary_without_a_log_file_and_with_a_run_page():
    text = _summary(mlflow_run_url="http://mlflow:5000/#/experiments/2/runs/abc").render()
    assert "run log" not in text
    assert text.splitlines()[-1] == "  open it: http://mlflow:5000/#/experiments/2/runs/abc"


def test_summary_json_holds_the_feed_report_as_plain_data():
    import json

    assert json.loads(_summary(feed=_report([_pass()])).to_json())["feed"]["passes"][0]["rows"] == 141
    assert json.loads(_summary().to_json())["feed"] == {}
    # and --summary-json reads back typed
    back = JobSummary.from_json(_summary(feed=_report([_pass()])).to_json())
    assert back.feed.passes[0].rows == 141 and back == _summary(feed=_report([_pass()]))
    assert JobSummary.from_json(_summary().to_json()).feed is None


def test_summary_shows_the_epoch_cache_and_reads_back_typed():
    from dlrm_platform.train.result import CacheStats, EpochRecord

    epochs = [EpochRecord(epoch=0, data_wait_fraction=0.02, first_batch_latency_s=0.0, samples_per_s=9e4,
                          source="pipeline"),
              EpochRecord(epoch=1, data_wait_fraction=0.01, first_batch_latency_s=0.0, samples_per_s=9e4,
                          source="cache")]
    cache = {"train": CacheStats(state="complete", batches=141, samples=143_991, memory_mb=16.9, disk_mb=0.0,
                                 replayed=True)}
    summary = _summary(epochs=epochs, epoch_cache=cache)
    lines = summary.render().splitlines()
    assert "  epoch cache         complete: 141 batches, 16.9 MB in memory, 0.0 MB on disk; epochs 1 replayed " \
           "from it" in lines
    assert "  data-wait fraction  0.100  (per epoch: 0.020, 0.010)" in lines
    assert JobSummary.from_json(summary.to_json()) == summary
    off = {"train": CacheStats(state="off", batches=0, samples=0, memory_mb=0.0, disk_mb=0.0,
                               reason="ingest.cache.mode is off")}
    assert "  epoch cache         off (ingest.cache.mode is off)" in _summary(epoch_cache=off).render().splitlines()


def test_summary_names_the_tuner_policy_its_moves_and_final_tasks_and_reads_back():
    from dlrm_platform.job import describe_tuner

    tuner = {"policy": "plumber", "ticks": 40, "decisions": 3,
             "final_allocation": {"read": 1, "parse": 2, "dense_transform": 1}}
    summary = _summary(tuner=tuner)
    assert "  tuner               plumber: 3 decisions, final tasks read 1, parse 2, dense_transform 1" \
        in summary.render().splitlines()
    assert JobSummary.from_json(summary.to_json()).tuner == tuner
    assert describe_tuner({"policy": "auto", "decisions": 1}) == "auto: 1 decision"
    assert describe_tuner({}) == "-" and "  tuner               -" in _summary().render().splitlines()
