"""``dlrm-platform analyze``: run a pipeline briefly, print the Plumber-style report.

CONFIG is either a job config (the platform's ingest pipeline over the job's
training data) or a benchmark pipeline file (``benchmarks/pipelines/*.yaml``,
recognised by its top-level ``operators`` list). The pipeline runs for
``seconds`` after its first output at the config's own allocation with the tuner observing
(``static`` policy), then the measured per-operator rates go through the LP.

The same pass is the *profiling pass* that calibrates the RL simulator
(:func:`profile_dict`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from dlrm_platform.errors import UserError
from dlrm_platform.tuner.observe import Observation
from dlrm_platform.tuner.plumber import PlumberReport, analyse
from dlrm_platform.tuner.spec import OpSpec

log = logging.getLogger(__name__)


@dataclass
class ProfileRun:
    report: PlumberReport
    observation: Observation
    specs: list[OpSpec]
    budget: float
    source: str
    fused: dict
    missing: list
    block_rows: float = 1000.0
    row_bytes: float = 500.0

    def profile_dict(self) -> dict:
        """Per-operator costs for ``simulator.from_profile``."""
        obs = self.observation
        ops = []
        for o, s in zip(obs.ops, [s for s in self.specs if s.name in obs.names]):
            ops.append({
                "name": o.name,
                "num_cpus": s.num_cpus,
                "element_ratio": o.element_ratio,
                "rate_per_slot": o.rate_per_slot or 0.0,
            })
        known = [op["rate_per_slot"] for op in ops if op["rate_per_slot"] > 0]
        fill = sorted(known)[len(known) // 2] if known else 1000.0
        for op in ops:
            if op["rate_per_slot"] <= 0:
                op["rate_per_slot"] = fill
        return {"source": self.source, "cpu_budget": self.budget, "block_rows": self.block_rows,
                "row_bytes": self.row_bytes, "ops": ops}


def is_pipeline_file(path: str | Path) -> bool:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and isinstance(raw.get("operators"), list)


def _run_and_observe(ds, specs: list[OpSpec], budget: float, seconds: float, warmup_s: float,
                     tuner_cfg=None) -> tuple[Observation, dict, list]:
    from dlrm_platform import tuner as tuner_api
    from dlrm_platform.config import TunerConfig
    from dlrm_platform.tuner import ray_hooks

    cfg = tuner_cfg or TunerConfig(policy="static", interval_s=1.0)
    window = max(seconds - warmup_s, 2.0)
    handle = tuner_api.attach(cfg, None, ds.context, budget, telemetry_sink=None, operators=specs,
                              options={"window_s": window, "settle_s": 0.0})
    # The clock starts at the first delivered batch: the tuner takes no rate before the sink's first
    # output (start-up workers), so on a slow machine a clock started at submission could leave
    # the last window with nothing measured (CI: first output after 5 of 12 s, no bottleneck).
    first_t: float | None = None
    for _batch in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
        now = time.time()
        if first_t is None:
            first_t = now
        if now - first_t >= seconds:
            break
    ctl = ray_hooks.local_controller(handle.tuner_id)
    if ctl is None or ctl.last_obs is None:
        raise UserError(f"the pipeline produced no measurement in {seconds:g} s; run longer (--seconds)")
    if not any(o.rate_per_slot for o in ctl.last_obs.ops):
        raise UserError(f"no operator finished enough work to be measured in {seconds:g} s after the"
                        " pipeline's first output; run longer (--seconds)")
    records = ctl.pop_records()
    starts = [r for r in records if r["type"] == "epoch_start"]
    fused = starts[-1]["fused"] if starts else {}
    missing = starts[-1]["missing"] if starts else []
    ray_hooks.uninstall(ds.context)
    return ctl.last_obs, fused, missing


def warm_workers(n: int, seconds: float = 1.0) -> None:
    """Start ``n`` worker processes before measuring, so start-up is not measured as work."""
    import ray

    @ray.remote(num_cpus=1)
    def _nap() -> None:
        time.sleep(seconds)

    avail = int(ray.cluster_resources().get("CPU", 1))
    ray.get([_nap.remote() for _ in range(max(1, min(n, avail)))])


def run_pipeline_file(path: str | Path, seconds: float, warmup_s: float = 5.0) -> ProfileRun:
    import ray

    from dlrm_platform import tuner as tuner_api
    from dlrm_platform.config import TunerConfig
    from dlrm_platform.tuner.sleep_pipelines import build_dataset, load_pipeline, stop_storage

    pipe = load_pipeline(path)
    specs = pipe.op_specs()
    budget = float(pipe.cluster.data_cpus)
    started_here = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=pipe.cluster.num_cpus, object_store_memory=pipe.cluster.object_store_mb * 1024**2,
                 include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
        warm_workers(int(budget))
        strategies = tuner_api.compute_strategies(TunerConfig(policy="static"), None, budget, operators=specs)
        rate_guess = 20_000.0
        blocks = int(max(50, seconds * rate_guess / pipe.rows_per_block))
        ds = build_dataset(pipe, blocks, strategies)
        ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(cpu=budget)
        obs, fused, missing = _run_and_observe(ds, specs, budget, seconds, warmup_s)
    finally:
        stop_storage()
        if started_here:
            ray.shutdown()
    report = analyse(obs, [s for s in specs if s.name in obs.names], budget)
    return ProfileRun(report, obs, specs, budget, str(path), fused, missing,
                      block_rows=pipe.rows_per_block, row_bytes=pipe.row_bytes)


def run_job_config(path: str | Path, seconds: float, warmup_s: float = 8.0) -> ProfileRun:
    """Profile the train pipeline `dlrm-platform run` builds for the job config at ``path``.

    The same pipeline (:mod:`.job_pipelines`: plain or dedup, fused or split), with
    the operators held at the config's own numbers instead of a live tuner.
    """
    import ray

    from dlrm_platform.config import TunerConfig, load_job_config
    from dlrm_platform.ingest.pipeline import cluster_cpu_budget
    from dlrm_platform.ingest.source import validate_dataset
    from dlrm_platform.ray_cluster import ray_session
    from dlrm_platform.tuner.job_pipelines import build_job_pipelines, plan_job_pipelines, read_task_counter

    job = load_job_config(path)
    files = validate_dataset(job.data)
    with ray_session(job.ray):
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
        budget = cluster_cpu_budget(job).data
        # laid out as `run` lays it out (the fused operator's one wave of read tasks included)
        plan = plan_job_pipelines(job, budget, TunerConfig(policy="static"), read_tasks=read_task_counter(job, files))
        specs = plan.operators
        qdir = Path(job.tracking.runs_dir).resolve() / "quarantine" / "analyze"
        ds = build_job_pipelines(plan, files, qdir).train
        ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(cpu=budget)
        obs, fused, missing = _run_and_observe(ds, specs, budget, seconds, warmup_s)
    report = analyse(obs, [s for s in specs if s.name in obs.names], budget)
    return ProfileRun(report, obs, specs, budget, str(path), fused, missing)


def run_analysis(path: str | Path, seconds: float = 20.0) -> ProfileRun:
    if not Path(path).exists():
        raise UserError(f"{path}: no such file")
    if is_pipeline_file(path):
        return run_pipeline_file(path, seconds)
    return run_job_config(path, seconds)
