"""The Ray Data preprocessing pipeline builder.

    read_parquet -> parse -> dense_transform -> sparse_transform -> batch
      (read)        one named map_batches operator each, with its own
                    concurrency and CPUs from ``IngestConfig.operators``

With fusion (``ingest.fusion``, :mod:`.fused`) the five stages run as one read
operator instead, one task per file or dedup shard pair yielding a block per
~``block_rows`` samples. :func:`build_job_datasets` is the one place that
picks plain or dedup, fused or split.

The result streams packed batches (``ingest.batching``) into the Ray Train
workers through the job's feed service (:mod:`.feed_service`). The CPU budget is explicit: Ray Data gets ``data_cpus``
(by default the cluster's CPUs minus the trainers'), so the pipeline and the
trainers never wait on each other's reservations (ARCHITECTURE.md, "CPU budget": on 2 CPUs,
trainers asking 1 CPU each otherwise starve Ray Data and the run hangs).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from pathlib import Path

import pyarrow as pa
import ray
from ray.data import Dataset, ExecutionOptions, ExecutionResources, TaskPoolStrategy

from dlrm_platform.config import OPERATOR_NAMES, IngestConfig, JobConfig, OperatorConfig, revalidate
from dlrm_platform.errors import UserError
from dlrm_platform.ingest import dedup_convert, dedup_operators, fused, transforms
from dlrm_platform.ingest.dedup_sessions import SessionParquetDatasource
from dlrm_platform.ingest.transforms import TransformSpec

log = logging.getLogger(__name__)

_MAP_OPERATORS: tuple[tuple[str, Callable[[pa.Table, TransformSpec], pa.Table]], ...] = (
    ("parse", transforms.parse),
    ("dense_transform", transforms.dense_transform),
    ("sparse_transform", transforms.sparse_transform),
)
_DEDUP_MAP_OPERATORS: tuple[tuple[str, Callable[[pa.Table, TransformSpec], pa.Table]], ...] = (
    ("parse", dedup_operators.parse),
    ("dense_transform", dedup_operators.dense_transform),
    ("sparse_transform", dedup_operators.sparse_transform),
)


@dataclass(frozen=True)
class CpuBudget:
    """How the cluster's CPUs are split between Ray Data and the trainers."""

    total: float
    train: float
    data: float
    # With ray.placement.data_resource and no ingest.data_cpus: Ray Data's limit follows the data nodes
    # (data nodes added while the job runs get work; see execution_options).
    elastic: bool = False
    # Elastic only: the most data CPUs the task pools and the tuner are sized for (ray.placement.max_data_cpus).
    ceiling: float | None = None

    @property
    def sized_for(self) -> float:
        """The data CPUs the pipeline's task pools and the tuner are sized for: :attr:`data`, or the elastic ceiling.

        Sizing an elastic pipeline for today's CPUs would cap it there; Ray Data's live
        limit (the data nodes present) keeps what runs within what exists.
        """
        return max(self.data, self.ceiling) if self.elastic and self.ceiling else self.data

    def describe(self) -> str:
        text = f"{self.total:g} CPUs: {self.train:g} for training, {self.data:g} for data"
        return text + (f" (elastic: follows the data nodes, sized for up to {self.sized_for:g})" if self.elastic else "")


# A placed process asks this much of its node group's custom resource: enough to pin it there,
# too little to ever limit how many run (a node offering 1 unit holds 1000 of them).
RESOURCE_SLIVER = 0.001


def _train_cpus(job: JobConfig) -> float:
    return job.train.num_workers * job.train.cpus_per_worker


def data_remote_args(job: JobConfig) -> dict:
    """Ray remote args every Ray Data task of ``job`` gets: its data nodes' resource (``ray.placement``)."""
    resource = job.ray.placement.data_resource
    return {"resources": {resource: RESOURCE_SLIVER}} if resource else {}


def placed_data_cpus(job: JobConfig, nodes: list[dict]) -> float | None:
    """CPUs of the alive nodes offering ``ray.placement.data_resource`` (None when unset).

    ``nodes``: ``ray.nodes()``. Trainers that may land on the same nodes (no
    ``trainer_resource``, or a node offering both) are taken off, so that data
    operators never take the trainers' CPUs.
    """
    placement = job.ray.placement
    if placement.data_resource is None:
        return None
    data_nodes = [n for n in nodes if n.get("Alive", True) and placement.data_resource in n.get("Resources", {})]
    if not data_nodes:
        raise UserError(
            f"no alive Ray node offers the resource {placement.data_resource!r} (ray.placement.data_resource): "
            f"start data nodes with ray start --resources='{{\"{placement.data_resource}\": 1}}' (infra/kuberay's "
            "data group does), or unset ray.placement.data_resource"
        )
    cpus = sum(float(n["Resources"].get("CPU", 0)) for n in data_nodes)
    shared = placement.trainer_resource is None or any(placement.trainer_resource in n["Resources"] for n in data_nodes)
    return cpus - (_train_cpus(job) if shared else 0.0)


# Without ray.placement.max_data_cpus, an elastic pipeline is sized for this many times its data CPUs at start.
ELASTIC_HEADROOM = 4.0


def placement_ceiling(job: JobConfig, data_cpus: float) -> float:
    """The most data CPUs an elastic job's pipeline is sized for (``ray.placement.max_data_cpus``)."""
    configured = job.ray.placement.max_data_cpus
    return float(configured) if configured is not None else ELASTIC_HEADROOM * data_cpus


def cpu_budget(job: JobConfig, cluster_cpus: float, nodes: list[dict] | None = None) -> CpuBudget:
    """Split ``cluster_cpus``; raise a UserError naming the fields when they do not fit.

    With ``ray.placement.data_resource`` (and ``nodes``, from ``ray.nodes()``),
    Ray Data's share is the data nodes' CPUs (:func:`placed_data_cpus`).
    """
    train = _train_cpus(job)
    placed = placed_data_cpus(job, nodes) if nodes is not None else None
    if placed is not None:
        data = job.ingest.data_cpus if job.ingest.data_cpus is not None else placed
        if data <= 0:
            raise UserError(f"the data nodes (ray.placement.data_resource={job.ray.placement.data_resource!r}) have "
                            f"no CPUs left after the trainers' {train:g}; add data nodes or set "
                            "ray.placement.trainer_resource to keep trainers off them")
        elastic = job.ingest.data_cpus is None
        ceiling = (placement_ceiling(job, data) if elastic else None)
        return CpuBudget(total=cluster_cpus, train=train, data=data, elastic=elastic, ceiling=ceiling)
    data = job.ingest.data_cpus if job.ingest.data_cpus is not None else cluster_cpus - train
    if data <= 0 or train + data > cluster_cpus + 1e-9:
        raise UserError(
            f"the cluster has {cluster_cpus:g} CPUs but train.num_workers x train.cpus_per_worker = {train:g}"
            f" and ingest.data_cpus = {data:g}; lower train.cpus_per_worker (fractions are fine) or set"
            " ingest.data_cpus so that both fit"
        )
    # Every operator must be able to run one task at once, or the pipeline stalls silently.
    one_task_each = sum(getattr(job.ingest.operators, n).num_cpus for n in OPERATOR_NAMES)
    if one_task_each > data + 1e-9:
        raise UserError(
            f"one task of every ingest operator needs {one_task_each:g} CPUs but Ray Data gets {data:g};"
            " lower ingest.operators.*.num_cpus (fractions are fine) or raise ingest.data_cpus"
        )
    return CpuBudget(total=cluster_cpus, train=train, data=data)


def cluster_cpu_budget(job: JobConfig) -> CpuBudget:
    """:func:`cpu_budget` on the connected Ray cluster (its node list only when ``ray.placement`` needs it)."""
    nodes = ray.nodes() if job.ray.placement.data_resource else None
    return cpu_budget(job, float(ray.cluster_resources().get("CPU", 0)), nodes)


def execution_options(budget: CpuBudget) -> ExecutionOptions:
    """Ray Data execution options that keep the pipeline inside its CPU budget.

    A fixed budget is a CPU limit, frozen when the job starts. An elastic one
    (data placed on data nodes, :attr:`CpuBudget.elastic`) excludes the CPUs that are
    not the data nodes' instead: Ray Data re-reads the cluster's size every second
    (``ResourceManager.get_global_limits``), so a data node added while the job
    runs raises the limit and gets work at once, without restarting anything.
    """
    if budget.elastic:
        # Deprecated in Ray 2.60 in favour of label_selector (node labels), which ray.placement does not use yet.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ExecutionOptions(exclude_resources=ExecutionResources(cpu=max(0.0, budget.total - budget.data)))
    return ExecutionOptions(resource_limits=ExecutionResources(cpu=budget.data))


def _task_entry(fn: Callable[..., pa.Table]) -> Callable[..., pa.Table]:
    """``fn`` as a Ray Data task runs it: ``spec`` crossed a Ray boundary and is re-validated first.

    Keeps ``fn``'s name: Ray Data names the operator after it (``MapBatches(parse)``), and so does the tuner.
    """
    @functools.wraps(fn)
    def entry(block: pa.Table, spec: TransformSpec, **kwargs: Any) -> pa.Table:
        return fn(block, revalidate(spec), **kwargs)

    return entry


def _map_operator(ds: Dataset, fn: Callable, op: OperatorConfig, spec: TransformSpec,
                  batch_size: int | None = None, remote_args: dict | None = None) -> Dataset:
    return ds.map_batches(
        _task_entry(fn),
        fn_kwargs={"spec": spec},
        batch_format="pyarrow",
        batch_size=batch_size,
        zero_copy_batch=True,
        compute=TaskPoolStrategy(size=op.concurrency),
        num_cpus=op.num_cpus,
        **(remote_args or {}),
    )


def build_dataset(files: list[str], spec: TransformSpec, ingest: IngestConfig,
                  remote_args: dict | None = None) -> Dataset:
    """The full pipeline over ``files``: a Dataset of packed batches, one row per training batch.

    ``remote_args``: Ray remote args of every task (placement, :func:`data_remote_args`).
    """
    ops = ingest.operators
    ds = ray.data.read_parquet(
        files,
        columns=spec.columns.columns,
        concurrency=ops.read.concurrency,
        num_cpus=ops.read.num_cpus,
        ray_remote_args=remote_args or None,
    )
    for name, fn in _MAP_OPERATORS:
        ds = _map_operator(ds, fn, getattr(ops, name), spec, remote_args=remote_args)
    return _map_operator(ds, transforms.batch, ops.batch, spec, batch_size=ingest.batch_size, remote_args=remote_args)


def build_dedup_dataset(shards: list[tuple[str, str]], spec: TransformSpec, ingest: IngestConfig,
                        remote_args: dict | None = None) -> Dataset:
    """The dedup pipeline over shard pairs: a Dataset of packed IKJT batches, one row per batch.

    Same operator names as :func:`build_dataset` (``ReadSessionParquet``, then
    :mod:`.dedup_operators` on session blocks), so the tuner sees the same knobs.
    """
    ops = ingest.operators
    ds = ray.data.read_datasource(
        SessionParquetDatasource(shards, spec.columns, spec.quarantine_dir),
        # One block per shard pair: Ray Data would otherwise split a pair's block to reach its default
        # parallelism, and every block ends in a short batch and cuts sessions at its edges.
        override_num_blocks=len(shards),
        concurrency=ops.read.concurrency,
        num_cpus=ops.read.num_cpus,
        ray_remote_args=remote_args or None,
    )
    for name, fn in _DEDUP_MAP_OPERATORS:
        ds = _map_operator(ds, fn, getattr(ops, name), spec, batch_size=None, remote_args=remote_args)
    return ds.map_batches(_task_entry(dedup_operators.batch), fn_kwargs={"spec": spec, "batch_size": ingest.batch_size},
                          batch_format="pyarrow", batch_size=None, zero_copy_batch=True,
                          compute=TaskPoolStrategy(size=ops.batch.concurrency), num_cpus=ops.batch.num_cpus,
                          **(remote_args or {}))


@dataclass
class PipelineDatasets:
    """The train and held-out datasets of one job, what each reads, and where parse quarantines rows.

    ``files``: the files each pipeline reads (flat Parquet, or the dedup shard
    pairs), which key the trainers' epoch caches; ``fused``: whether the
    operators run as one task (:mod:`.fused`); ``block_rows``: samples per
    block of the fused pipeline (None when split).
    """

    train: Dataset
    eval: Dataset
    quarantine_dir: Path
    files: dict[str, list[str]]
    fused: bool = False
    block_rows: int | None = None
    block_bytes: int | None = None  # measured packed bytes of a planned block (fused; None if not measured)

    def as_dict(self) -> dict[str, Dataset]:
        return {"train": self.train, "eval": self.eval}

    def describe(self) -> str:
        if not self.fused:
            return "split: one Ray Data operator per stage (" + ", ".join(OPERATOR_NAMES) + ")"
        size = f" (~{self.block_bytes / 2**20:.1f} MiB)" if self.block_bytes else ""
        return f"fused: read..batch in one task, {self.block_rows:,} samples per block{size}"


def fused_operator(ingest: IngestConfig, data_cpus: float, sized_for: float | None = None,
                   read_tasks: int | Callable[[], int] | None = None) -> OperatorConfig:
    """Tasks and CPUs of the fused operator: ``ingest.fused``, else from the data CPUs.

    At most 1 CPU per task and at least two tasks, so that one task's reads
    and object-store puts overlap another's transforms even on a single data
    CPU (measured on the demo, 1 data CPU: two half-CPU tasks beat one).
    ``sized_for`` (an elastic budget's :attr:`CpuBudget.sized_for`): as many
    tasks as that many CPUs hold, so that data nodes joining later get tasks.

    ``read_tasks`` (an epoch's read tasks: files or row-group ranges, dedup shard
    pairs): where they would run as one full wave of tasks and a partial second
    one, they run as one wave of thinner tasks within the same CPUs instead, so
    no CPU idles while the last tasks finish (the demo's 3 shard pairs on 1 data
    CPU: 2 x 0.5 CPU left half the budget idle for a third of every epoch; 3 x
    0.333 CPU, `benchmarks/tuner.py --suite`: the pipeline alone ~1.2x). Not for
    an elastic budget, whose tasks are sized for nodes that have not joined. A
    callable is asked only where the rule applies (counting may locate the dedup
    copy or read every file's Parquet footer: :func:`train_read_tasks`).
    """
    if ingest.fused is not None:
        return ingest.fused
    num_cpus = min(1.0, data_cpus / 2)
    cpus = max(data_cpus, sized_for or 0.0)
    concurrency = max(2, int(math.floor(cpus / num_cpus + 1e-9)))
    if read_tasks is not None and cpus <= data_cpus:
        tasks = read_tasks() if callable(read_tasks) else read_tasks
        if concurrency < tasks <= 2 * concurrency:
            # rounded down: tasks x num_cpus must fit the budget, or one task waits for the others
            return OperatorConfig(concurrency=tasks, num_cpus=math.floor(1000 * data_cpus / tasks) / 1000)
    return OperatorConfig(concurrency=concurrency, num_cpus=num_cpus)


def train_read_tasks(job: JobConfig, train_files: list[str], eval_files: list[str]) -> int:
    """How many read tasks one train epoch of the fused pipeline runs (:func:`fused_operator`'s ``read_tasks``).

    With deduplication the dedup copy is located (converted on first use, as building the pipeline would).
    """
    if job.dedup_enabled:
        return len(dedup_convert.dedup_job_shards(job, train_files, eval_files)[0])
    return fused.count_read_tasks(train_files)


def _import_operators(hold_s: float) -> int:
    import time

    import dlrm_platform.ingest.fused  # noqa: F401  - what every fused read task imports first
    time.sleep(hold_s)  # hold the worker so that concurrent warm-ups land on distinct processes
    return os.getpid()


def warm_data_workers(count: int, hold_s: float = 1.0, remote_args: dict | None = None) -> list:
    """Import the operators' modules in ``count`` idle Ray worker processes, without waiting.

    Ray Data runs its tasks in the job's pooled worker processes; the first task
    in a process pays its imports (ray.data, pyarrow, the operators), ~1-3 s
    each on 2 cores. Called before the trainers start, this moves that cold
    start under their own start-up (worker group, model build) instead of in
    front of the first epoch's first block. Zero-CPU tasks: they reserve
    nothing the pipeline or the trainers need. Returns the task refs.
    """
    task = ray.remote(num_cpus=0, **(remote_args or {}))(_import_operators)
    return [task.remote(hold_s) for _ in range(max(0, count))]


def _fused_source(files: list[str] | list[tuple[str, str]], spec: TransformSpec, ingest: IngestConfig,
                  block_rows: int, sessions: bool):
    return (fused.FusedSessionDatasource(files, spec, ingest.batch_size, block_rows) if sessions
            else fused.FusedParquetDatasource(files, spec, ingest.batch_size, block_rows))


def build_fused_dataset(files: list[str] | list[tuple[str, str]], spec: TransformSpec, ingest: IngestConfig,
                        op: OperatorConfig, block_rows: int, *, sessions: bool,
                        block_bytes: int | None = None, remote_args: dict | None = None) -> Dataset:
    """One fused read operator over flat files or (``sessions``) dedup shard pairs.

    ``block_bytes``: the packed size of one planned block; Ray Data then ships
    each block as it is yielded instead of merging a file's blocks into one.
    """
    source = _fused_source(files, spec, ingest, block_rows, sessions)
    # One read task per file or pair (its blocks come out as they are transformed), never split further.
    tasks = max(1, len(source.get_read_tasks(1)))
    ds = ray.data.read_datasource(source, override_num_blocks=tasks, concurrency=min(op.concurrency, tasks),
                                  num_cpus=op.num_cpus, ray_remote_args=remote_args or None)
    if block_bytes:
        # Ray Data yields a block once its buffer exceeds the target, and slices blocks above 1.5x it:
        # 0.75 of a planned block yields every block alone and slices none within +-12% of the measurement.
        ds.context.target_max_block_size = max(1 << 10, int(0.75 * block_bytes))
    return ds


def _plan_fused_blocks(job: JobConfig, sources: list, spec: TransformSpec,
                       sessions: bool) -> tuple[fused.BlockPlan, int | None]:
    """Samples per block (:func:`.fused.plan_blocks`, capped in bytes) and the block's measured packed size."""
    bytes_per_sample = None
    if sources:
        try:
            probe = _fused_source(sources[:1], spec, job.ingest, fused.plan_blocks(job.ingest).rows, sessions)
            bytes_per_sample = fused.probe_bytes_per_sample(probe)
        except Exception as err:  # noqa: BLE001 - a bad first file is the job's to report, not the planner's
            log.debug("could not measure a fused block (%s); Ray Data's default block size applies", err)
    plan = fused.plan_blocks(job.ingest, bytes_per_sample)
    return plan, (int(plan.rows * bytes_per_sample) if bytes_per_sample else None)


def _job_sources(job: JobConfig, train_files: list[str], eval_files: list[str]) -> tuple[list, list]:
    """What the train and eval pipelines read: the dedup shard pairs (``job.dedup_enabled``: the one switch,
    :attr:`~dlrm_platform.config.JobConfig.dedup_enabled`; the trainer's model follows it), else the flat files."""
    if job.dedup_enabled:
        return dedup_convert.dedup_job_shards(job, train_files, eval_files)
    return list(train_files), list(eval_files)


def fused_train_source(job: JobConfig, train_files: list[str], eval_files: list[str], quarantine_dir: Path):
    """The fused train pipeline's datasource, as :func:`build_job_datasets` builds it (planned blocks included).

    Its read tasks are the whole of what each fused Ray task runs; ``benchmarks/ingest.py`` calls them in one
    process for the pipeline's ceiling.
    """
    spec = TransformSpec.from_config(job.data.columns, job.ingest, quarantine_dir)
    train_src, eval_src = _job_sources(job, train_files, eval_files)
    plan, _ = _plan_fused_blocks(job, train_src or eval_src, spec, job.dedup_enabled)
    return _fused_source(train_src, spec, job.ingest, plan.rows, job.dedup_enabled)


def build_job_datasets(job: JobConfig, train_files: list[str], eval_files: list[str],
                       quarantine_dir: Path, *, fused_op: OperatorConfig | None = None) -> PipelineDatasets:
    """Train and eval pipelines for ``job``; rows that cannot be used go to ``quarantine_dir``.

    The one place that picks the path: with deduplication on (``job.dedup_enabled``:
    default for data with a session key) the pipelines read a session-deduplicated
    copy of the data and ship IKJT batches (:mod:`.dedup_operators`); with ``fused_op`` the
    operators run fused as that one operator (:mod:`.fused`), else split.
    """
    spec = TransformSpec.from_config(job.data.columns, job.ingest, quarantine_dir)
    remote_args = data_remote_args(job)  # ray.placement: every task on the data nodes
    sessions = job.dedup_enabled
    train_src, eval_src = _job_sources(job, train_files, eval_files)
    if sessions:
        files = {"train": [f for pair in train_src for f in pair], "eval": [f for pair in eval_src for f in pair]}
    else:
        files = {"train": [str(f) for f in train_src], "eval": [str(f) for f in eval_src]}
    if fused_op is not None:
        plan, block_bytes = _plan_fused_blocks(job, train_src or eval_src, spec, sessions)
        build = partial(build_fused_dataset, spec=spec, ingest=job.ingest, op=fused_op, block_rows=plan.rows,
                        sessions=sessions, block_bytes=block_bytes, remote_args=remote_args)
        return PipelineDatasets(train=starts_at_full_width(build(train_src)),
                                eval=starts_at_full_width(build(eval_src)), quarantine_dir=quarantine_dir,
                                files=files, fused=True, block_rows=plan.rows, block_bytes=block_bytes)
    build = build_dedup_dataset if sessions else build_dataset
    train, eval_ = (starts_at_full_width(build(train_src, spec, job.ingest, remote_args)),
                    starts_at_full_width(build(eval_src, spec, job.ingest, remote_args)))
    return PipelineDatasets(train=train, eval=eval_, quarantine_dir=quarantine_dir, files=files)


def starts_at_full_width(ds: Dataset) -> Dataset:
    """``ds``, whose every execution runs as many tasks as its CPUs allow from the start.

    Ray Data 2.60 starts each execution (every epoch and evaluation pass) with a CPU
    limit of 0 for about a second, one task per operator, until its coordinator's
    first answer (``tuner.ray_hooks.prime_execution_limits``, the one module that
    touches Ray Data's internals).
    """
    from dlrm_platform.tuner.ray_hooks import install_cold_start_limits

    install_cold_start_limits(ds.context)
    return ds
