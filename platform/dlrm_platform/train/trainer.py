"""Driver side of training: build the TorchTrainer, run it, return the figures.

:func:`run_training` is all the rest of the platform calls. It holds no
model: the workers build, shard and train it (:mod:`.loop`); the driver only
configures Ray Train and reads back the :class:`~.result.TrainReport` reported
with the last checkpoint (Ray Train V2 keeps metrics only for reports with a
checkpoint), validated into a :class:`~.result.TrainingResult`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.feed_client import (
    FeedHeartbeat,
    JobFeed,
    read_feed_report,
    start_feed_service,
    start_shared_feed_service,
    stop_feed_service,
)
from dlrm_platform.ingest.feed_report import FeedReport
from dlrm_platform.ingest.pipeline import RESOURCE_SLIVER
from dlrm_platform.train.loop_config import LoopConfig
from dlrm_platform.train.result import TrainingResult

if TYPE_CHECKING:
    from ray.data import Dataset, ExecutionOptions

log = logging.getLogger("dlrm_platform.train")

#: How often Ray Train's controller polls the workers, in seconds, unless the user set it. A worker's
#: ``ray.train.report`` waits for the controller to take the previous report (a queue of one), and Ray's
#: default of 2 s held every checkpoint after the first for up to 2 s: 12 s of a 20-step job that
#: checkpoints every 3 steps. A poll asks each worker for its status: cheap next to a training step.
CONTROLLER_POLL_S = 0.25
_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # Ray Train V2 propagates it from the driver to the controller

__all__ = ["TrainingResult", "run_training"]


def run_training(
    job: JobConfig,
    datasets: dict[str, Dataset],
    *,
    mlflow_run_id: str | None,
    tracking_uri: str | None,
    storage_path: str,
    execution_options: ExecutionOptions | dict[str, ExecutionOptions] | None = None,
    run_name: str | None = None,
    dataset_files: dict[str, list[str]] | None = None,
    cache_dir: str | None = None,
) -> TrainingResult:
    """Train ``job``'s DLRM on ``datasets["train"]`` (packed batches), evaluate on ``datasets["eval"]``.

    ``dataset_files`` (what each pipeline reads) keys the workers' epoch caches,
    which spill under ``cache_dir``. ``run_name`` names the Ray Train run under ``storage_path``; a run of the
    same name and storage path resumes from its latest checkpoint. Default:
    ``<job.name>-<mlflow_run_id>`` (so a retried job with the same MLflow run
    resumes), or a fresh random suffix without a run id.
    """
    if "train" not in datasets:
        raise ValueError(f"datasets must hold 'train' (and optionally 'eval'), got {sorted(datasets)}")
    train = job.train
    name = run_name or f"{job.name}-{mlflow_run_id or uuid.uuid4().hex[:8]}"
    feed = _start_feed(job, {k: v for k, v in datasets.items() if k in ("train", "eval")}, execution_options,
                       dataset_files or {}, name)
    heartbeat = FeedHeartbeat(feed)
    loop_config = LoopConfig(job=job, mlflow_run_id=mlflow_run_id, tracking_uri=tracking_uri,
                             has_eval="eval" in datasets,
                             dataset_files={k: [str(f) for f in v] for k, v in (dataset_files or {}).items()},
                             cache_dir=cache_dir, feed_service=feed)
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config=loop_config.to_ray(),  # the typed LoopConfig; the workers re-validate it
        # nccl between GPU workers (collectives on CUDA tensors), gloo on CPU.
        torch_config=TorchConfig(backend="nccl" if train.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=train.num_workers,
            use_gpu=train.use_gpu,
            # + 1 GPU each with use_gpu; + a sliver of the trainer nodes' resource with ray.placement
            resources_per_worker={"CPU": train.cpus_per_worker, **trainer_resources(job)},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints),
        ),
        # No ``datasets``: the workers read from the feed service (see ingest/feed_service.py for why).
    )
    poll_controller_often()
    try:
        result = trainer.fit()
        feed_report = _feed_report(feed)
    finally:
        heartbeat.close()
        stop_feed_service(feed)
    if result.error is not None:
        raise result.error
    if result.metrics is None:
        raise RuntimeError(f"training run {name!r} reported no checkpoint with metrics")
    checkpoint_path = result.checkpoint.path if result.checkpoint is not None else None
    return TrainingResult.from_ray(result.metrics, checkpoint_path, feed_service=feed_report)


def poll_controller_often(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set Ray Train's controller poll interval to :data:`CONTROLLER_POLL_S` unless ``environ`` sets it;
    the value in force."""
    return environ.setdefault(_POLL_ENV, str(CONTROLLER_POLL_S))


def _train_loop_per_worker(config: dict) -> None:
    """The workers' entry: the loop (TorchRec, fbgemm: seconds to import) loads in the workers only."""
    from dlrm_platform.train.loop import train_loop_per_worker

    train_loop_per_worker(config)


def trainer_resources(job: JobConfig) -> dict[str, float]:
    """What each training worker asks beyond CPUs: its nodes' resource (``ray.placement.trainer_resource``)."""
    resource = job.ray.placement.trainer_resource
    return {resource: RESOURCE_SLIVER} if resource else {}


def _start_feed(job: JobConfig, datasets: dict[str, Dataset],
                execution_options: ExecutionOptions | dict[str, ExecutionOptions] | None,
                dataset_files: dict[str, list[str]], run_name: str) -> ray.actor.ActorHandle | JobFeed:
    """The job's feed service over ``datasets``, already running the first passes (with ``ingest.read_ahead``).

    With ``ingest.share`` (and known input files) the service is the one shared by every job whose
    pipelines have the same fingerprint (:func:`feed_fingerprint`): this job attaches to it, or creates it.
    """
    step_samples = job.ingest.step_samples(job.train.num_workers)
    for name, ds in datasets.items():
        options = execution_options.get(name) if isinstance(execution_options, dict) else execution_options
        if options is not None:
            ds.context.execution_options = options
        if step_samples:  # steps are cut in stream order: the same order every run, so a resume re-cuts alike
            ds.context.execution_options.preserve_order = True
        if ds.name is None:
            ds.set_name(name)
    # Epoch 0's passes, in the order the workers read them; resuming, the workers say where from.
    ahead = [(n, 0) for n in ("train", "eval") if n in datasets] if (
        job.ingest.read_ahead and job.train.resume_from is None) else []
    if job.ingest.share == "auto" and all(dataset_files.get(n) for n in datasets):
        return start_shared_feed_service(
            datasets, fingerprint=feed_fingerprint(job, {n: dataset_files[n] for n in datasets}), job=run_name,
            consumers=job.train.num_workers, ahead=ahead, step_samples=step_samples,
            retain_bytes=int(job.ingest.share_retain_mb * (1 << 20)))
    return start_feed_service(datasets, consumers=job.train.num_workers, ahead=ahead, step_samples=step_samples)


def feed_fingerprint(job: JobConfig, files: dict[str, list[str]]) -> str:
    """What a shared feed service is keyed by: each dataset's name and the epoch cache's fingerprint of it."""
    import hashlib

    from dlrm_platform.train.feed import batch_fingerprint

    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}={batch_fingerprint(job, files[name])};".encode())
    return h.hexdigest()[:16]


def _feed_report(feed: ray.actor.ActorHandle | JobFeed) -> FeedReport | None:
    try:
        return read_feed_report(feed)
    except Exception as err:  # noqa: BLE001 - telemetry must not fail a finished run
        log.warning("feed service did not describe its passes: %s", err)
        return None
