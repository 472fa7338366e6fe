"""What crosses the Ray Train boundary: the typed LoopConfig in, the typed TrainReport out."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys

import cloudpickle
import pytest

from dlrm_platform.config import ConfigError
from dlrm_platform.ingest.feed_client import JobFeed
from dlrm_platform.ingest.feed_report import FeedReport, SharingStats
from dlrm_platform.train.loop import train_loop_per_worker
from dlrm_platform.train.loop_config import LOOP_KEY, LoopConfig
from dlrm_platform.train.result import (
    REPORT_KEY,
    CacheStats,
    EpochEnd,
    EpochRecord,
    FeederPass,
    FeederReport,
    TrainingResult,
    TrainReport,
)


def _shipped(obj):
    return pickle.loads(cloudpickle.dumps(obj))  # as Ray ships train_loop_config to every worker


def test_the_worker_receives_the_typed_config_re_validated(tiny_job):
    handle = object()  # stands in for the feed service's actor handle
    loop = LoopConfig(job=tiny_job(), mlflow_run_id="r1", dataset_files={"train": ["/d/a.parquet"]}, feed_service=handle)
    config = loop.to_ray()
    assert set(config) == {LOOP_KEY} and config[LOOP_KEY] is loop
    received = LoopConfig.received(config)
    assert received == loop and received is not loop and received.feed_service is handle
    assert LoopConfig.received(_shipped({LOOP_KEY: loop.model_copy(update={"feed_service": None})})).job == loop.job
    # A shared feed service's handle is a dataclass: it arrives as itself, not as a dict of its fields.
    feed = JobFeed(actor="actor-handle", job="job-1")
    shared = LoopConfig.received(_shipped(LoopConfig(job=tiny_job(), feed_service=feed).to_ray()))
    assert shared.feed_service == feed and isinstance(shared.feed_service, JobFeed)


def test_a_shared_feed_service_handle_arrives_as_sent(tiny_job):
    from dlrm_platform.ingest.feed_client import JobFeed

    feed = JobFeed(actor="actor-handle", job="job-a")  # a dataclass: re-validation alone would dump it to a dict
    loop = LoopConfig(job=tiny_job(), feed_service=feed)
    assert LoopConfig.received(_shipped(loop.to_ray())).feed_service == feed
    assert isinstance(LoopConfig.received(loop.to_ray()).feed_service, JobFeed)

def test_unpickling_the_config_imports_neither_torch_nor_torchrec(tiny_job):
    """Ray Train's controller unpickles ``train_loop_config`` in a fresh process that never trains.

    The class must not drag in torch or TorchRec there: on 2 cores those imports cost the controller
    seconds before it asks for its workers (every job, every retry).
    """
    feed = JobFeed(actor="actor-handle", job="job-a")
    payload = cloudpickle.dumps(LoopConfig(job=tiny_job(), feed_service=feed).to_ray())
    code = ("import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); "
            "print(type(c['loop']).__name__, sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, check=True).stdout
    assert out.decode().strip() == "LoopConfig []"



def test_the_worker_entry_rejects_an_invalid_config_naming_the_field(tiny_job):
    """A config changed past validation is refused where the worker starts, before it builds anything."""
    job = tiny_job()
    bad_job = job.model_copy(update={"train": job.train.model_copy(update={"num_workers": 0})})  # skips validation
    with pytest.raises(ConfigError, match=r"LoopConfig received across a Ray boundary: job\.train\.num_workers"):
        train_loop_per_worker(_shipped(LoopConfig(job=bad_job).to_ray()))
    bad_loop = LoopConfig.model_construct(job=job, has_eval="sometimes")
    with pytest.raises(ConfigError, match="has_eval"):
        train_loop_per_worker(_shipped(bad_loop.to_ray()))
    with pytest.raises(TypeError, match="train_loop_config must be"):  # the old dict form is gone
        train_loop_per_worker({"job": job.model_dump(mode="json"), "has_eval": True})


def _report(**fields) -> TrainReport:
    fields = {"auc": 0.8, "logloss": 0.5, **fields}
    return TrainReport(epoch=1, start_epoch=0, samples_per_s=1000.0, data_wait_fraction=0.4, steps=10, samples=320,
                       train_time_s=0.32, precision="fp32", intra_op_threads=1,
                       epochs=[EpochRecord(epoch=0, data_wait_fraction=0.5, first_batch_latency_s=0.1,
                                           samples_per_s=900.0, source="pipeline")],
                       epoch_end=EpochEnd(train_loss=0.6, samples=160, eval_samples=64, data_wait_fraction=0.3,
                                          source="cache"),
                       feed=FeederReport(caches={"train": CacheStats(state="complete", batches=5, samples=320,
                                                                     memory_mb=0.1, disk_mb=0.0, replayed=True)},
                                         passes=[FeederPass(name="train", epoch=0, source="pipeline", batches=5,
                                                            samples=320, skipped=0, first_batch_s=0.01,
                                                            source_s=0.3)]),
                       **fields)


def test_the_driver_reads_back_the_report_under_the_same_names():
    report = _report()
    metrics = _shipped(report.to_ray())  # what Ray Train keeps of the report (plain data)
    assert set(metrics) == {REPORT_KEY} and isinstance(metrics[REPORT_KEY], dict)
    fed = FeedReport(passes=[], sharing=SharingStats(shared_streams=0, streams=1, served_from_shared_stream=False,
                                                     cpu_s_saved=0.0, cpu_s_paid=1.5, jobs_attached=1))
    result = TrainingResult.from_ray(metrics, "/ckpt/e1", feed_service=fed)
    assert result.auc == 0.8 and result.logloss == 0.5 and result.precision == "fp32"
    assert result.epochs == report.epochs and result.epoch_end == report.epoch_end
    assert result.checkpoint_path == "/ckpt/e1" and result.feed_service == fed
    assert result.feed == report.feed and result.feed.caches["train"].replayed  # the worker's feeder, typed
    no_eval = TrainingResult.from_ray(_report(auc=math.nan).to_ray(), None)
    assert math.isnan(no_eval.auc)


def test_the_driver_rejects_a_report_it_does_not_know():
    metrics = _report().to_ray()
    metrics[REPORT_KEY]["eval_auc"] = 0.8  # a renamed figure is an error, not a silent NaN
    with pytest.raises(ValueError, match="eval_auc"):
        TrainingResult.from_ray(metrics, None)
    metrics = _report().to_ray()
    metrics[REPORT_KEY]["feed"]["caches"]["train"]["state"] = "full"
    with pytest.raises(ValueError, match="state"):
        TrainingResult.from_ray(metrics, None)
    with pytest.raises(RuntimeError, match="no 'report'"):
        TrainingResult.from_ray({"auc": 0.8}, None)
