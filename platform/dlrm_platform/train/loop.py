"""The Ray Train loop: what every training worker runs.

::

    train_loop_per_worker(config)
        loop     <- revalidate(config["loop"])              LoopConfig (+ JobConfig), re-validated
        model    <- build_sharded_model(job)                DMP, fused row-wise Adagrad
        progress <- restore the latest checkpoint, if any
        for epoch in progress.next_epoch .. epochs-1:
            train_epoch   lockstep steps over the "train" shard
            evaluate      lockstep forward over the "eval" shard -> AUC, logloss
            checkpoint    DCP save on every rank + ray.train.report(TrainReport)

Lockstep. With table-wise sharding every forward is a collective (the KJT
and pooled-embedding all-to-alls), so all workers must take the same number
of steps; yet every sample must be trained on exactly once per epoch, and the
shares of a pass (the feed service hands each block to one worker, see
:mod:`dlrm_platform.ingest.feed_service`) differ in size.
Before each step the workers all-reduce ``[has_batch, num_samples]``: they stop
when no worker has a batch, and a worker that is out of data runs a
zero-weight step on a one-sample dummy batch. The same all-reduce gives the
step's global sample count ``N``; each worker back-propagates
``loss_sum * world_size / N`` so that, after DDP averages the dense gradients,
every sample of the global step has the same weight however the samples are
spread over workers (batches differ in size: the last of each read task is
smaller). Fused embedding gradients are not averaged by DDP; row-wise Adagrad
is invariant to that scale.

Overlap. Each worker reads and unpacks its own next batches on a background
thread (:class:`.lockstep.BatchPrefetcher`, ``ingest.prefetch_batches`` ahead; on CUDA
it also pins them and copies them to the GPU on a side stream) while the
current step computes. Only host-side assembly runs ahead: the has-batch
all-reduce, and so the lockstep sequence of steps, stays on the training
thread, and no more tables are read than the steps can take (``max_steps``).
TorchRec's ``TrainPipelineSparseDist`` would also overlap the sparse
input all-to-all, but it owns forward, backward and the optimizer step and
rewrites the model's forward, which leaves no room for the zero-weight
lockstep steps and the per-step loss weights above.

Data wait. Per step, ``wait`` is the time from the end of the previous step
until every worker has its next batch as tensors (fetch from the shard,
unpack, has-batch all-reduce); with the prefetcher, fetching and unpacking
mostly happened during the previous step and ``wait`` is what remains;
``compute`` is forward, backward and the optimizer step. The data-wait
fraction ``wait / (wait + compute)``, summed over workers, is the platform's
central metric.

Hardware. Before building the model each worker sets its CPU threads and
picks its precision (:mod:`.perf`) and says so in the run log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dlrm_platform import run_metrics
from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import packed_digest
from dlrm_platform.ingest.dedup_batching import packed_batch_stats
from dlrm_platform.ingest.feed_client import FeedClient
from dlrm_platform.train.checkpoint import (
    CheckpointWriteError,
    TrainProgress,
    load_checkpoint,
    read_progress,
    save_checkpoint,
    usable_checkpoint,
)
from dlrm_platform.train.feed import ShardFeeder
from dlrm_platform.train.eval_metrics import auc, logloss_from_logits
from dlrm_platform.train.lockstep import StepBatch, all_reduce_sum, lockstep_batches
from dlrm_platform.train.loop_config import LoopConfig
from dlrm_platform.train.dedup_model import batch_codec, build_job_model
from dlrm_platform.train.model import build_dense_optimizer
from dlrm_platform.train.perf import (
    Precision,
    ThreadPlan,
    apply_precision,
    configure_threads,
    indexed_device,
    install_fp32_islands,
    plan_threads,
    ray_assigned_cpus,
    resolve_precision,
    visible_cpus,
)
from dlrm_platform.train.mlflow_logger import Tracker, make_tracker
from dlrm_platform.train.result import EpochEnd, EpochRecord, FeederReport, TrainReport
from dlrm_platform.output.progress import ProgressSink
from dlrm_platform.output.worker_logs import configure_worker_logging

__all__ = [
    "EpochStats",
    "Worker",
    "train_loop_per_worker",
]

log = logging.getLogger("dlrm_platform.train")

# Test hook, independent of the job config: when this env var names a file
# holding {"epoch": E, "step": S, "rank": R}, worker R deletes the file and
# raises after step S of epoch E. Deleting first makes it fire once.


# --------------------------------------------------------------------------- statistics


@dataclass
class EpochStats:
    """Running sums of one worker (``local``) or of all workers (after :meth:`all_reduced`)."""

    samples: int = 0
    loss_sum: float = 0.0
    wait_s: float = 0.0
    compute_s: float = 0.0
    wall_s: float = 0.0  # elapsed training time of this worker (not summed)
    first_wait_s: float | None = None  # this worker's wait for the first batch (first-batch latency)

    def add(self, samples: int, loss_sum: float, wait_s: float, compute_s: float) -> None:
        if self.first_wait_s is None:
            self.first_wait_s = wait_s
        self.samples += samples
        self.loss_sum += loss_sum
        self.wait_s += wait_s
        self.compute_s += compute_s

    def all_reduced(self) -> EpochStats:
        """Sums over all workers (a collective)."""
        t = all_reduce_sum(torch.tensor([self.samples, self.loss_sum, self.wait_s, self.compute_s],
                                         dtype=torch.float64))
        return EpochStats(int(t[0]), float(t[1]), float(t[2]), float(t[3]), self.wall_s, self.first_wait_s)

    @property
    def loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def data_wait_fraction(self) -> float:
        total = self.wait_s + self.compute_s
        return self.wait_s / total if total > 0 else 0.0



# --------------------------------------------------------------------------- the worker


@dataclass
class Worker:
    """The state one training worker carries through the epochs."""

    job: JobConfig
    model: Any  # DistributedModelParallel
    dense_optimizer: Any  # KeyedOptimizerWrapper
    device: torch.device
    rank: int
    world_size: int
    tracker: Tracker
    progress: TrainProgress = field(default_factory=TrainProgress)
    precision: Precision | None = None  # None: resolved from job.train.precision and the device
    threads: ThreadPlan | None = None  # as configured by train_loop_per_worker (reported, not applied here)
    epoch_log: list[EpochRecord] = field(default_factory=list)  # per epoch of this run: data wait, source
    live: ProgressSink = field(default_factory=ProgressSink)  # rank 0's progress to the driver's terminal

    def __post_init__(self) -> None:
        if self.precision is None:
            self.precision = resolve_precision(self.job, self.device)
        if self.precision.name == "bf16":  # the interaction and narrow layers stay fp32 (see .perf)
            install_fp32_islands(self.model, self.device.type)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around forward when the precision is bf16 (embeddings stay fp32 in fbgemm)."""
        return self.precision.autocast(self.device.type)

    # ----------------------------------------------------------------- one step

    def train_step(self, step: StepBatch) -> float:
        """Forward, backward (embeddings update in it), dense optimizer step. Returns the local loss sum."""
        self.dense_optimizer.zero_grad()
        with self.autocast():
            loss_sum, _ = self.model(step.batch)
        weight = self.world_size / step.global_samples if step.num_samples else 0.0
        (loss_sum * weight).backward()
        self.dense_optimizer.step()
        return float(loss_sum.detach()) if step.num_samples else 0.0

    # ----------------------------------------------------------------- one epoch

    def train_epoch(self, shard: Any, epoch: int) -> EpochStats:
        """Train on every batch of this epoch's shard (or pass of packed tables); return the sums over all workers.

        Checkpoints every ``checkpoint_every_steps`` global steps on the way, with the
        digests of the batches trained so far (the data position). Resumed from such a
        checkpoint, the feeder leaves those batches out and this epoch goes on from there.
        """
        train = self.job.train
        self.model.train()
        epoch_stats, unsaved, window = EpochStats(), EpochStats(), EpochStats()
        unsaved_start = window_start = time.perf_counter()
        p = self.progress
        resumed = p.epoch == epoch and not p.epoch_complete and bool(p.trained_in_epoch)
        if not resumed:
            p.step_in_epoch = p.samples_in_epoch = 0
            p.trained_in_epoch = []
        p.epoch, p.epoch_complete = epoch, False
        self.live.epoch_started(epoch, p.samples_in_epoch)
        before = list(p.trained_in_epoch)  # every worker's batches up to the checkpoint this run resumed from
        trained: list[str] = []  # this worker's since
        steps_left = None if train.max_steps_per_epoch is None else max(0, train.max_steps_per_epoch - p.step_in_epoch)
        for step in lockstep_batches(shard, self.job, self.device, steps_left):
            start = time.perf_counter()
            loss_sum = self.train_step(step)
            compute_s = time.perf_counter() - start
            self.progress.global_step += 1
            self.progress.step_in_epoch += 1
            self.progress.samples_in_epoch += step.global_samples
            if step.num_samples and step.digest is not None:
                trained.append(step.digest)
            for stats in (epoch_stats, unsaved, window):
                stats.add(step.num_samples, loss_sum, step.wait_s, compute_s)
            self._log_step(step, loss_sum, compute_s)
            if self.progress.step_in_epoch % train.log_every_steps == 0:
                self._log_window(epoch, window, time.perf_counter() - window_start)
                window, window_start = EpochStats(), time.perf_counter()
            if train.checkpoint_every_steps and self.progress.global_step % train.checkpoint_every_steps == 0:
                epoch_stats.wall_s += self._accumulate(unsaved, time.perf_counter() - unsaved_start)
                self.progress.trained_in_epoch = _all_gather_union(before + trained)
                self.checkpoint(self.report(epoch))
                unsaved, unsaved_start = EpochStats(), time.perf_counter()
        epoch_stats.wall_s += self._accumulate(unsaved, time.perf_counter() - unsaved_start)
        # The epoch's end checkpoint needs no position; it keeps what the epoch trained, every worker's batches
        # in one list (a batch trained twice would appear twice), so that exactly-once can be checked from outside.
        self.progress.trained_in_epoch = before + _all_gather_concat(trained)
        self.tracker.flush()
        total = epoch_stats.all_reduced()
        self.live.epoch_finished(epoch, total.samples, total.wall_s, total.data_wait_fraction, total.loss)
        return total

    def _accumulate(self, stats: EpochStats, elapsed_s: float) -> float:
        """Fold a stretch of steps (summed over workers) into ``progress``; returns ``elapsed_s``."""
        total = stats.all_reduced()
        self.progress.samples += total.samples
        self.progress.wait_s += total.wait_s
        self.progress.compute_s += total.compute_s
        self.progress.train_time_s += elapsed_s
        return elapsed_s

    def _log_step(self, step: StepBatch, loss_sum: float, compute_s: float) -> None:
        metrics = {
            run_metrics.SAMPLES_PER_S: step.global_samples / max(step.wait_s + compute_s, 1e-9),
            run_metrics.DATA_WAIT_FRACTION: step.wait_s / max(step.wait_s + compute_s, 1e-9),
            run_metrics.STEPS_DONE: float(self.progress.global_step),
        }
        if self.world_size > 1:
            metrics[run_metrics.STRAGGLER_WAIT_S] = step.straggler_s
        if step.num_samples:
            metrics[run_metrics.LOSS] = loss_sum / step.num_samples
            metrics.update(step.stats)
        self.tracker.log_step(self.progress.global_step, metrics)

    def _log_window(self, epoch: int, window: EpochStats, elapsed_s: float) -> None:
        total = window.all_reduced()
        self.tracker.flush()
        if self.rank == 0:
            log.info("epoch %d step %d: loss %.4f, %.0f samples/s, data-wait %.3f",
                     epoch, self.progress.step_in_epoch, total.loss, total.samples / max(elapsed_s, 1e-9),
                     total.data_wait_fraction)
            self.live.window(epoch, self.progress.samples_in_epoch, total.samples / max(elapsed_s, 1e-9),
                             total.data_wait_fraction, total.loss)

    # ----------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self, shard: Any) -> tuple[float, float, int]:
        """(AUC, logloss, samples) over the whole eval shard of every worker."""
        self.live.evaluating(self.progress.epoch)
        self.model.eval()
        logits, labels = [], []
        for step in lockstep_batches(shard, self.job, self.device):
            with self.autocast():
                _, out = self.model(step.batch)
            if step.num_samples:
                logits.append(out.float().cpu().numpy())
                labels.append(step.batch.labels.cpu().numpy())
        self.model.train()
        local = (np.concatenate(logits) if logits else np.zeros(0, np.float32),
                 np.concatenate(labels) if labels else np.zeros(0, np.float32))
        parts = [local]
        if dist.is_initialized() and self.world_size > 1:
            parts = [None] * self.world_size
            dist.all_gather_object(parts, local)
        all_logits = np.concatenate([p[0] for p in parts])
        all_labels = np.concatenate([p[1] for p in parts])
        return auc(all_logits, all_labels), logloss_from_logits(all_logits, all_labels), len(all_labels)

    # ----------------------------------------------------------------- checkpoints

    def report(self, epoch: int, start_epoch: int = 0, epoch_end: EpochEnd | None = None,
               feed: FeederReport | None = None) -> TrainReport:
        """The run's figures so far, as the driver reads them back (``result.TrainingResult``)."""
        p = self.progress
        busy = p.wait_s + p.compute_s
        return TrainReport(
            epoch=epoch,
            start_epoch=start_epoch,
            samples_per_s=p.samples / p.train_time_s if p.train_time_s else 0.0,
            data_wait_fraction=p.wait_s / busy if busy else 0.0,
            auc=p.auc if p.auc is not None else float("nan"),
            logloss=p.logloss if p.logloss is not None else float("nan"),
            steps=p.global_step,
            samples=p.samples,
            train_time_s=p.train_time_s,
            precision=self.precision.name,
            intra_op_threads=self.threads.intra_op if self.threads else torch.get_num_threads(),
            epochs=list(self.epoch_log),
            epoch_end=epoch_end,
            feed=feed or FeederReport(),
        )

    def checkpoint(self, report: TrainReport) -> None:
        """Save on every rank and report to Ray Train (which merges the ranks' directories)."""
        import ray.train

        p = self.progress
        name = f"checkpoint_e{p.epoch:03d}_s{p.global_step:08d}" + ("_end" if p.epoch_complete else "")
        with tempfile.TemporaryDirectory(prefix="dlrm-ckpt-") as tmp:
            save_checkpoint(tmp, self.model, self.dense_optimizer, self.progress)  # CheckpointWriteError
            try:
                ray.train.report(report.to_ray(), checkpoint=ray.train.Checkpoint.from_directory(tmp),
                                 checkpoint_dir_name=name)
            except OSError as err:  # the upload into storage: disk full, not writable
                storage = ray.train.get_context().get_storage().experiment_fs_path
                raise CheckpointWriteError(
                    f"cannot persist checkpoint {name} into {storage}/{name} (train.storage_path): "
                    f"{type(err).__name__}: {err}"
                ) from err
        self.live.checkpointed(p.epoch, name, end_of_epoch=p.epoch_complete, auc=p.auc, logloss=p.logloss)

    def restore(self, path: str) -> None:
        self.progress = load_checkpoint(path, self.model, self.dense_optimizer)
        if self.rank == 0:
            replay = "" if self.progress.epoch_complete else (
                f"; epoch {self.progress.epoch} restarts, replaying {self.progress.samples_in_epoch} samples"
            )
            log.info("restored %s: epoch %d, global step %d%s", path, self.progress.epoch,
                     self.progress.global_step, replay)
        p = self.progress
        self.live.restored(path, p.epoch, p.global_step, p.samples_in_epoch if not p.epoch_complete else 0)


@contextlib.contextmanager
def _latest_checkpoint_dir(job: JobConfig) -> Iterator[str | None]:
    """Ray Train's latest checkpoint (after a failure), else ``train.resume_from``, else None.

    Only an intact checkpoint is used: a truncated or incomplete one falls back to the
    newest intact one beside it (:func:`~.checkpoint.usable_checkpoint`).
    """
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as path:
            yield usable_checkpoint(path)
        return
    yield usable_checkpoint(job.train.resume_from) if job.train.resume_from else None


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point; ``config`` is :meth:`LoopConfig.to_ray`."""
    import ray.train
    import ray.train.torch

    loop = LoopConfig.received(config)  # crossed the Ray boundary: re-validated before anything else
    job = loop.job
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    configure_worker_logging()  # "LEVEL logger: message", so the driver can tell warnings from the rest
    assigned = ray_assigned_cpus()
    threads = configure_threads(plan_threads(assigned if assigned is not None else job.train.cpus_per_worker,
                                             visible_cpus(), context.get_local_world_size()))
    device = indexed_device(ray.train.torch.get_device()) if job.train.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # nccl collectives and all_gather_object use the current device
    precision = resolve_precision(job, device)
    apply_precision(precision, device)
    backend = dist.get_backend() if dist.is_initialized() else "none"
    log.info("rank %d on %s (%s): %s; %s", rank, device, backend, threads.describe(), precision.describe())

    with _latest_checkpoint_dir(job) as path, _start_feeder(loop, rank, path) as feeder:
        # The feeder is already reading the first epoch while the model is built and sharded.
        model = build_job_model(job, device)  # the dedup DLRM when ingest.dedup is on
        worker = Worker(job, model, build_dense_optimizer(model, job.train), device, rank, world_size,
                        make_tracker(loop.tracking_uri, loop.mlflow_run_id, rank), precision=precision,
                        threads=threads, live=ProgressSink(loop.mlflow_run_id, rank))
        if path:
            worker.restore(path)
        try:
            _train_epochs(worker, feeder, loop.has_eval, threads, precision)
        finally:  # what an MLflow outage kept buffered goes out now, or is reported lost
            worker.tracker.close()


def _start_feeder(loop: LoopConfig, rank: int, checkpoint_path: str | None) -> ShardFeeder:
    """This worker's :class:`~.feed.ShardFeeder` over the passes left to run (from the checkpoint's epoch on)."""
    import ray.train

    job = loop.job
    progress = read_progress(checkpoint_path) if checkpoint_path else None
    start_epoch = progress.next_epoch if progress is not None else 0
    names = ("train", "eval") if loop.has_eval else ("train",)
    if loop.feed_service is not None:
        shards = {n: (FeedClient(loop.feed_service, n, rank), loop.dataset_files.get(n, [])) for n in names}
    else:
        shards = {n: (ray.train.get_dataset_shard(n), loop.dataset_files.get(n, [])) for n in names}
    spill = loop.cache_dir or (str(job.ingest.cache.spill_dir) if job.ingest.cache.spill_dir else None)
    unpack = batch_codec(job, torch.device("cpu"))[0]  # host tensors; the prefetcher copies to the device
    return ShardFeeder(
        job=job,
        shards=shards,
        order=[(n, e) for e in range(start_epoch, job.train.epochs) for n in names],
        spill_dir=Path(spill) if spill else Path(tempfile.gettempdir()) / "dlrm-epoch-cache",
        rank=rank,
        limits={"train": job.train.max_steps_per_epoch},
        prefetch_batches=job.ingest.prefetch_batches,
        # Unpack on the feeder's thread, ahead (during the model build in epoch 0): a replayed
        # epoch then hands over ready tensors, and the trainer's thread never waits on an unpack.
        decode=lambda table: (unpack(table), packed_batch_stats(table), packed_digest(table)),
        digest=packed_digest,
        skip={("train", progress.epoch): frozenset(progress.trained_in_epoch)}
        if progress is not None and not progress.epoch_complete and progress.trained_in_epoch else {},
    )


def _all_gather_union(digests: list[str]) -> list[str]:
    """The union of every worker's ``digests`` (a collective), sorted."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return sorted(set(digests))
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, digests)
    return sorted({d for part in parts for d in part})


def _all_gather_concat(digests: list[str]) -> list[str]:
    """Every worker's ``digests``, concatenated in rank order (a collective); duplicates kept."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(digests)
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, digests)
    return [d for part in parts for d in part]


def _all_reduce_min(vote: int) -> int:
    """The minimum of every worker's ``vote`` (0/1), as a sum compared with the world size."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return int(int(all_reduce_sum(torch.tensor([vote], dtype=torch.int64))[0]) == world)


def _train_epochs(worker: Worker, feeder: ShardFeeder, has_eval: bool, threads: ThreadPlan,
                  precision: Precision) -> None:
    """The epochs left: train, evaluate, checkpoint; after each dataset's first pass, decide on replay."""
    job, rank = worker.job, worker.rank
    start_epoch = worker.progress.next_epoch
    for epoch in range(start_epoch, job.train.epochs):
        stats = worker.train_epoch(feeder.tables("train", epoch), epoch)
        feeder.decide("train", _all_reduce_min)  # a collective: every worker, same point of the loop
        eval_samples = 0
        if has_eval:
            worker.progress.auc, worker.progress.logloss, eval_samples = worker.evaluate(
                feeder.tables("eval", epoch))
            feeder.decide("eval", _all_reduce_min)
        worker.progress.epoch_complete = True
        feed = feeder.stats("train", epoch)
        worker.epoch_log.append(EpochRecord(
            epoch=epoch,
            data_wait_fraction=round(stats.data_wait_fraction, 4),
            first_batch_latency_s=round(stats.first_wait_s or 0.0, 3),
            samples_per_s=round(stats.samples_per_s, 1),
            source=feed.source,
        ))
        report = worker.report(epoch, start_epoch, feed=feeder.describe(), epoch_end=EpochEnd(
            train_loss=stats.loss, samples=stats.samples, eval_samples=eval_samples,
            data_wait_fraction=stats.data_wait_fraction, source=feed.source))
        worker.tracker.log_epoch(epoch, {  # MLflow's per-epoch names
            "epoch_train_loss": stats.loss,
            "eval_auc": report.auc,
            "eval_logloss": report.logloss,
            "epoch_samples_per_s": stats.samples_per_s,
            "epoch_data_wait_fraction": stats.data_wait_fraction,
            "epoch_first_batch_latency_s": stats.first_wait_s or 0.0,
            "epoch_from_cache": float(feed.source == "cache"),
            "intra_op_threads": float(threads.intra_op),
            "bf16": float(precision.name == "bf16"),
        })
        if rank == 0:
            log.info("epoch %d done: %s", epoch, json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                                              for k, v in report.model_dump(exclude={"epochs"}).items()}))
        worker.checkpoint(report)
    if start_epoch >= job.train.epochs:  # restored a finished run: report it again as the result
        if rank == 0:
            log.info("nothing to train: the checkpoint already completed %d epochs", job.train.epochs)
        worker.checkpoint(worker.report(worker.progress.epoch, start_epoch))

