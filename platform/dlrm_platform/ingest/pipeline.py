"""The Ray Data preprocessing pipeline builder.

    read_parquet -> parse -> dense_transform -> sparse_transform -> batch
      (read)        one named map_batches operator each, with its own
                    concurrency and CPUs from ``IngestConfig.operators``

The result streams packed batches (``ingest.batching``) into Ray Train through
``streaming_split``. The CPU budget is explicit: Ray Data gets ``data_cpus``
(by default the cluster's CPUs minus the trainers'), so the pipeline and the
trainers never wait on each other's reservations (DESIGN.md: on 2 CPUs,
trainers asking 1 CPU each otherwise starve Ray Data and the run hangs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import ray
from ray.data import Dataset, ExecutionOptions, ExecutionResources, TaskPoolStrategy

from dlrm_platform.config import IngestConfig, JobConfig, OperatorConfig
from dlrm_platform.errors import UserError
from dlrm_platform.ingest import transforms
from dlrm_platform.ingest.transforms import TransformSpec

log = logging.getLogger(__name__)

# Pipeline order; the names are the operator names Ray Data shows (MapBatches(<name>)).
OPERATOR_NAMES = ("read", "parse", "dense_transform", "sparse_transform", "batch")
_MAP_OPERATORS: tuple[tuple[str, Callable[[pa.Table, TransformSpec], pa.Table]], ...] = (
    ("parse", transforms.parse),
    ("dense_transform", transforms.dense_transform),
    ("sparse_transform", transforms.sparse_transform),
)


@dataclass(frozen=True)
class CpuBudget:
    """How the cluster's CPUs are split between Ray Data and the trainers."""

    total: float
    train: float
    data: float

    def describe(self) -> str:
        return f"{self.total:g} CPUs: {self.train:g} for training, {self.data:g} for data"


def cpu_budget(job: JobConfig, cluster_cpus: float) -> CpuBudget:
    """Split ``cluster_cpus``; raise a UserError naming the fields when they do not fit."""
    train = job.train.num_workers * job.train.cpus_per_worker
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


def execution_options(budget: CpuBudget) -> ExecutionOptions:
    """Ray Data execution options that keep the pipeline inside its CPU budget."""
    return ExecutionOptions(resource_limits=ExecutionResources(cpu=budget.data))


def _map_operator(ds: Dataset, fn: Callable, op: OperatorConfig, spec: TransformSpec,
                  batch_size: int | None = None) -> Dataset:
    return ds.map_batches(
        fn,
        fn_kwargs={"spec": spec},
        batch_format="pyarrow",
        batch_size=batch_size,
        zero_copy_batch=True,
        compute=TaskPoolStrategy(size=op.concurrency),
        num_cpus=op.num_cpus,
    )


def build_dataset(files: list[str], spec: TransformSpec, ingest: IngestConfig) -> Dataset:
    """The full pipeline over ``files``: a Dataset of packed batches, one row per training batch."""
    ops = ingest.operators
    ds = ray.data.read_parquet(
        files,
        columns=spec.columns.columns,
        concurrency=ops.read.concurrency,
        num_cpus=ops.read.num_cpus,
    )
    for name, fn in _MAP_OPERATORS:
        ds = _map_operator(ds, fn, getattr(ops, name), spec)
    return _map_operator(ds, transforms.batch, ops.batch, spec, batch_size=ingest.batch_size)


@dataclass
class PipelineDatasets:
    """The train and held-out datasets of one job, and where parse quarantines rows."""

    train: Dataset
    eval: Dataset
    quarantine_dir: Path

    def as_dict(self) -> dict[str, Dataset]:
        return {"train": self.train, "eval": self.eval}


def build_job_datasets(job: JobConfig, train_files: list[str], eval_files: list[str],
                       quarantine_dir: Path) -> PipelineDatasets:
    """Train and eval pipelines for ``job``; rows that cannot be used go to ``quarantine_dir``.

    With ``ingest.dedup`` on (default for data with a session key) the pipelines read a
    session-deduplicated copy of the data and ship IKJT batches (:mod:`.dedup`).
    """
    if job.dedup_enabled:
        from dlrm_platform.ingest.dedup import build_dedup_job_datasets

        return build_dedup_job_datasets(job, train_files, eval_files, quarantine_dir)
    spec = TransformSpec.from_config(job.data.columns, job.ingest, quarantine_dir)
    return PipelineDatasets(
        train=build_dataset(train_files, spec, job.ingest),
        eval=build_dataset(eval_files, spec, job.ingest),
        quarantine_dir=quarantine_dir,
    )
