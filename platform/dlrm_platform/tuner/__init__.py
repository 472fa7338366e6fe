"""The pipeline tuner: per-operator concurrency of a live Ray Data pipeline.

Integration API (what the pipeline builder calls)
-------------------------------------------------

1. When building the operators, size their compute with
   :func:`compute_strategies` so that each tuned operator stays a separate
   physical operator and its task pool can grow to whatever the tuner gives it::

       strategies = tuner.compute_strategies(job.tuner, job.ingest, cpu_budget=budget.data)
       ds = ray.data.read_parquet(..., concurrency=strategies["read"].size, ...)
       ds = ds.map_batches(parse, compute=strategies["parse"], num_cpus=ops.parse.num_cpus, ...)

   (Under ``ray_default``/``static`` the strategies are the config's own numbers.)
   Operators are found by name: ``read`` matches Ray's ``Read*`` operator, any
   other name ``MapBatches(<name>)``, i.e. the UDF's ``__name__`` (or class name)
   must be the operator's key in ``IngestConfig.operators``. ``ActorPoolStrategy``
   operators are supported too (the tuner resizes the pool).

2. After building the dataset and before it executes::

       handle = tuner.attach(job.tuner, job.ingest, ds.context, cpu_budget=budget.data)

   This installs the tuner on the dataset's ``DataContext`` (the callback and
   backpressure policy travel with it to the process that executes it (the job's feed service actor),
   or run in the driver with a plain iterator), starts a small recorder actor,
   and returns a :class:`TunerHandle` (``None`` only when ``tuner_cfg`` is None).
   Call it on the *train* dataset's context only; every epoch re-binds.

3. In the Train loop (optional), report the data-wait fraction the tuner observes::

       reporter = handle.reporter()          # picklable; pass via train_loop_config
       reporter.report(wait_fraction, rank=ctx.get_world_rank())

4. After (or during) the run, in the driver::

       handle.history()        # records: ticks (throughput, allocation, per-op metrics, decisions)
       handle.summary()        # final allocation, mean/steady samples/s, peak memory, decisions
       handle.log_to_mlflow(client, run_id)   # metrics tuner/* + tuner_allocation.png + tuner_history.json
       handle.close()

Layout: ``ray_hooks`` (the one module touching ``ray.data._internal``),
``controller``/``observe``/``actions``/``features`` (observe, mask, act),
``policies``/``plumber``/``rl`` (decisions), ``simulator``/``rl_train``
(offline RL pretraining), ``sleep_pipelines`` (YAML-described benchmark pipelines),
``analysis`` (``dlrm-platform analyze``), ``cli``.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Any

from dlrm_platform.config import OPERATOR_NAMES
from dlrm_platform.tuner.spec import POLICIES, BlockRowsSpec, OpSpec, TunerSpec

if TYPE_CHECKING:
    from dlrm_platform.config import IngestConfig, TunerConfig
    from dlrm_platform.tuner.recorder import TunerHandle

__all__ = [
    "POLICIES",
    "OpSpec",
    "TunerSpec",
    "attach",
    "build_spec",
    "compute_strategies",
    "operator_specs",
]


def operator_specs(ingest_cfg: IngestConfig) -> list[OpSpec]:
    """The tuned operators of the ingest pipeline, in pipeline order, from the config."""
    ops = ingest_cfg.operators
    return [OpSpec(name, getattr(ops, name).num_cpus, initial=getattr(ops, name).concurrency)
            for name in OPERATOR_NAMES]


def _upper_bounds(specs: list[OpSpec], cpu_budget: float) -> dict[str, int]:
    out = {}
    for i, s in enumerate(specs):
        others = sum(o.min_slots * o.num_cpus for o in specs if o.name != s.name)
        n = max(s.min_slots, int(math.floor((cpu_budget - others) / s.num_cpus + 1e-9)))
        # distinct sizes keep adjacent task pools from being fused into one operator
        out[s.name] = n + i
    return out


def compute_strategies(
    tuner_cfg: TunerConfig | None,
    ingest_cfg: IngestConfig | None,
    cpu_budget: float,
    *,
    operators: list[OpSpec] | None = None,
) -> dict[str, Any]:
    """``{operator: TaskPoolStrategy}`` to build the pipeline with.

    With a tuner, every operator gets a task pool sized to the most the tuner
    could ever give it (distinct per operator, so that Ray does not fuse
    neighbours); the tuner then caps the running tasks live (``static`` at the
    config's numbers; under ``ray_default`` Ray's own allocator decides within
    the budget). Without one (``tuner_cfg=None``), the config's own numbers.
    """
    from ray.data import TaskPoolStrategy

    specs = operators if operators is not None else operator_specs(ingest_cfg)
    if tuner_cfg is None:
        sizes = {s.name: s.initial for s in specs}
    else:
        sizes = _upper_bounds(specs, cpu_budget)
    return {s.name: TaskPoolStrategy(size=sizes[s.name]) for s in specs}


def build_spec(
    tuner_cfg: TunerConfig,
    cpu_budget: float,
    operators: list[OpSpec],
    *,
    tuner_id: str | None = None,
    object_store_bytes: float | None = None,
    options: dict | None = None,
    block_rows: BlockRowsSpec | None = None,
) -> TunerSpec:
    limit = None
    if object_store_bytes:
        limit = float(object_store_bytes) * float(tuner_cfg.object_store_limit_fraction)
    return TunerSpec(
        tuner_id=tuner_id or uuid.uuid4().hex[:10],
        policy=tuner_cfg.policy,
        cpu_budget=float(cpu_budget),
        ops=operators,
        interval_s=float(tuner_cfg.interval_s),
        object_store_limit_bytes=limit,
        object_store_limit_fraction=float(tuner_cfg.object_store_limit_fraction),
        policy_path=str(tuner_cfg.policy_path) if tuner_cfg.policy_path else None,
        options=dict(options or {}),
        block_rows=block_rows,
    )


def attach(
    tuner_cfg: TunerConfig | None,
    ingest_cfg: IngestConfig | None,
    data_context,
    cpu_budget: float,
    telemetry_sink: str | None = "actor",
    *,
    operators: list[OpSpec] | None = None,
    tuner_id: str | None = None,
    options: dict | None = None,
    block_rows: BlockRowsSpec | None = None,
) -> TunerHandle | None:
    """Install the tuner on ``data_context`` before the dataset executes.

    ``telemetry_sink="actor"`` (default) starts a recorder actor the handle reads
    from (needs ``ray.init`` done); ``None`` keeps records in the executing
    process only (plain iterators in the driver). ``operators`` overrides the
    operator list derived from ``ingest_cfg`` (benchmarks, other pipelines).
    ``options`` are policy knobs (see ``policies``). ``block_rows``: the pipeline's blocks can be
    resized while it runs (``tuner/block_size.py``; ``rl``, ``auto`` and ``oracle`` steer them). Raises
    ``ray_hooks.RayHooksError`` if this Ray version lacks a hook the tuner needs.
    """
    if tuner_cfg is None:
        return None
    from dlrm_platform.tuner import ray_hooks
    from dlrm_platform.tuner.recorder import NAMESPACE, TunerHandle, recorder_name, start_recorder

    specs = operators if operators is not None else operator_specs(ingest_cfg)
    store = None
    try:
        import ray

        if ray.is_initialized():
            store = ray.cluster_resources().get("object_store_memory")
    except Exception:  # noqa: BLE001
        store = None
    options = dict(options or {})
    if operators is None and ingest_cfg is not None:
        # the ingest pipeline's last operator packs batch_size samples into one row
        options.setdefault("samples_per_sink_row", float(ingest_cfg.batch_size))
    spec = build_spec(tuner_cfg, cpu_budget, specs, tuner_id=tuner_id, object_store_bytes=store, options=options,
                      block_rows=block_rows)
    recorder = None
    if telemetry_sink == "actor":
        recorder = start_recorder(spec.tuner_id)
        spec.recorder_name = recorder_name(spec.tuner_id)
        spec.recorder_namespace = NAMESPACE
    ray_hooks.install(data_context, spec)
    return TunerHandle(spec, recorder)
