"""A job's ingest pipelines as `dlrm-platform run` builds them: for the job, and for `dlrm-platform analyze`.

:func:`plan_job_pipelines` is the one place that decides how a job's pipelines
are laid out for the tuner: fused (``ingest.fusion``: one read operator does
read..batch, the tuner holds its task count) or split (every operator's task
pool sized to the most the tuner could ever give it: distinct sizes also keep
Ray from fusing neighbours; the tuner caps running tasks live, starting from
the config's numbers). Plain or dedup is decided by
:func:`dlrm_platform.ingest.pipeline.build_job_datasets`. `run` installs the
tuner on the result (:func:`build_tuned_datasets`); `analyze` observes the same
pipeline with its operators held at the config's numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from dlrm_platform.config import JobConfig, OperatorConfig, TunerConfig
from dlrm_platform.ingest.fused import fusion_enabled
from dlrm_platform.ingest.pipeline import (
    PipelineDatasets,
    build_job_datasets,
    data_remote_args,
    fused_operator,
    train_read_tasks,
    warm_data_workers,
)
from dlrm_platform.tuner import OpSpec, attach, compute_strategies, operator_specs

__all__ = ["JobPipelinePlan", "build_job_pipelines", "build_tuned_datasets", "plan_job_pipelines", "read_task_counter"]

log = logging.getLogger("dlrm_platform.job")  # the job's messages


@dataclass(frozen=True)
class JobPipelinePlan:
    """How to build a job's pipelines: ``job`` with the task-pool sizes applied (split), or the fused operator."""

    job: JobConfig
    fused_op: OperatorConfig | None
    operators: list[OpSpec]  # the operators the tuner sees, in pipeline order
    cpu_budget: float  # the data CPUs the pools are sized for: the tuner's budget

    @property
    def fused(self) -> bool:
        return self.fused_op is not None


def plan_job_pipelines(job: JobConfig, data_cpus: float, tuner_cfg: TunerConfig | None,
                       sized_for: float | None = None,
                       read_tasks: int | Callable[[], int] | None = None) -> JobPipelinePlan:
    """The layout `run` builds for ``job`` on ``data_cpus``; split pools are sized for ``tuner_cfg``.

    ``sized_for``: an elastic budget's ceiling (:attr:`.pipeline.CpuBudget.sized_for`); task pools hold that
    many CPUs' worth of tasks so that data nodes that join later get work. ``read_tasks``: a train epoch's
    read tasks, which the fused operator's tasks are balanced over (:func:`.pipeline.fused_operator`; a
    callable is counted only where that applies: a fused pipeline on a fixed budget, tasks not configured).
    """
    cpu_budget = data_cpus if sized_for is None else max(data_cpus, sized_for)
    if fusion_enabled(job.ingest, job.tuner, cpu_budget):
        if not fusion_enabled(job.ingest, job.tuner):  # fused only because the budget leaves no choice
            log.info("ingest.fusion auto: fused, although tuner.policy %s steers operators one by one: %g data "
                     "CPU(s) hold one task of each operator and no more, so there is nothing to steer (set "
                     "ingest.fusion: off to split anyway, or give the job more data CPUs)",
                     job.tuner.policy if job.tuner else None, cpu_budget)
        op = fused_operator(job.ingest, data_cpus, cpu_budget, read_tasks)
        return JobPipelinePlan(job, op, [OpSpec("read", op.num_cpus, initial=op.concurrency)], cpu_budget)
    pools = compute_strategies(tuner_cfg, job.ingest, cpu_budget=cpu_budget)
    operators = job.ingest.operators.model_copy(
        update={name: getattr(job.ingest.operators, name).model_copy(update={"concurrency": pool.size})
                for name, pool in pools.items()}
    )
    build_job = job.model_copy(update={"ingest": job.ingest.model_copy(update={"operators": operators})})
    return JobPipelinePlan(build_job, None, operator_specs(job.ingest), cpu_budget)


def build_job_pipelines(plan: JobPipelinePlan, files, quarantine_dir: Path) -> PipelineDatasets:
    """The train and eval pipelines of ``plan`` (``files``: ``ingest.source`` split files)."""
    if plan.fused_op is not None:
        # the read tasks' processes import while the trainers start (on the data nodes, with ray.placement)
        warm_data_workers(plan.fused_op.concurrency + 1, remote_args=data_remote_args(plan.job))
    return build_job_datasets(plan.job, files.train, files.eval, quarantine_dir, fused_op=plan.fused_op)


def read_task_counter(job: JobConfig, files) -> Callable[[], int] | None:
    """A train epoch's read tasks, counted when asked (:func:`plan_job_pipelines`); None without train files."""
    return partial(train_read_tasks, job, files.train, files.eval) if files.train else None


def build_tuned_datasets(job: JobConfig, files, quarantine_dir: Path, data_cpus: float,
                         sized_for: float | None = None):
    """The job's pipelines with the tuner installed on the train pipeline; returns (datasets, tuner handle).

    ``sized_for`` (elastic budgets): the tuner's CPU ceiling; within it, each tick's budget is Ray Data's live
    limit, which follows the data nodes.
    """
    plan = plan_job_pipelines(job, data_cpus, job.tuner, sized_for, read_task_counter(job, files))
    datasets = build_job_pipelines(plan, files, quarantine_dir)
    if plan.fused_op is not None:
        op = plan.fused_op
        handle = attach(job.tuner, job.ingest, datasets.train.context, cpu_budget=plan.cpu_budget,
                        operators=plan.operators, options={"samples_per_sink_row": float(job.ingest.batch_size)})
        log.info("pipeline: %s; %d tasks of %g CPU", datasets.describe(), op.concurrency, op.num_cpus)
        return datasets, handle
    handle = attach(job.tuner, job.ingest, datasets.train.context, cpu_budget=plan.cpu_budget)
    log.info("pipeline: %s; tuner: policy %s (CPU budget %g)", datasets.describe(), job.tuner.policy,
             plan.cpu_budget)
    return datasets, handle
