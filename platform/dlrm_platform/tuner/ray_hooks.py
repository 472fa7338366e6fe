"""The only module of the platform that touches Ray Data internals.

Ray 2.60 has no public API for changing an operator's concurrency while a
dataset streams, so the tuner uses these private hooks (ARCHITECTURE.md, "Private Ray Data hooks"):

* ``ExecutionCallback`` (registered through the public
  ``DataContext.custom_execution_callback_classes``): ``before_execution_starts``
  binds the controller to a new execution (every epoch under
  ``streaming_split`` is one), ``on_execution_step`` samples counters every
  scheduling step and, once per ``interval_s``, observes and acts;
* a ``BackpressurePolicy`` (``DataContext`` config key
  ``backpressure_policies.enabled``): caps the running tasks of task-pool
  operators at the tuner's allocation and stops the operators holding the most
  object-store memory while the pipeline is at its memory limit;
* ``AutoscalingActorPool.scale(ActorPoolScalingRequest(...))`` for actor pools,
  with Ray's own actor autoscaler replaced by a no-op while the tuner controls
  (otherwise it scales the pools back);
* per-operator ``OpRuntimeMetrics``, the executor's topology (input queues) and
  resource manager (object-store usage, CPU limits).

While a tuning policy controls, Ray's per-operator reservation
(``op_resource_reservation_enabled``) is switched off: its budgets override a
raised allocation (ARCHITECTURE.md, "Private Ray Data hooks"). The tuner's masks then keep the allocation
inside the CPU budget and its memory guard keeps object-store use under the
limit. ``ray_default`` leaves all of Ray's mechanisms alone and only observes.

:data:`REQUIRED_HOOKS` names every private module, class, method and attribute
used here; :func:`verify_hooks` checks them all and raises
:class:`RayHooksError` naming each one that moved, so a Ray upgrade fails
loudly at ``attach`` (and in ``tests/tuner/test_ray_hooks.py``) instead of
silently not tuning.

Besides the tuner's hooks it holds the two fixes to Ray Data's view of the
cluster (``NodeWatch``, ``ColdStartLimits``): every private name in one module
is the rule, so this file is longer than the others (~650 lines) rather than split.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import math
import re
import threading
import time
from typing import Any

from dlrm_platform.config import revalidate
from dlrm_platform.tuner.controller import Controller
from dlrm_platform.tuner.observe import RawOp, RawSnapshot
from dlrm_platform.tuner.spec import TunerSpec

log = logging.getLogger(__name__)

SPEC_KEY = "dlrm_platform.tuner.spec"

_COORDINATOR = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"

# (module, attribute, [members that must exist on it]); members starting with
# "self." are instance attributes checked in the class's source.
REQUIRED_HOOKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ray.data._internal.execution.execution_callback", "ExecutionCallback",
     ("before_execution_starts", "on_execution_step", "after_execution_succeeds", "after_execution_fails")),
    ("ray.data._internal.execution.backpressure_policy", "BackpressurePolicy", ("can_add_input",)),
    ("ray.data._internal.execution.backpressure_policy", "ENABLED_BACKPRESSURE_POLICIES", ()),
    ("ray.data._internal.execution.backpressure_policy", "ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY", ()),
    ("ray.data._internal.actor_autoscaler", "ActorPoolScalingRequest", ("delta", "force", "reason")),
    ("ray.data._internal.actor_autoscaler", "AutoscalingActorPool",
     ("scale", "current_size", "num_running_actors", "num_pending_actors", "get_pool_util")),
    ("ray.data._internal.execution.operators.task_pool_map_operator", "TaskPoolMapOperator",
     ("get_max_concurrency_limit", "num_active_tasks")),
    ("ray.data._internal.execution.operators.actor_pool_map_operator", "ActorPoolMapOperator",
     ("get_autoscaling_actor_pools",)),
    ("ray.data._internal.execution.interfaces.physical_operator", "PhysicalOperator",
     ("name", "metrics", "num_active_tasks", "has_completed", "get_autoscaling_actor_pools",
      "self._in_task_output_backpressure")),
    ("ray.data._internal.execution.interfaces.op_runtime_metrics", "OpRuntimeMetrics",
     ("num_task_inputs_processed", "num_row_inputs_received", "num_inputs_received",
      "rows_outputs_of_finished_tasks", "rows_task_outputs_generated", "row_outputs_taken", "num_outputs_taken",
      "num_tasks_running",
      "task_submission_backpressure_time", "obj_store_mem_internal_inqueue", "obj_store_mem_spilled",
      "block_generation_time")),
    ("ray.data._internal.execution.streaming_executor_state", "OpState", ("total_enqueued_input_blocks",)),
    ("ray.data._internal.execution.resource_manager", "ResourceManager",
     ("get_global_usage", "get_global_limits", "get_mem_op_outputs")),
    ("ray.data._internal.execution.streaming_executor", "StreamingExecutor",
     ("self._topology", "self._resource_manager", "self._backpressure_policies", "self._actor_autoscaler",
      "self._data_context", "self._callbacks")),
    ("ray.data.context", "DataContext",
     ("custom_execution_callback_classes", "op_resource_reservation_enabled", "set_config", "get_config")),
    (_COORDINATOR, "get_or_create_autoscaling_coordinator", ()),
    (_COORDINATOR, "_AutoscalingCoordinatorActor", ("get_reserved_resources", "TICK_INTERVAL_S")),
    # ColdStartLimits: the executor's cluster autoscaler, its coordinator client's cache, the limits' clock
    ("ray.data._internal.execution.streaming_executor", "StreamingExecutor", ("self._cluster_autoscaler",)),
    ("ray.data._internal.cluster_autoscaler.rate_based_cluster_autoscaler", "RateBasedClusterAutoscaler",
     ("self._autoscaling_coordinator",)),
    ("ray.data._internal.cluster_autoscaler.default_cluster_autoscaler_v2", "DefaultClusterAutoscalerV2",
     ("self._autoscaling_coordinator",)),
    (_COORDINATOR, "DefaultAutoscalingCoordinator",
     ("_autoscaling_coordinator", "self._cached_reserved_resources", "self._pending_reserved_resources",
      "self._requester_id")),
    ("ray.data._internal.execution.resource_manager", "ResourceManager", ("self._global_limits_last_update_time",)),
)


class RayHooksError(RuntimeError):
    """A Ray Data internal the tuner relies on is missing (a Ray upgrade moved it)."""


def check_hooks() -> list[str]:
    """Names of the required hooks that are missing; empty when all are present."""
    missing: list[str] = []
    for module_name, attr, members in REQUIRED_HOOKS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            missing.append(f"{module_name} (module: {err})")
            continue
        obj = getattr(module, attr, None)
        if obj is None:
            missing.append(f"{module_name}.{attr}")
            continue
        source = None
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        for m in members:
            if m.startswith("self."):
                if source is None:
                    try:
                        source = inspect.getsource(obj)
                    except (OSError, TypeError):
                        source = ""
                if not re.search(re.escape(m) + r"\b", source):
                    missing.append(f"{module_name}.{attr}: instance attribute {m}")
            elif not (hasattr(obj, m) or m in fields or m in getattr(obj, "__annotations__", {})):
                missing.append(f"{module_name}.{attr}.{m}")
    return missing


def verify_hooks() -> None:
    missing = check_hooks()
    if missing:
        raise RayHooksError(
            "the pipeline tuner needs Ray Data internals that this Ray version lacks: "
            + "; ".join(missing)
            + ". Update dlrm_platform/tuner/ray_hooks.py for this Ray version (it was written for 2.60)."
        )


def _imp(module_name: str, attr: str) -> Any:
    return getattr(importlib.import_module(module_name), attr)


ExecutionCallback = _imp("ray.data._internal.execution.execution_callback", "ExecutionCallback")
BackpressurePolicy = _imp("ray.data._internal.execution.backpressure_policy", "BackpressurePolicy")


# --------------------------------------------------------------------------- operator matching


def _tokens(op_name: str) -> list[str]:
    """Logical names inside a physical operator name, e.g.
    'MapBatches(parse)->MapBatches(dense_transform)' -> ['parse', 'dense_transform']."""
    toks = re.findall(r"\(([^()]+)\)", op_name)
    return toks or [op_name]


def match_operators(physical_names: list[str], wanted: list[str]) -> dict[str, int]:
    """Map each wanted operator name to the index of the physical operator that runs it.

    A name matches ``MapBatches(name)`` (also inside a fused chain), or, for
    ``read``, a ``Read*`` operator. Names not found are left out.
    """
    out: dict[str, int] = {}
    for name in wanted:
        for i, pn in enumerate(physical_names):  # exact names first: MapBatches(read) beats ReadRange
            parts = [p.strip() for p in pn.split("->")]
            if name in _tokens(pn) or any(p == name for p in parts):
                out[name] = i
                break
        if name == "read" and name not in out:
            for i, pn in enumerate(physical_names):
                if any(p.strip().startswith("Read") for p in pn.split("->")):
                    out[name] = i
                    break
    return out


# --------------------------------------------------------------------------- backpressure policy


class TunerBackpressurePolicy(BackpressurePolicy):
    """Caps task-pool operators at the tuner's allocation; guards object-store memory."""

    @property
    def name(self) -> str:
        return "DlrmTuner"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.caps: dict[Any, int] = {}
        self.mem_limit = math.inf
        self.enabled = False
        self.mem_blocks = 0

    def can_add_input(self, op) -> bool:
        if not self.enabled:
            return True
        cap = self.caps.get(op)
        if cap is not None and op.num_active_tasks() >= cap:
            return False
        if math.isfinite(self.mem_limit):
            rm = self._resource_manager
            used = rm.get_global_usage().object_store_memory
            if used >= self.mem_limit:
                held = rm.get_mem_op_outputs(op)
                if held >= used / max(len(self._topology), 1):
                    self.mem_blocks += 1
                    return False
        return True


class _NoActorAutoscaling:
    """Stands in for Ray's actor autoscaler while the tuner sizes the pools."""

    def try_trigger_scaling(self) -> None:
        return None


# --------------------------------------------------------------------------- controllers per process

_LOCK = threading.Lock()
_CONTROLLERS: dict[str, Controller] = {}


def controller_for(spec: TunerSpec) -> Controller:
    """The process-wide controller of ``spec.tuner_id`` (kept across epochs)."""
    with _LOCK:
        ctl = _CONTROLLERS.get(spec.tuner_id)
        if ctl is None:
            ctl = Controller(spec)
            _CONTROLLERS[spec.tuner_id] = ctl
        elif _steered_differently(ctl.spec, spec):
            # the controller keeps its first spec: a different pipeline under the same id is steered as the
            # first one was (the tuner benchmark's fresh runs once all ran the first run's allocation)
            log.warning("tuner %s: a pipeline with different operators, budget or policy reuses this tuner id;"
                        " it is steered by the controller made for the first one. Give each pipeline its own"
                        " tuner id.", spec.tuner_id)
        return ctl


def _steered_differently(old: TunerSpec, new: TunerSpec) -> bool:
    return (old.policy, old.cpu_budget, old.ops, old.block_rows) != (new.policy, new.cpu_budget, new.ops, new.block_rows)


def local_controller(tuner_id: str) -> Controller | None:
    return _CONTROLLERS.get(tuner_id)


# --------------------------------------------------------------------------- the callback


class _Binding:
    """One execution's view: physical operators of the tuned names and their counters."""

    def __init__(self, executor, spec: TunerSpec):
        self.executor = executor
        topo = executor._topology
        self.ops_all = list(topo.keys())
        idx = match_operators([op.name for op in self.ops_all], spec.names)
        self.by_name = {n: self.ops_all[i] for n, i in idx.items()}
        seen: dict[int, str] = {}
        self.fused: dict[str, str] = {}
        for n in spec.names:
            if n in self.by_name:
                key = id(self.by_name[n])
                if key in seen:
                    self.fused[n] = seen[key]
                else:
                    seen[key] = n
        self.missing = [n for n in spec.names if n not in self.by_name]
        self.sink = self.ops_all[-1]
        self.policy = next((p for p in executor._backpressure_policies if isinstance(p, TunerBackpressurePolicy)),
                           None)
        self.slot_seconds = {n: 0.0 for n in spec.names}  # occupied by a task that can progress
        self.throttled_seconds = {n: 0.0 for n in spec.names}  # occupied under output backpressure
        self.last_sample = time.monotonic()

    def controlled(self) -> dict[str, Any]:
        return {n: op for n, op in self.by_name.items() if n not in self.fused}

    def sample(self) -> None:
        now = time.monotonic()
        dt = now - self.last_sample
        self.last_sample = now
        for n, op in self.controlled().items():
            # A task whose outputs the executor does not read (output backpressure: its consumers are
            # behind) holds its slot without working. Counted, that wait made an operator that outruns
            # its consumers look like the slowest one (live: read at 16 slots measured 1,300 samples/s
            # with 8,000-row blocks while it fed 7,000), and the policies grew it further.
            try:
                held = op.num_active_tasks() * dt
            except Exception:  # noqa: BLE001 - a finished operator may refuse
                continue
            if getattr(op, "_in_task_output_backpressure", False):
                self.throttled_seconds[n] += held
            else:
                self.slot_seconds[n] += held

    def snapshot(self, mem_limit: float, data_wait: float | None) -> RawSnapshot:
        topo = self.executor._topology
        ops: dict[str, RawOp] = {}
        for n, op in self.controlled().items():
            m = op.metrics
            pools = op.get_autoscaling_actor_pools()
            state = topo.get(op)
            ops[n] = RawOp(
                # input rows of finished tasks: their input blocks x mean rows per received block
                rows_in=float(m.num_task_inputs_processed or 0)
                * float(m.num_row_inputs_received or 0) / max(float(m.num_inputs_received or 0), 1.0),
                rows_out_done=float(m.rows_outputs_of_finished_tasks or 0),
                rows_out=float(m.rows_task_outputs_generated or 0),
                slot_seconds=self.slot_seconds[n],
                throttled_seconds=self.throttled_seconds[n],
                busy_seconds=float(m.block_generation_time or 0.0),
                bp_seconds=float(m.task_submission_backpressure_time or 0.0),
                spilled_bytes=float(m.obj_store_mem_spilled or 0),
                running=float(op.num_active_tasks()),
                queue_blocks=float(state.total_enqueued_input_blocks()) if state is not None else 0.0,
                queue_bytes=float(m.obj_store_mem_internal_inqueue or 0),
                pool_util=(float(pools[0].get_pool_util()) if pools else None),
                pool_size=(int(pools[0].current_size()) if pools else None),
                completed=bool(op.has_completed()),
            )
        rm = self.executor._resource_manager
        return RawSnapshot(
            t=time.monotonic(),
            ops=ops,
            sink_rows=float(self.sink.metrics.row_outputs_taken or 0),
            sink_blocks=float(self.sink.metrics.num_outputs_taken or 0),
            mem_used=float(rm.get_global_usage().object_store_memory or 0),
            mem_limit=mem_limit,
            data_wait=data_wait,
        )

    def cpu_limit(self) -> float:
        """Ray Data's CPU limit for this execution; inf while it is not known. Its first
        limits, before the executor's first update, read 0 CPUs: taken at face value they
        would squeeze every operator to its minimum (and leave an oracle no allocation)."""
        try:
            cpu = float(self.executor._resource_manager.get_global_limits().cpu)
        except Exception:  # noqa: BLE001
            return math.inf
        return cpu if cpu > 0 else math.inf

    def apply(self, alloc: dict[str, int]) -> dict[str, Any]:
        """Make the running pipeline follow ``alloc``; returns what was done per operator."""
        ScalingRequest = _imp("ray.data._internal.actor_autoscaler", "ActorPoolScalingRequest")
        done: dict[str, Any] = {}
        for n, op in self.controlled().items():
            target = int(alloc[n])
            pools = op.get_autoscaling_actor_pools()
            if pools:
                pool = pools[0]
                if op.has_completed():
                    continue
                delta = target - pool.current_size()
                if delta != 0:
                    got = pool.scale(ScalingRequest(delta=delta, force=True, reason="dlrm tuner"))
                    done[n] = {"actors": pool.current_size(), "requested_delta": delta, "applied": got}
            elif self.policy is not None:
                self.policy.caps[op] = target
                done[n] = {"cap": target}
        return done


class TunerCallback(ExecutionCallback):
    """Runs the tuner inside whichever process executes the dataset."""

    MAX_ERRORS = 5

    def __init__(self):
        self._b: _Binding | None = None
        self._ctl: Controller | None = None
        self._spec: TunerSpec | None = None
        self._last_tick = 0.0
        self._errors = 0
        self._recorder = None
        self._wait_ref = None
        self._data_wait: float | None = None

    # -- lifecycle
    def before_execution_starts(self, executor) -> None:
        try:
            spec = spec_from_context(executor._data_context)
            if spec is None:
                return
            binding = _Binding(executor, spec)
            if not binding.by_name:
                log.info("tuner %s: no tuned operator in this execution (%s); not tuning it",
                         spec.tuner_id, [op.name for op in binding.ops_all])
                return
            ctl = controller_for(spec)
            if not ctl.bind(id(executor)):
                log.info("tuner %s already drives another live execution; observing none here", spec.tuner_id)
                return
            self._spec, self._ctl, self._b = spec, ctl, binding
            if binding.missing or binding.fused:
                log.warning("tuner %s: operators not found %s, fused into another %s; those are not tuned"
                            " separately", spec.tuner_id, binding.missing, binding.fused)
            if spec.controls:
                executor._actor_autoscaler = _NoActorAutoscaling()
                if binding.policy is not None:
                    binding.policy.enabled = True
                    binding.policy.mem_limit = spec.object_store_limit_bytes or math.inf
                else:
                    log.warning("tuner %s: its backpressure policy is not installed; task pools keep Ray's caps",
                                spec.tuner_id)
            ctl.start_epoch(tuned=list(binding.controlled()), fused=binding.fused, missing=binding.missing)
            if spec.controls:
                binding.apply(ctl.allocation)
            self._connect_recorder()
            self._emit(ctl.pop_records())
        except Exception as err:  # noqa: BLE001 - never break the pipeline
            log.exception("tuner failed to start; the pipeline runs untuned: %s", err)
            self._ctl = None

    def on_execution_step(self, executor) -> None:
        if self._ctl is None or self._b is None:
            return
        try:
            self._b.sample()
            now = time.monotonic()
            if now - self._last_tick < self._spec.interval_s:
                return
            self._last_tick = now
            self._poll_data_wait()
            snap = self._b.snapshot(self._spec.object_store_limit_bytes or math.inf, self._data_wait)
            budget = min(self._spec.cpu_budget, self._b.cpu_limit())
            new = self._ctl.tick(snap, budget)
            if new is not None and self._spec.controls:
                applied = self._b.apply(new)
                self._ctl.note_applied(applied)
            if self._b.policy is not None:
                self._ctl.note_memory_blocks(self._b.policy.mem_blocks)
            self._emit(self._ctl.pop_records())
        except Exception as err:  # noqa: BLE001
            self._errors += 1
            log.warning("tuner step failed (%d/%d): %s", self._errors, self.MAX_ERRORS, err, exc_info=True)
            if self._errors >= self.MAX_ERRORS:
                log.error("tuner disabled for this execution after %d errors; allocation held", self._errors)
                self._ctl = None

    def after_execution_succeeds(self, executor) -> None:
        self._finish("succeeded")

    def after_execution_fails(self, executor, error) -> None:
        self._finish(f"failed: {type(error).__name__}")

    def _finish(self, how: str) -> None:
        if self._ctl is None:
            return
        try:
            self._observe_at_end()
            self._ctl.end_epoch(how)
            self._emit(self._ctl.pop_records())
        finally:
            self._ctl.unbind()
            self._ctl = None
            self._b = None

    def _observe_at_end(self) -> None:
        """A pass shorter than two ``interval_s`` was never observed by a tick; its end is."""
        try:
            self._b.sample()
            snap = self._b.snapshot(self._spec.object_store_limit_bytes or math.inf, self._data_wait)
            self._ctl.observe_at_end(snap, min(self._spec.cpu_budget, self._b.cpu_limit()))
        except Exception as err:  # noqa: BLE001 - the record of an ended pass must not fail it
            log.warning("tuner: the pass's last observation failed: %s", err, exc_info=True)

    # -- telemetry
    def _connect_recorder(self) -> None:
        if self._spec.recorder_name is None:
            return
        try:
            import ray

            self._recorder = ray.get_actor(self._spec.recorder_name, namespace=self._spec.recorder_namespace)
        except Exception as err:  # noqa: BLE001
            log.info("tuner recorder %s not reachable: %s", self._spec.recorder_name, err)
            self._recorder = None

    def _emit(self, records: list[dict]) -> None:
        if records and self._recorder is not None:
            try:
                self._recorder.record.remote(records)
            except Exception as err:  # noqa: BLE001
                log.debug("tuner recorder unreachable: %s", err)

    def _poll_data_wait(self) -> None:
        if self._recorder is None:
            return
        import ray

        if self._wait_ref is not None:
            ready, _ = ray.wait([self._wait_ref], timeout=0)
            if not ready:
                return
            try:
                self._data_wait = ray.get(self._wait_ref)
            except Exception:  # noqa: BLE001
                self._data_wait = None
        self._wait_ref = self._recorder.data_wait.remote()


# --------------------------------------------------------------------------- install


def spec_from_context(data_context) -> TunerSpec | None:
    """The :class:`TunerSpec` :func:`install` put on ``data_context``, re-validated (it crossed a Ray boundary).

    None when no tuner is installed; ``config.ConfigError`` naming the field when the spec does not
    validate, TypeError when the key holds something else than a spec.
    """
    spec = data_context.get_config(SPEC_KEY, None)
    if spec is None:
        return None
    if not isinstance(spec, TunerSpec):
        raise TypeError(f"DataContext config {SPEC_KEY!r} holds a {type(spec).__name__}, not a TunerSpec")
    return revalidate(spec)


def install(data_context, spec: TunerSpec) -> None:
    """Register the tuner on ``data_context`` (before the dataset executes)."""
    verify_hooks()
    data_context.set_config(SPEC_KEY, spec)
    if TunerCallback not in data_context.custom_execution_callback_classes:
        data_context.custom_execution_callback_classes.append(TunerCallback)
    if spec.controls:
        data_context.op_resource_reservation_enabled = False
        key = _imp("ray.data._internal.execution.backpressure_policy", "ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY")
        default = _imp("ray.data._internal.execution.backpressure_policy", "ENABLED_BACKPRESSURE_POLICIES")
        policies = list(data_context.get_config(key, default))
        if TunerBackpressurePolicy not in policies:
            policies.append(TunerBackpressurePolicy)
        data_context.set_config(key, policies)


def uninstall(data_context) -> None:
    """Undo :func:`install` (tests, or a job that turns tuning off)."""
    if data_context.get_config(SPEC_KEY, None) is not None:
        data_context.remove_config(SPEC_KEY)
    if TunerCallback in data_context.custom_execution_callback_classes:
        data_context.custom_execution_callback_classes.remove(TunerCallback)
    key = _imp("ray.data._internal.execution.backpressure_policy", "ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY")
    policies = data_context.get_config(key, None)
    if policies and TunerBackpressurePolicy in policies:
        data_context.set_config(key, [p for p in policies if p is not TunerBackpressurePolicy])
    data_context.op_resource_reservation_enabled = True


def task_pool_strategy(size: int):
    """A task-pool compute strategy of ``size`` (public API, here for symmetry)."""
    from ray.data import TaskPoolStrategy

    return TaskPoolStrategy(size=size)


# --------------------------------------------------------------------------- cluster view


def prime_execution_limits(executor, timeout_s: float = 0.5, get: Any = None) -> bool:
    """Give a new execution its resources before its first task; True when it had none yet.

    Ray Data 2.60 takes an execution's CPUs from a client-side cache of its
    autoscaling coordinator's reply, empty until the first reply arrives, and its
    resource manager recomputes the limits from that only once a second
    (``GLOBAL_LIMITS_UPDATE_INTERVAL_S``). So every execution (each epoch, each
    evaluation pass) started with a CPU limit of 0 and ran one task per operator
    for about a second. One synchronous call fills the cache (the coordinator
    answers in order, after the executor's registration) and lets the limits be
    recomputed at the first scheduling step. A coordinator that does not answer
    within ``timeout_s`` (its actor still starting, in a cluster's first
    execution) is not waited for: its answer is left for Ray Data to pick up,
    as without this. ``get``: ``ray.get`` (tests pass a fake).
    """
    import ray

    get = get or ray.get
    client = getattr(executor._cluster_autoscaler, "_autoscaling_coordinator", None)
    if client is None or not hasattr(client, "_cached_reserved_resources") or client._cached_reserved_resources:
        return False  # a placement-group autoscaler (no coordinator), or already answered
    ref = client._autoscaling_coordinator.get_reserved_resources.remote(client._requester_id)
    try:
        reserved = get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        client._pending_reserved_resources = ref
        return False
    client._cached_reserved_resources = reserved
    executor._resource_manager._global_limits_last_update_time = 0
    return bool(reserved)


class ColdStartLimits(ExecutionCallback):
    """:func:`prime_execution_limits` before each execution of a dataset whose context has it (:func:`install_cold_start_limits`)."""

    def before_execution_starts(self, executor) -> None:
        try:
            prime_execution_limits(executor)
        except Exception as err:  # noqa: BLE001 - without it the execution only starts slower
            log.debug("could not prime the execution's resource limits: %s", err)


def install_cold_start_limits(data_context) -> None:
    """Register :class:`ColdStartLimits` on ``data_context`` (first, so the tuner's binding sees the limits)."""
    verify_hooks()
    if ColdStartLimits not in data_context.custom_execution_callback_classes:
        data_context.custom_execution_callback_classes.insert(0, ColdStartLimits)


def refresh_cluster_view(timeout_s: float = 10.0) -> None:
    """Make Ray Data's autoscaling coordinator re-read the cluster's nodes now.

    Ray Data 2.60 caps every execution's resources at what its cluster-wide
    coordinator actor has reserved for it, and that actor re-reads ``ray.nodes()``
    only every ``TICK_INTERVAL_S`` (20 s). A data node that joins a running job
    therefore got no task for up to 20 s; with passes of a few seconds, often never.
    ``get_reserved_resources(recompute=True)`` runs one tick at once.
    """
    import ray

    coordinator = _imp(_COORDINATOR, "get_or_create_autoscaling_coordinator")()
    ray.get(coordinator.get_reserved_resources.remote("dlrm-platform-node-watch", recompute=True), timeout=timeout_s)


def _alive_nodes() -> frozenset[tuple[str, float]]:
    import ray

    return frozenset((n["NodeID"], float(n["Resources"].get("CPU", 0.0))) for n in ray.nodes() if n.get("Alive"))


class NodeWatch:
    """A daemon thread that calls :func:`refresh_cluster_view` whenever a node joins or leaves.

    One per process (:func:`keep_cluster_view_fresh`): the process that runs the
    pipeline's executions (the feed service) so that added data nodes get work
    within ``interval_s`` plus Ray Data's one-second limit refresh, without a restart.
    """

    def __init__(self, interval_s: float = 1.0, nodes: Any = _alive_nodes, refresh: Any = refresh_cluster_view) -> None:
        self.interval_s = interval_s
        self.refreshes = 0
        self._nodes, self._refresh = nodes, refresh
        self._seen = nodes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-data-node-watch", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Refresh when the nodes changed since the last check; True when it did."""
        now = self._nodes()
        if now == self._seen:
            return False
        log.info("cluster changed: %d node(s), %g CPUs; Ray Data re-reads it now", len(now), sum(c for _, c in now))
        self._refresh()
        self._seen = now
        self.refreshes += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - a failed poll must not end the watch; Ray's own tick still runs
                log.debug("node watch: %s", err)

    def stop(self) -> None:
        self._stop.set()


_node_watch: NodeWatch | None = None
_node_watch_lock = threading.Lock()


def keep_cluster_view_fresh(interval_s: float = 1.0) -> NodeWatch:
    """Start this process's :class:`NodeWatch` (once; later calls return it).

    Also starts Ray Data's coordinator actor now, if it is not running yet: the
    first execution would otherwise start it and run at one task per operator
    until it answers (:func:`prime_execution_limits`).
    """
    global _node_watch
    with _node_watch_lock:
        if _node_watch is None:
            _imp(_COORDINATOR, "get_or_create_autoscaling_coordinator")()
            _node_watch = NodeWatch(interval_s)
        return _node_watch
