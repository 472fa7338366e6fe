"""Live control of a running Ray Data pipeline: plain iterator and Ray Train, two epochs each.

The pipeline's middle operator is 10x as expensive as its neighbours and starts
with as many slots as they do; the plumber policy must move slots to it while
the dataset streams, Ray's own counters (tasks running, actor-pool size) must
show the change, and the allocation must carry into the second epoch (a new
execution). The RL policy (the shipped net, behind its gate and shield) must do
the same live.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration

BUDGET = 8.0


@pytest.fixture(scope="module")
def tuner_cluster():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # many logical CPUs on 2 cores: the operators wait rather than spin (ARCHITECTURE.md)
    ray.init(address="local", num_cpus=12, object_store_memory=400 * 1024**2, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False

    @ray.remote(num_cpus=1)
    def warm():
        time.sleep(1.0)

    ray.get([warm.remote() for _ in range(int(BUDGET))])  # start the workers once
    yield ray
    ray.shutdown()


def _pipeline(actor_middle: bool, heavy_ms: int = 600):
    from dlrm_platform.tuner.sleep_pipelines import PipelineDef

    return PipelineDef.model_validate({
        "name": "unbalanced",
        "rows_per_block": 1000,
        "row_bytes": 64,
        "cluster": {"num_cpus": 12, "data_cpus": BUDGET},
        "operators": [
            {"name": "light_a", "ms_per_1k_rows": 60, "concurrency": 2},
            {"name": "heavy", "ms_per_1k_rows": heavy_ms, "concurrency": 2},
            {"name": "light_c", "ms_per_1k_rows": 60, "concurrency": 2},
        ],
    })


def _build(pipe, policy: str, actor_middle: bool, blocks: int):
    from ray.data import ActorPoolStrategy

    from dlrm_platform import tuner
    from dlrm_platform.config import TunerConfig
    from dlrm_platform.tuner.sleep_pipelines import build_dataset

    cfg = TunerConfig(policy=policy, interval_s=1.0)
    specs = pipe.op_specs()
    strategies = tuner.compute_strategies(cfg, None, BUDGET, operators=specs)
    if actor_middle:
        strategies["heavy"] = ActorPoolStrategy(min_size=1, max_size=8, initial_size=2)
    ds = build_dataset(pipe, blocks, strategies)
    ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(cpu=BUDGET)
    opts = {"plumber_warmup_s": 3.0, "plumber_replan_s": 4.0}
    return ds, cfg, specs, opts


def _ticks(history, epoch=None):
    return [r for r in history if r["type"] == "tick" and (epoch is None or r["epoch"] == epoch)]


def _history_once_ended(handle, epochs: int, timeout_s: float = 60.0) -> list[dict]:
    """The recorder's records once the ends of ``epochs`` epochs have reached it (the controller
    sends them fire-and-forget, so they may trail the end of iteration)."""
    deadline = time.monotonic() + timeout_s
    while True:
        hist = handle.history()
        if sum(r["type"] == "epoch_end" for r in hist) >= epochs:
            return hist
        assert time.monotonic() < deadline, f"{epochs} epoch end(s) never reached the recorder: " \
            f"{[r['type'] for r in hist if r['type'] != 'tick']}"
        time.sleep(0.05)  # poll interval of the condition above, not a guess at how long it takes


def _timeline(hist) -> str:
    """The allocation's story, for a failure message: epoch starts, every decision, the epochs' ends."""
    lines = []
    for r in hist:
        if r["type"] == "tick" and r["decision"]:
            why = (r.get("explanation") or {}).get("text", "")
            lines.append(f"{r['elapsed']:6.1f}s e{r['epoch']} budget {r['budget']:.1f} {r['decision']} -> "
                         f"{r['allocation']} pool {r['per_op']['heavy']['pool_size']}: {why}")
        elif r["type"] in ("epoch_start", "epoch_end"):
            lines.append(f"{r['elapsed']:6.1f}s e{r['epoch']} {r['type']} {r['allocation']}")
    return "\n".join(lines)


def _check_budget(ticks):
    for t in ticks:
        assert sum(t["allocation"].values()) <= BUDGET, t["allocation"]
        assert min(t["allocation"].values()) >= 1


def test_live_control_with_a_plain_iterator_across_two_epochs(tuner_cluster):
    from dlrm_platform import tuner

    pipe = _pipeline(actor_middle=False)
    blocks = 40
    ds, cfg, specs, opts = _build(pipe, "plumber", actor_middle=False, blocks=blocks)
    handle = tuner.attach(cfg, None, ds.context, BUDGET, operators=specs, options=opts, tuner_id="live-iter")
    try:
        rows = []
        for _ in range(2):
            n = 0
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                n += len(batch["id"])
            rows.append(n)
        hist = _history_once_ended(handle, 2)
    finally:
        handle.close()
    assert rows == [blocks * 1000, blocks * 1000]  # nothing lost or duplicated by the control
    starts = [r for r in hist if r["type"] == "epoch_start"]
    assert [s["epoch"] for s in starts] == [1, 2]
    assert starts[0]["tuned"] == ["light_a", "heavy", "light_c"] and not starts[0]["fused"]
    e1, e2 = _ticks(hist, 1), _ticks(hist, 2)
    _check_budget(e1 + e2)
    decided = [t for t in e1 if t["decision"]]
    assert decided, "the policy never changed the allocation"
    # the first moves may take a slot from a light operator before the heavy one gains one
    raised = [t for t in decided if t["allocation"]["heavy"] > 2]
    assert raised, f"the heavy operator never got more slots: {[t['allocation'] for t in decided]}"
    # Ray's own counter of running tasks follows the new cap within the same execution ...
    after = [t for t in e1 if t["t"] > raised[0]["t"] + 2.0]
    assert after and max(t["per_op"]["heavy"]["tasks_now"] for t in after) > 2
    # ... and in the next execution (epoch 2), which starts from the tuned allocation
    assert starts[1]["allocation"]["heavy"] > 2
    assert max(t["per_op"]["heavy"]["tasks_now"] for t in e2) > 2


def test_live_control_under_ray_train_with_an_actor_pool(tuner_cluster, tmp_path):
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from dlrm_platform import tuner

    pipe = _pipeline(actor_middle=True)
    blocks = 36
    ds, cfg, specs, opts = _build(pipe, "plumber", actor_middle=True, blocks=blocks)
    handle = tuner.attach(cfg, None, ds.context, BUDGET, operators=specs, options=opts, tuner_id="live-train")

    def loop(config):
        shard = ray.train.get_dataset_shard("train")
        reporter = config["reporter"]
        for epoch in range(2):
            n, wait, busy = 0, 0.0, 0.0
            t_prev = time.perf_counter()
            for batch in shard.iter_batches(batch_size=None, batch_format="numpy"):
                t_got = time.perf_counter()
                wait += t_got - t_prev
                n += len(batch["id"])
                time.sleep(0.01)  # the "training step"
                t_prev = time.perf_counter()
                busy += t_prev - t_got
                reporter.report(wait / (wait + busy))
            ray.train.report({"epoch": epoch, "rows": n})

    trainer = TorchTrainer(
        loop,
        train_loop_config={"reporter": handle.reporter()},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=str(tmp_path), name="tuner-live"),
        datasets={"train": ds},
    )
    try:
        trainer.fit()
        hist = _history_once_ended(handle, 2)
    finally:
        handle.close()
    starts = [r for r in hist if r["type"] == "epoch_start"]
    assert [s["epoch"] for s in starts] == [1, 2], "the controller must run in the SplitCoordinator each epoch"
    e1, e2 = _ticks(hist, 1), _ticks(hist, 2)
    assert e1 and e2
    _check_budget(e1 + e2)
    assert any(t["decision"] for t in e1)
    # the actor pool really grew: Ray's pool size, not just our intent
    assert max(t["per_op"]["heavy"]["pool_size"] or 0 for t in e1 + e2) > 2, _timeline(hist)
    # epoch 2 (a new execution) starts where epoch 1's tuning left off. Not necessarily with the heavy
    # operator above 2: on a loaded 2-core machine each light task carries a few hundred ms of
    # scheduling, the plumber measures that, and it may hand slots back to the light operators late in
    # epoch 1 (seen in CI); what it decided last is what must carry.
    end1 = next(r for r in hist if r["type"] == "epoch_end" and r["epoch"] == 1)
    assert starts[1]["allocation"] == end1["allocation"], _timeline(hist)
    assert starts[1]["allocation"] != starts[0]["allocation"], "epoch 2 fell back to the configured allocation"
    assert any(t["data_wait"] is not None for t in e1 + e2), "trainers' data-wait fraction never reached the tuner"


def test_rl_policy_live_moves_slots_to_the_heavy_operator(tuner_cluster):
    from dlrm_platform import tuner

    # heavy at 20x its neighbours' work: each light task also carries 0.2-0.5 s of Ray scheduling on
    # a loaded 2-core machine, and at 10x the measured rates made a light operator the bottleneck
    # once heavy had 4-5 slots (then the net is right to move slots back to it)
    pipe = _pipeline(actor_middle=False, heavy_ms=1200)
    blocks = 30
    ds, cfg, specs, opts = _build(pipe, "rl", actor_middle=False, blocks=blocks)
    handle = tuner.attach(cfg, None, ds.context, BUDGET, operators=specs, options=opts, tuner_id="live-rl")
    try:
        n = sum(len(b["id"]) for b in ds.iter_batches(batch_size=None, batch_format="numpy"))
        hist = _history_once_ended(handle, 1)
    finally:
        handle.close()
    assert n == blocks * 1000
    ticks = _ticks(hist, 1)
    _check_budget(ticks)
    states = [t["policy_state"] for t in ticks]
    assert any(s.startswith("rl: +1 heavy") for s in states), states  # the net was asked and moved
    decided = [t for t in ticks if t["decision"]]
    assert decided and max(t["allocation"]["heavy"] for t in decided) > 2, [t["allocation"] for t in decided]
    # The slots stayed: heavy held more than its configured 2 on average from the first decision on.
    # Not necessarily at the last tick: on a loaded 2-core machine each light task carries a few
    # hundred ms of scheduling, and in the drain the light operator below it may measure as the
    # bottleneck and take slots back (seen once in CI: heavy back at 2 by the last tick).
    held = [t["allocation"]["heavy"] for t in ticks if t["t"] >= decided[0]["t"]]
    assert sum(held) / len(held) > 2.5, _timeline(hist)
    after = [t for t in ticks if t["t"] > decided[0]["t"] + 2.0]
    assert after and max(t["per_op"]["heavy"]["tasks_now"] for t in after) > 2  # Ray ran what it was given
