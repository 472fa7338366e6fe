"""The private-API guard: every Ray Data internal the tuner uses must exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dlrm_platform.tuner import ray_hooks

TUNER_DIR = Path(ray_hooks.__file__).parent


def test_every_required_hook_exists():
    missing = ray_hooks.check_hooks()
    assert not missing, "Ray Data internals the tuner needs are missing (update tuner/ray_hooks.py): " + "; ".join(missing)


def test_verify_names_the_missing_attribute(monkeypatch):
    fake = (*ray_hooks.REQUIRED_HOOKS,
            ("ray.data._internal.execution.resource_manager", "ResourceManager", ("no_such_method_xyz",)),
            ("ray.data._internal.execution.streaming_executor", "StreamingExecutor", ("self._no_such_attr",)),
            ("ray.data._internal.no_such_module", "Thing", ()))
    monkeypatch.setattr(ray_hooks, "REQUIRED_HOOKS", fake)
    with pytest.raises(ray_hooks.RayHooksError) as err:
        ray_hooks.verify_hooks()
    msg = str(err.value)
    assert "ResourceManager.no_such_method_xyz" in msg
    assert "self._no_such_attr" in msg
    assert "ray.data._internal.no_such_module" in msg


def test_only_ray_hooks_touches_ray_data_internals():
    offenders = []
    for path in TUNER_DIR.rglob("*.py"):
        if path.name == "ray_hooks.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith("ray.data._internal") else []
            offenders += [f"{path.name}: {n}" for n in names if "ray.data._internal" in n]
    assert not offenders, offenders


def test_operator_matching():
    physical = ["Input", "ReadRange", "MapBatches(read)", "MapBatches(parse)->MapBatches(hash)", "MapBatches(batch)"]
    got = ray_hooks.match_operators(physical, ["read", "parse", "hash", "batch", "missing"])
    assert got == {"read": 2, "parse": 3, "hash": 3, "batch": 4}
    assert ray_hooks.match_operators(["Input", "ReadParquet", "MapBatches(parse)"], ["read"]) == {"read": 1}


def test_install_and_uninstall_on_a_data_context():
    from ray.data import DataContext

    from dlrm_platform.tuner.spec import OpSpec, TunerSpec

    ctx = DataContext()
    spec = TunerSpec("t1", "plumber", 4.0, [OpSpec("a", 1.0), OpSpec("b", 1.0)])
    ray_hooks.install(ctx, spec)
    assert ray_hooks.TunerCallback in ctx.custom_execution_callback_classes
    assert ctx.op_resource_reservation_enabled is False
    key = "backpressure_policies.enabled"
    assert ray_hooks.TunerBackpressurePolicy in ctx.get_config(key)
    assert ctx.get_config(ray_hooks.SPEC_KEY).policy == "plumber"
    ray_hooks.uninstall(ctx)
    assert ray_hooks.TunerCallback not in ctx.custom_execution_callback_classes
    assert ctx.op_resource_reservation_enabled is True
    # ray_default only observes: Ray's reservation and policies stay as they are
    ctx2 = DataContext()
    ray_hooks.install(ctx2, TunerSpec("t2", "ray_default", 4.0, [OpSpec("a", 1.0)]))
    assert ctx2.op_resource_reservation_enabled is True
    assert ctx2.get_config(key, None) is None


def test_cpu_limit_reads_an_unset_limit_as_unknown():
    class Limits:
        def __init__(self, cpu):
            self.cpu = cpu

    class Executor:
        def __init__(self, cpu):
            self._resource_manager = type("RM", (), {"get_global_limits": lambda _self: Limits(cpu)})()

    binding = ray_hooks._Binding.__new__(ray_hooks._Binding)
    binding.executor = Executor(0.0)  # before the executor's first update
    assert binding.cpu_limit() == float("inf")
    binding.executor = Executor(24.0)
    assert binding.cpu_limit() == 24.0


def test_the_executing_side_re_validates_the_spec_it_reads():
    """The spec crosses to the process that runs the pipeline inside the DataContext; it is re-validated there."""
    import pickle

    from ray.data import DataContext

    from dlrm_platform.config import ConfigError
    from dlrm_platform.tuner.spec import OpSpec, TunerSpec

    ctx = DataContext()
    assert ray_hooks.spec_from_context(ctx) is None
    spec = TunerSpec("t3", "plumber", 4.0, [OpSpec("a", 1.0), OpSpec("b", 1.0)])
    ray_hooks.install(ctx, spec)
    shipped = pickle.loads(pickle.dumps(ctx))  # as Ray ships the context to the feed service actor
    assert ray_hooks.spec_from_context(shipped) == spec
    spec.ops[1].min_slots = 9  # changed after validation: the minimums no longer fit the budget
    with pytest.raises(ConfigError, match="minimum allocation needs 10 CPUs"):
        ray_hooks.spec_from_context(ctx)
    ctx.set_config(ray_hooks.SPEC_KEY, {"tuner_id": "t3", "policy": "plumber"})  # the old dict form
    with pytest.raises(TypeError, match="not a TunerSpec"):
        ray_hooks.spec_from_context(ctx)
    ray_hooks.uninstall(ctx)


def test_the_coordinator_tick_takes_a_recompute_flag():
    # refresh_cluster_view relies on it: without it a joined data node waits for Ray's own 20 s tick.
    import inspect

    actor = ray_hooks._imp(ray_hooks._COORDINATOR, "_AutoscalingCoordinatorActor")
    assert "recompute" in inspect.signature(actor.get_reserved_resources).parameters


def test_node_watch_refreshes_only_when_the_nodes_change():
    nodes = [frozenset({("a", 1.0)})]
    refreshed: list[int] = []
    watch = ray_hooks.NodeWatch(interval_s=3600, nodes=lambda: nodes[0], refresh=lambda: refreshed.append(1))
    try:
        assert not watch.check() and not refreshed
        nodes[0] = frozenset({("a", 1.0), ("b", 1.0)})  # a data node joins
        assert watch.check() and len(refreshed) == 1
        assert not watch.check() and len(refreshed) == 1  # seen: no second refresh
        nodes[0] = frozenset({("b", 1.0)})  # one leaves
        assert watch.check() and watch.refreshes == 2
    finally:
        watch.stop()


def test_a_failed_refresh_is_tried_again_at_the_next_poll():
    nodes = [frozenset({("a", 1.0)})]
    calls: list[int] = []

    def refresh():
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("coordinator busy")

    watch = ray_hooks.NodeWatch(interval_s=3600, nodes=lambda: nodes[0], refresh=refresh)
    try:
        nodes[0] = frozenset({("a", 1.0), ("b", 1.0)})
        with pytest.raises(TimeoutError):
            watch.check()
        assert watch.check() and len(calls) == 2
    finally:
        watch.stop()


def _executor_with_a_cold_client(cached: dict):
    from types import SimpleNamespace

    asked: list[str] = []
    actor = SimpleNamespace(get_reserved_resources=SimpleNamespace(
        remote=lambda requester: asked.append(requester) or ("reply-of", requester)))
    client = SimpleNamespace(_autoscaling_coordinator=actor, _cached_reserved_resources=cached,
                             _requester_id="data-ds_1")
    executor = SimpleNamespace(_cluster_autoscaler=SimpleNamespace(_autoscaling_coordinator=client),
                               _resource_manager=SimpleNamespace(_global_limits_last_update_time=123.0))
    return executor, client, asked


def test_a_new_execution_gets_its_limits_before_its_first_task():
    reply = {"node-1": {"CPU": 4.0, "object_store_memory": 1e9}}
    executor, client, asked = _executor_with_a_cold_client({})
    got = []
    assert ray_hooks.prime_execution_limits(executor, get=lambda ref, timeout: got.append(ref) or reply)
    assert asked == ["data-ds_1"] and got == [("reply-of", "data-ds_1")]  # asked for its own reservation
    assert client._cached_reserved_resources == reply
    assert executor._resource_manager._global_limits_last_update_time == 0  # recomputed at the next step
    # an execution whose client already has an answer is left alone
    executor, client, asked = _executor_with_a_cold_client({"node-1": {"CPU": 2.0}})
    assert not ray_hooks.prime_execution_limits(executor, get=lambda ref, timeout: pytest.fail("asked again"))
    assert asked == [] and executor._resource_manager._global_limits_last_update_time == 123.0


def test_cold_start_limits_go_first_and_once_and_never_fail_an_execution():
    from types import SimpleNamespace

    from ray.data import DataContext

    ctx = DataContext.get_current().copy()
    ray_hooks.install_cold_start_limits(ctx)
    ray_hooks.install_cold_start_limits(ctx)
    assert ctx.custom_execution_callback_classes.count(ray_hooks.ColdStartLimits) == 1
    assert ctx.custom_execution_callback_classes[0] is ray_hooks.ColdStartLimits
    # a placement-group autoscaler has no coordinator client; a broken one must not raise either
    ray_hooks.ColdStartLimits().before_execution_starts(SimpleNamespace(_cluster_autoscaler=SimpleNamespace()))
    ray_hooks.ColdStartLimits().before_execution_starts(SimpleNamespace())


def test_a_coordinator_still_starting_is_not_waited_for():
    import ray

    executor, client, _ = _executor_with_a_cold_client({})
    client._pending_reserved_resources = None

    def slow(ref, timeout):
        raise ray.exceptions.GetTimeoutError("still starting")

    assert not ray_hooks.prime_execution_limits(executor, get=slow)
    assert client._cached_reserved_resources == {}
    assert client._pending_reserved_resources == ("reply-of", "data-ds_1")  # Ray Data takes the answer when it comes
    assert executor._resource_manager._global_limits_last_update_time == 123.0


def test_slots_held_under_output_backpressure_are_not_counted_as_working(monkeypatch):
    """An operator whose outputs the executor does not read holds its slots without working:
    that time goes to throttled_seconds, not to the slot-seconds its rate per slot divides by."""
    class Op:
        def __init__(self):
            self._in_task_output_backpressure = False

        def num_active_tasks(self):
            return 4

    op = Op()
    binding = ray_hooks._Binding.__new__(ray_hooks._Binding)
    binding.by_name, binding.fused = {"read": op}, {}
    binding.slot_seconds, binding.throttled_seconds = {"read": 0.0}, {"read": 0.0}
    clock = iter([10.0, 11.0, 13.0])
    monkeypatch.setattr(ray_hooks.time, "monotonic", lambda: next(clock))
    binding.last_sample = next(clock)
    binding.sample()  # 1 s working
    op._in_task_output_backpressure = True
    binding.sample()  # 2 s waiting for its outputs to be read
    assert binding.slot_seconds["read"] == pytest.approx(4.0)
    assert binding.throttled_seconds["read"] == pytest.approx(8.0)


def test_a_different_pipeline_reusing_a_tuner_id_is_warned_about(caplog):
    from dlrm_platform.tuner.spec import OpSpec, TunerSpec

    def spec(parse: int) -> TunerSpec:
        ops = [OpSpec("read", 1.0, initial=2), OpSpec("parse", 1.0, initial=parse)]
        return TunerSpec("reused-id-test", "static", 8.0, ops)

    try:
        first = ray_hooks.controller_for(spec(3))
        with caplog.at_level("WARNING", logger=ray_hooks.__name__):
            assert ray_hooks.controller_for(spec(3)) is first  # the next epoch: same pipeline, kept
            assert not caplog.records
            assert ray_hooks.controller_for(spec(5)) is first
        assert "reused-id-test" in caplog.text and "its own tuner id" in caplog.text
    finally:
        ray_hooks._CONTROLLERS.pop("reused-id-test", None)
