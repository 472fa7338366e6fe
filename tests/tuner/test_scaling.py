"""The RL policy's memory of how each operator scaled (``tuner/scaling.py``), and what it buys on a
pipeline whose operator slows down past a peak (the linear model's blind spot)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from pydantic import ValidationError

from dlrm_platform.tuner.features import FeatureState
from dlrm_platform.tuner.rl import RLPolicyRunner
from dlrm_platform.tuner.scaling import AllocationThroughput, ScalingMemory
from dlrm_platform.tuner.simulator import SimOp, SimPipeline, from_profile, run_controller_in_sim
from dlrm_platform.tuner.sleep_pipelines import PipelineDef, _ContendedService
from dlrm_platform.tuner.spec import OpSpec, TunerSpec


def _measure(mem: ScalingMemory, name: str, slots: int, cap: float, times: int = 3) -> None:
    for _ in range(times):
        mem.record({name: slots}, {name: cap})


def test_limit_is_where_more_slots_were_measured_not_to_pay():
    mem = ScalingMemory(["a", "b"])
    _measure(mem, "a", 4, 4000.0)
    _measure(mem, "a", 8, 4100.0)  # twice the slots, +2.5%: saturated
    _measure(mem, "b", 4, 4000.0)
    _measure(mem, "b", 8, 7600.0)  # nearly linear
    assert mem.limit("a") == 4
    assert mem.limit("b") is None
    _measure(mem, "b", 16, 7000.0)  # the next step up, 8 -> 16, did not pay: 8 it is, though 16 > 4
    assert mem.limit("b") == 8


def test_better_and_probe_fewer_find_the_peak_of_a_retrograde_operator():
    mem = ScalingMemory(["a"])
    _measure(mem, "a", 12, 3000.0)
    assert mem.better("a", 12, 0.1) is None and mem.probe_fewer("a", 12) is None  # no evidence either way
    _measure(mem, "a", 6, 5000.0, times=1)  # where it ran before the move
    assert mem.better("a", 12, 0.1) == 6  # fewer slots measured 67% more
    mem2 = ScalingMemory(["a"])
    _measure(mem2, "a", 17, 3500.0)
    _measure(mem2, "a", 10, 5000.0)
    assert mem2.probe_fewer("a", 10) == 7  # more slots measured less, nothing measured in 7..9: try 7
    _measure(mem2, "a", 7, 5600.0)
    assert mem2.probe_fewer("a", 7) == 5
    assert mem2.better("a", 10, 0.1) == 7


def test_the_operator_running_now_needs_several_measurements_before_it_is_compared():
    mem = ScalingMemory(["a"])
    _measure(mem, "a", 4, 5000.0, times=1)
    _measure(mem, "a", 8, 3000.0, times=1)  # one window right after a move reads low
    assert mem.better("a", 8, 0.1) is None
    _measure(mem, "a", 8, 3000.0, times=2)
    assert mem.better("a", 8, 0.1) == 4


def test_a_cost_shift_forgets_the_operators_curve():
    mem = ScalingMemory(["a"])
    _measure(mem, "a", 4, 4000.0)
    _measure(mem, "a", 8, 4100.0)
    assert mem.limit("a") == 4
    mem.record({"a": 8}, {"a": 2000.0})  # its cost doubled: what it measured before is stale
    assert mem.limit("a") is None and list(mem.curves["a"]) == [8]


def test_with_shift_rescales_a_shift_keeps_the_counts_above_rescaled_and_forgets_those_below():
    """A noisy operator's stray window reads as a cost shift; forgetting the whole curve erased "more
    slots did not pay" (live, the contended lookup then grew past its peak again). Rescaled, the counts
    above still say so; the counts below are forgotten (a lucky figure there draws moves back), and so is
    any count measured since the shifted one (maybe across the shift)."""
    mem = ScalingMemory(["a"], shift_rescales=True)
    _measure(mem, "a", 3, 4000.0)
    _measure(mem, "a", 7, 5800.0)  # past the peak
    _measure(mem, "a", 5, 6000.0)
    assert mem.limit("a") == 5
    mem.record({"a": 5}, {"a": 9000.0})  # +50% at 5 slots: a stray window, or its cost fell by a third
    assert mem.settled("a") == pytest.approx({5: 9000.0, 7: 8700.0})
    assert mem.limit("a") == 5  # the evidence above stands, in the new units
    assert mem.noise["a"] > 0  # the deviation counted as noise, not dropped
    _measure(mem, "a", 7, 8500.0)  # measured since: maybe across a shift, neither scale fits it
    mem.record({"a": 5}, {"a": 5000.0})
    assert mem.settled("a") == {5: 5000.0}
    forgetful = ScalingMemory(["a"])
    _measure(forgetful, "a", 5, 6000.0)
    _measure(forgetful, "a", 7, 5800.0)
    forgetful.record({"a": 5}, {"a": 9000.0})
    assert forgetful.limit("a") is None and list(forgetful.curves["a"]) == [5]


def test_a_step_that_looks_unpaid_is_judged_on_more_measurements_before_growing_again():
    mem = ScalingMemory(["a"])
    _measure(mem, "a", 6, 6300.0)
    mem.record({"a": 7}, {"a": 6400.0})  # +1.6% for +17% slots: under a quarter of the linear gain
    assert not mem.step_looks_paid("a", 7) and not mem.measured_often("a", 7)
    mem.record({"a": 8}, {"a": 8000.0})
    assert mem.step_looks_paid("a", 8)  # +25% over 7
    assert mem.step_looks_paid("a", 6)  # nothing below: nothing to judge
    runner = RLPolicyRunner.load()
    fs = FeatureState(["a"])
    fs.scaling = mem
    assert not runner._measured_enough(fs, "a", 7) and runner._measured_enough(fs, "a", 8)
    _measure(mem, "a", 7, 6000.0, times=2)  # now measured often: limit() judges the step (it did not pay)
    assert runner._measured_enough(fs, "a", 7) and mem.limit("a") == 6


def test_noise_is_how_far_steady_measurements_stray_and_a_shift_resets_it():
    mem = ScalingMemory(["a"], noise_k=3.0)
    for cap in (5000.0, 5500.0, 4500.0, 5500.0, 4500.0, 5500.0):
        mem.record({"a": 4}, {"a": cap})
    assert 0.05 < mem.noise["a"] < 0.15, mem.noise
    calm = mem.noise["a"]
    mem.record({"a": 4}, {"a": 6400.0})  # one stray window (+27%, under the shift tolerance) moves it a bounded step
    assert mem.noise["a"] <= 0.8 * calm + 0.2 * (2 * calm + 0.02) + 1e-9
    mem.record({"a": 4}, {"a": 2000.0})  # its cost changed: the curve and the deviations on the way are stale
    assert "a" not in mem.noise and list(mem.curves["a"]) == [4]


def test_with_noise_k_the_count_running_now_is_compared_only_as_measured_now():
    """Live (per_task_overhead, run 14): a move back to 4 slots, then at once a probe to 3, on the
    figure 4 slots had measured on an earlier visit."""
    mem = ScalingMemory(["a", "b"], noise_k=3.0)
    _measure(mem, "a", 4, 9000.0)
    _measure(mem, "a", 5, 7800.0)
    mem.record({"a": 4, "b": 2}, {"b": 1000.0})  # back at 4, not steady yet: only b measured
    assert mem.better("a", 4, 0.1) is None and mem.probe_fewer("a", 4, margin=0.1) is None
    legacy = ScalingMemory(["a", "b"])  # noise_k 0: any visit's figure
    _measure(legacy, "a", 4, 9000.0)
    _measure(legacy, "a", 5, 7800.0)
    legacy.record({"a": 4, "b": 2}, {"b": 1000.0})
    assert legacy.probe_fewer("a", 4) == 3
    mem.record({"a": 4}, {"a": 9000.0})  # measured steady at 4 now: 5 measured 13% less, no noise seen
    assert mem.probe_fewer("a", 4, margin=0.1) == 3


def test_with_noise_k_a_difference_within_the_operators_noise_does_not_count():
    mem = ScalingMemory(["a"], noise_k=3.0)
    for cap in (7000.0, 8500.0, 7000.0, 8500.0, 7800.0):  # +-10% between windows at 5 slots
        mem.record({"a": 5}, {"a": cap})
    for cap in (8400.0, 9500.0, 8800.0, 8600.0):
        mem.record({"a": 4}, {"a": cap})  # 4 slots: ~13% more, within 3x the noise
    assert mem.margin("a", 0.1) > 0.2
    mem.record({"a": 5}, {"a": 7800.0})
    assert mem.measured_now("a", 5) and mem.better("a", 5, 0.1) is None
    mem.noise_k = 0.0  # the margin alone: 13% more at 4 slots counts
    assert mem.better("a", 5, 0.1) == 4
    quiet = ScalingMemory(["a"], noise_k=3.0)  # the same figures measured without noise do count
    _measure(quiet, "a", 4, 8800.0)
    _measure(quiet, "a", 5, 7700.0)
    assert quiet.better("a", 5, 0.1) == 4


def test_points_expire():
    mem = ScalingMemory(["a"], horizon=5)
    _measure(mem, "a", 4, 4000.0)
    for _ in range(6):
        mem.record({"a": 8}, {"a": 4100.0})
    assert 4 not in mem.curves["a"]


def test_with_horizon_above_the_counts_above_the_current_one_are_kept_longer():
    mem = ScalingMemory(["a"], horizon=5, horizon_above=20)
    _measure(mem, "a", 4, 4000.0)
    _measure(mem, "a", 8, 4100.0)  # more did not pay ...
    for _ in range(10):
        mem.record({"a": 4}, {"a": 4000.0})  # ... and it runs at 4 again
    assert 8 in mem.curves["a"] and mem.limit("a") == 4  # the evidence above outlives `horizon`
    for _ in range(11):
        mem.record({"a": 4}, {"a": 4000.0})
    assert 8 not in mem.curves["a"] and mem.limit("a") is None
    plain = ScalingMemory(["a"], horizon=5)
    _measure(plain, "a", 4, 4000.0)
    _measure(plain, "a", 8, 4100.0)
    for _ in range(10):
        plain.record({"a": 4}, {"a": 4000.0})
    assert plain.limit("a") is None  # gone after `horizon` steps


def test_with_above_min_readings_one_reading_above_holds_a_limit_for_horizon_only():
    """Live (dlrm_preprocessing, run 52): the sparse hash read ~3,300 at 4 slots while workers still
    started, then ~5,200 at 3 for the rest of the run; kept ``horizon_above`` steps, that one reading held the
    limit "3" for all of it. A point above measured fewer than ``above_min_readings`` times, and the limit
    resting on it, last ``horizon`` steps; one measured that often is kept as long as before."""

    def run(times_above: int, steps: int, **kw) -> ScalingMemory:
        mem = _hysteresis_memory(horizon=5, horizon_above=50, **kw)
        _measure(mem, "a", 4, 3300.0, times=times_above)
        _measure(mem, "a", 3, 5200.0, times=3)
        for _ in range(steps):
            mem.record({"a": 3}, {"a": 5200.0})
            mem.limit("a")  # asked every tick, as rl does: a held limit forms
        return mem

    assert run(1, 10).limit("a") == 3  # as before: the once-read point above is kept `horizon_above` steps
    assert run(1, 0, above_min_readings=3).limit("a") == 3  # within `horizon`, it holds
    once = run(1, 10, above_min_readings=3)
    assert once.limit("a") is None and 4 not in once.curves["a"]
    assert run(3, 10, above_min_readings=3).limit("a") == 3  # measured as often as asked: kept as before


def test_with_delivered_margin_a_step_the_pipeline_delivered_more_for_is_no_limit():
    """An operator's counters can read a step up as unpaid while the pipeline delivered clearly more
    there (simulated wide_skewed, warming up: sparse_hash's counter 3,173 at 3 slots, 2,239 at 4, while
    the pipeline delivered 3,000 and 4,000)."""
    def measured(mem: ScalingMemory) -> ScalingMemory:
        for _ in range(3):
            mem.record({"a": 3}, {"a": 3173.0}, delivered=3000.0)
        for _ in range(3):
            mem.record({"a": 4}, {"a": 2239.0}, delivered=4000.0)
        return mem

    assert measured(ScalingMemory(["a"])).limit("a") == 3  # the counters alone: did not pay
    assert measured(ScalingMemory(["a"], delivered_margin=0.15)).limit("a") is None
    flat = ScalingMemory(["a"], delivered_margin=0.15)  # delivered no more: the counters stand
    for _ in range(3):
        flat.record({"a": 3}, {"a": 3173.0}, delivered=3000.0)
    for _ in range(3):
        flat.record({"a": 4}, {"a": 2239.0}, delivered=3100.0)
    assert flat.limit("a") == 3
    assert set(flat.delivered("a")) == {3, 4}
    flat.forget_above("a", 3)  # a point's delivered figure goes with it
    assert set(flat.delivered("a")) == {3} and flat.limit("a") is None


def test_the_simulated_contended_operator_runs_fewer_tasks_when_starved():
    op = SimOp("lookup", 2500.0, contention=0.04)
    full = op.n_eff(16) * op.mu
    assert op.tasks_running(16, full) == pytest.approx(16.0)
    starved = op.tasks_running(16, 0.5 * full)
    assert starved < 2.0  # a few tasks, each at the low contention of a few
    assert op.n_eff(starved) * op.mu == pytest.approx(0.5 * full, rel=1e-6)
    linear = SimOp("hash", 1000.0)
    assert linear.tasks_running(8, 4000.0) == pytest.approx(4.0)


def _contended_pipeline() -> SimPipeline:
    # a 2-CPU-budget-rich pipeline whose middle operator peaks at 5 slots (USL kappa 0.04)
    return SimPipeline([SimOp("read", 10_000.0), SimOp("lookup", 2500.0, contention=0.04), SimOp("pack", 20_000.0)],
                       budget=24.0, noise=0.06, lumpy=True)


def test_usl_capacity_peaks_and_falls():
    op = _contended_pipeline().ops[1]
    effective = [op.n_eff(n) for n in range(1, 13)]
    assert int(np.argmax(effective)) + 1 == 5 and effective[-1] < 0.75 * max(effective)


@pytest.mark.parametrize("seed", [0, 1])
def test_rl_finds_the_peak_the_linear_model_overshoots(seed):
    pipe = _contended_pipeline()
    _, optimum = pipe.optimum()
    shipped = RLPolicyRunner.load()
    linear = RLPolicyRunner(shipped.net, shipped.meta)
    linear.scaling_margin = None
    share = {}
    for label, runner in (("memory", RLPolicyRunner(shipped.net, shipped.meta)), ("linear", linear)):
        key = runner.register(f"<test-scaling-{label}-{seed}>")
        spec = TunerSpec(f"scaling-{label}-{seed}", "rl", pipe.budget, pipe.specs({"read": 1, "lookup": 3, "pack": 1}),
                         policy_path=key)
        trace = run_controller_in_sim(_contended_pipeline(), spec, steps=80, seed=seed)
        share[label] = float(np.mean([x["throughput"] for x in trace[-20:]])) / optimum
    assert share["linear"] < 0.8, share  # the linear model keeps adding slots past the peak
    assert share["memory"] >= 0.9, share


def test_contention_is_a_pipeline_field_the_simulator_reads():
    pipe = PipelineDef.model_validate({"name": "p", "operators": [
        {"name": "read", "ms_per_1k_rows": 100},
        {"name": "lookup", "ms_per_1k_rows": 400, "contention": 0.04}]})
    sim = from_profile(pipe.ground_truth())
    assert sim.ops[1].contention == 0.04 and sim.ops[0].contention == 0.0
    with pytest.raises(ValidationError, match="storage_channels and contention"):
        PipelineDef.model_validate({"name": "p", "operators": [
            {"name": "read", "ms_per_1k_rows": 100, "storage_channels": 4, "contention": 0.1}]})


def test_the_live_contended_service_slows_concurrent_callers_down():
    svc = _ContendedService(kappa=0.5)
    start = time.perf_counter()
    svc.io(0.05)
    alone = time.perf_counter() - start
    threads = [threading.Thread(target=svc.io, args=(0.05,)) for _ in range(4)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together = time.perf_counter() - start
    # 4 callers: each progresses at 1 / (1 + 0.5 * 4 * 3) = 1/7 of the rate alone
    assert together > 3 * alone, (alone, together)
    assert svc.active == 0


def _obs(caps: dict[str, float], alloc: dict[str, int]):
    from dlrm_platform.tuner.observe import Observation, OpObs

    thr = min(caps.values())
    ops = [OpObs(n, alloc[n], 1.0, thr, caps[n] / alloc[n], 1.0, alloc[n] * 0.9, 0.9, 0.0, 2.0, 1e6,
                 capacity=caps[n], measured=True) for n in alloc]
    return Observation(10.0, 3.0, ops, thr, 1e7, 1e9, 0.0, 16.0, extra={"sink_factors": [1.0] * len(ops)})


def test_rl_moves_back_where_fewer_slots_measured_faster_and_says_why():
    from dlrm_platform.tuner.features import FeatureState
    from dlrm_platform.tuner.spec import OpSpec

    specs = [OpSpec("read", 1.0), OpSpec("lookup", 1.0), OpSpec("pack", 1.0)]
    fs = FeatureState([s.name for s in specs])
    _measure(fs.scaling, "lookup", 5, 7000.0, times=1)  # where it ran before the last move
    alloc = {"read": 2, "lookup": 10, "pack": 2}
    caps = {"read": 20_000.0, "lookup": 4000.0, "pack": 30_000.0}
    runner = RLPolicyRunner.load()
    new, why = None, ""
    for _ in range(3):  # the operator's current count is compared once measured 3 times
        new, why = runner.act(_obs(caps, alloc), alloc, specs, 16.0, fs)
        if new is not None:
            break
    assert new == {"read": 2, "lookup": 5, "pack": 2}, why
    assert why.startswith("-5 lookup: to 5 slots, measured +75% there"), why
    # and it does not grow the lookup past 5 again: more was measured not to pay
    assert fs.scaling.limit("lookup") == 5


def test_rl_asks_a_move_for_more_gain_where_the_bottleneck_measures_noisily():
    from dlrm_platform.tuner.features import FeatureState

    runner = RLPolicyRunner.load()
    obs = _obs({"read": 20_000.0, "lookup": 4000.0, "pack": 30_000.0}, {"read": 2, "lookup": 4, "pack": 2})
    fs = FeatureState(["read", "lookup", "pack"])
    assert runner.required_gain(obs, fs) == runner.shield_min_gain  # no noise measured yet
    fs.scaling.noise["lookup"] = 0.1
    assert runner.required_gain(obs, fs) == pytest.approx(runner.shield_noise_k * 0.1)
    fs.scaling.noise["read"] = 0.5  # not the bottleneck's
    fs.scaling.noise["lookup"] = 0.9
    assert runner.required_gain(obs, fs) == runner.shield_max_gain


#: rl's move-size options as they were before run 48 turned them on (tuner/README.md)
BEFORE_RUN_48 = {"rl_noisy_max_repeat": None, "rl_delivered_max_age": None, "rl_slope_sized_growth": False,
                 "rl_sized_shield": False, "rl_above_min_readings": None,
                 "rl_taken_back_s": None,  # run 66's: also holds a noisy operator where a move was taken back
                 "rl_min_hold_s": 1.0,  # run 68's two windows between moves: less wandering to size away
                 "rl_held_idle_donor_busy": None, "rl_shift_confirm": False}  # run 80's


def _rl_share_with_noisy_counters(pipeline: str, op_noise: float, seeds: int, block_rows: float | None = None,
                                  options: dict | None = None) -> float:
    """rl's mean share of the optimum (last 40 of 100 s) on a suite pipeline in the simulator whose
    operator counters are ``op_noise`` noisy, over ``seeds`` seeds (``options``: rl's policy options). Rates
    per slot from those counters (``share_window_s`` 0 unless given): the rules under test are for operators
    whose workers' time per row is not told; from it the rates are steady (``test_rates_from_the_workers_time_take_the_noise_of_lumpy_counters_away``)."""
    from pathlib import Path

    from dlrm_platform.tuner.sleep_pipelines import load_pipeline

    pipe = load_pipeline(Path(__file__).parents[2] / "benchmarks" / "pipelines" / f"{pipeline}.yaml")
    shares = []
    for seed in range(seeds):
        sim = from_profile(pipe.ground_truth())
        sim.op_noise = op_noise
        if block_rows is not None:
            sim.block_rows = block_rows
        _, optimum = sim.optimum()
        trace = run_controller_in_sim(sim, TunerSpec(f"noisy-{seed}", "rl", sim.budget, pipe.op_specs(),
                                                     options={"share_window_s": 0, **(options or {})}),
                                      steps=100, seed=seed)
        shares.append(float(np.mean([x["throughput"] for x in trace[-40:]])) / optimum)
    return float(np.mean(shares))


def test_rl_holds_the_optimum_of_a_pipeline_whose_operator_counters_are_noisy(monkeypatch):
    """per_task_overhead at 8,000-row blocks (~2 s tasks): few completions per window make each
    operator's measured capacity noisy. Acting on that noise, rl left the optimum for allocations the
    noise predicted better (and probed its bottleneck below it); sized by the measured noise it holds."""
    as_shipped = _rl_share_with_noisy_counters("per_task_overhead", 0.4, 6, block_rows=8000.0)
    # the rule beside the move-size rules it was made with (rl's defaults before run 48, which take part of
    # the unsized policy's wandering away too: 0.913 unsized with them)
    sized = _rl_share_with_noisy_counters("per_task_overhead", 0.4, 6, block_rows=8000.0, options=BEFORE_RUN_48)
    monkeypatch.setattr(RLPolicyRunner, "scaling_noise_k", 0.0)
    monkeypatch.setattr(RLPolicyRunner, "shield_noise_k", 0.0)
    unsized = _rl_share_with_noisy_counters("per_task_overhead", 0.4, 6, block_rows=8000.0, options=BEFORE_RUN_48)
    assert sized >= 0.92 and as_shipped >= 0.92, (sized, unsized, as_shipped)
    assert sized > unsized + 0.03, (sized, unsized)


def test_rates_from_the_workers_time_take_the_noise_of_lumpy_counters_away():
    """The same noisy per_task_overhead and contended_lookup, rates per slot from the workers' time per row
    (``share_window_s``, on by default): at least as close to the optimum as from the noisy counters."""
    for pipeline, block_rows in (("per_task_overhead", 8000.0), ("contended_lookup", None)):
        counters = _rl_share_with_noisy_counters(pipeline, 0.4, 4, block_rows=block_rows)
        workers = _rl_share_with_noisy_counters(pipeline, 0.4, 4, block_rows=block_rows,
                                                options={"share_window_s": 20.0})
        assert workers >= counters - 0.01 and workers >= 0.9, (pipeline, workers, counters)


def test_rl_keeps_the_contended_lookup_near_its_peak_where_operator_counters_are_noisy(monkeypatch):
    """contended_lookup with operator counters noisy (sigma 0.4 per second): stray windows read as cost
    shifts forgot the lookup's curve, and steps up were grown again before measured; rl crept the lookup
    past its peak (to 11-17 slots). With the curve rescaled and unpaid-looking steps measured often, it
    stays near the peak. Rates are taken from the first rows on (``measure_after_delivery_s`` 0), as when
    these rules were made: rl's 6 s warm-up alone takes the start's misreadings away (forgetting: 0.921,
    these rules: 0.933; tuner/README.md, run 20)."""
    monkeypatch.setattr(RLPolicyRunner, "measure_after_delivery_s", 0.0)
    kept = _rl_share_with_noisy_counters("contended_lookup", 0.4, 8)
    monkeypatch.setattr(RLPolicyRunner, "shift_rescales", False)
    monkeypatch.setattr(RLPolicyRunner, "grow_measured_often", False)
    forgot = _rl_share_with_noisy_counters("contended_lookup", 0.4, 8)
    assert kept >= 0.88, (kept, forgot)
    assert kept > forgot + 0.05, (kept, forgot)


def test_rl_keeps_unpaid_steps_in_mind_only_where_the_pipeline_did_not_deliver_more(monkeypatch):
    """wide_skewed with operator counters noisy (sigma 0.2): with the evidence above an operator's slots
    kept 90 steps, a warm-up window that read a step up as unpaid (while the pipeline delivered a third
    more there) held rl at its starting allocation in one seed of four (0.35 of the optimum); cross-checked
    against the delivered samples/s it is no limit. Rates from the first rows on, as then: with rl's 6 s
    warm-up no such window is read (the counters alone: 0.986; tuner/README.md, run 20), nor kept with the
    climb after it forgotten (``scaling_after_warmup_s``, off here: the counters alone 0.959), nor with two
    windows between moves (``rl_min_hold_s`` 2, run 68: the counters alone 0.986; 1 here, as then)."""
    monkeypatch.setattr(RLPolicyRunner, "measure_after_delivery_s", 0.0)
    monkeypatch.setattr(RLPolicyRunner, "scaling_after_warmup_s", 0.0)
    one_window = {"rl_min_hold_s": 1.0}
    checked = _rl_share_with_noisy_counters("wide_skewed", 0.2, 4, options=one_window)
    monkeypatch.setattr(RLPolicyRunner, "scaling_delivered_margin", None)
    counters_only = _rl_share_with_noisy_counters("wide_skewed", 0.2, 4, options=one_window)
    assert checked >= 0.95, (checked, counters_only)
    assert checked > counters_only + 0.05, (checked, counters_only)


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_keeps_plumbers_lp_within_the_slots_measured_to_pay(seed):
    """`plumber` (the baseline, linear) pours slots into the contended lookup; `auto` runs the same LP
    capped where more slots were measured not to pay."""
    pipe = _contended_pipeline()
    _, optimum = pipe.optimum()
    share = {}
    for policy in ("plumber", "auto"):
        spec = TunerSpec(f"lp-{policy}-{seed}", policy, pipe.budget, pipe.specs({"read": 1, "lookup": 3, "pack": 1}))
        trace = run_controller_in_sim(_contended_pipeline(), spec, steps=100, seed=seed)
        share[policy] = float(np.mean([x["throughput"] for x in trace[-30:]])) / optimum
    assert share["plumber"] < 0.8, share
    assert share["auto"] >= 0.9, share


# --------------------------------------------------------------------------- end-to-end judgement of moves


def _visit(moves: AllocationThroughput, t0: float, alloc: dict[str, int], rates: list[float]) -> float:
    """Record one visit of ``alloc`` from ``t0``: a change at t0, then one 1 s window per rate; returns the end."""
    t = t0
    for i, r in enumerate(rates):
        t = t0 + 2.0 + i  # settle_s 1: the first window counted starts 1 s after the change
        moves.record(t, alloc, r, 1.0, since_change_s=t - t0)
    return t


def test_allocation_throughput_names_what_delivered_clearly_more_and_keeps_the_grown_operator_there():
    moves = AllocationThroughput(warmup_s=0.0)
    five, nine = {"read": 2, "lookup": 5}, {"read": 1, "lookup": 9}
    t = _visit(moves, 0.0, five, [7000.0] * 8)
    assert moves.better_than_now(t, five) is None  # nothing else measured
    changed = t
    t = _visit(moves, changed, nine, [4000.0, 4200.0, 3900.0])
    assert not moves.ready(nine) and moves.better_than_now(t, nine) is None  # not measured long enough yet
    for r in (4100.0, 4000.0):  # the same visit goes on
        t += 1.0
        moves.record(t, nine, r, 1.0, since_change_s=t - changed)
    target, gain = moves.better_than_now(t, nine)
    assert target == five and gain == pytest.approx(7000 / 4040 - 1, rel=0.02)
    assert moves.limit("lookup", t) == 5 and moves.limit("read", t) is None  # only what the move grew
    assert moves.limit("lookup", t + moves.memory_s + 1) is None  # the evidence expires
    # within the noise (the 25% prior until 8 windows have been compared): no move back
    other = {"read": 2, "lookup": 6}
    t = _visit(moves, t, other, [6300.0] * 5)
    assert moves.better_than_now(t, other) is None


def test_each_visit_is_measured_on_its_own():
    moves = AllocationThroughput(warmup_s=0.0)
    alloc = {"lookup": 5}
    t = _visit(moves, 0.0, alloc, [7000.0] * 6)
    _visit(moves, t + 10.0, alloc, [3500.0] * 6)  # back after a cost shift: not averaged with before
    assert moves.measured[moves.key(alloc)][0] == pytest.approx(3500.0)


def test_the_first_seconds_of_delivery_are_nobodys_steady_state():
    moves = AllocationThroughput(warmup_s=20.0)
    burst, later = {"sparse_hash": 4}, {"sparse_hash": 6}
    t = _visit(moves, 0.0, burst, [0.0, 0.0, 8000.0, 8100.0, 7900.0, 8000.0])  # queued blocks flushing
    assert not moves.measured  # within 20 s of the first rows delivered
    t = _visit(moves, t, later, [5000.0] * 30)
    assert moves.better_than_now(t, later) is None
    assert moves.ready(later)


def test_growth_measured_to_deliver_less_is_probed_below_once():
    moves = AllocationThroughput(warmup_s=0.0)
    t = _visit(moves, 0.0, {"lookup": 12}, [5000.0] * 8)
    t = _visit(moves, t, {"lookup": 16}, [3000.0] * 5)
    assert moves.better_than_now(t, {"lookup": 16})[0] == {"lookup": 12}
    assert moves.probe_fewer(t, {"lookup": 12}, {"lookup": 1}) == ("lookup", 9)  # 0.7 x 12
    assert moves.limit("lookup", t) == 9  # held there until the probe is judged
    assert moves.probe_fewer(t + 5, {"lookup": 12}, {"lookup": 1}) is None  # tried lately
    assert moves.probe_fewer(t + 5, {"lookup": 9}, {"lookup": 1}) == ("lookup", 7)  # and lower, step by step


def test_a_judged_move_that_delivered_less_than_where_it_started_is_undone():
    moves = AllocationThroughput(warmup_s=0.0)
    t = _visit(moves, 0.0, {"lookup": 12}, [5000.0] * 8)
    t = _visit(moves, t, {"lookup": 16}, [3000.0] * 5)
    assert moves.better_than_now(t, {"lookup": 16})[0] == {"lookup": 12}
    t = _visit(moves, t, {"lookup": 12}, [5200.0] * 5)  # the move back, measured again: it paid
    assert moves.judge_trial({"lookup": 12}) is None
    assert moves.probe_fewer(t, {"lookup": 12}, {"lookup": 1}) == ("lookup", 9)
    assert moves.judge_trial({"lookup": 9}) is None  # not measured yet
    t = _visit(moves, t, {"lookup": 9}, [4900.0] * 5)  # within any margin, but less: back to 12
    assert moves.judge_trial({"lookup": 9}) == {"lookup": 12}
    assert moves.limit("lookup", t) == 12  # the limits from before the probe
    assert moves.judge_trial({"lookup": 12}) is None  # once
    # a probe that delivered at least as much is kept
    t = _visit(moves, t, {"lookup": 12}, [5000.0] * 5)
    moves.probed.clear()
    assert moves.probe_fewer(t, {"lookup": 12}, {"lookup": 1}) == ("lookup", 9)
    t = _visit(moves, t, {"lookup": 9}, [5100.0] * 5)
    assert moves.judge_trial({"lookup": 9}) is None and moves.limit("lookup", t) == 9


def test_noisy_operator_counters_only_noise_the_operators_not_the_delivered_rows():
    from dlrm_platform.tuner.observe import RawOp, RawSnapshot
    from dlrm_platform.tuner.simulator import NoisyCounters

    counters = NoisyCounters(0.0, np.random.default_rng(0), op_sigma=0.8)
    counters(RawSnapshot(0.0, {"a": RawOp()}, 0.0))
    deltas, last = [], 0.0
    for i in range(1, 50):
        snap = counters(RawSnapshot(float(i), {"a": RawOp(rows_out=1000.0 * i, slot_seconds=float(i))}, 1000.0 * i))
        assert snap.sink_rows == pytest.approx(1000.0 * i)
        deltas.append(snap.ops["a"].rows_out - last)
        last = snap.ops["a"].rows_out
    assert np.std(deltas) > 300.0  # per-second counts swing as a long-task operator's do live


def _noisy_contended() -> SimPipeline:
    # the contended pipeline with operator counters as noisy as live (sigma 0.8 per second: a lookup whose
    # tasks outlast the interval), the delivered rows as steady as the sink's
    pipe = _contended_pipeline()
    pipe.op_noise = 0.8
    return pipe


def test_rl_judgement_warm_up_is_a_policy_option_and_nothing_is_measured_inside_it():
    from dlrm_platform.tuner.policies import make_policy

    specs = _noisy_contended().specs({"read": 1, "lookup": 3, "pack": 1})
    default = make_policy(TunerSpec("warmup-default", "rl", 24.0, specs, options={"rl_judge_moves": True}))
    short = make_policy(TunerSpec("warmup-10", "rl", 24.0, specs,
                                  options={"rl_judge_moves": True, "rl_judge_warmup_s": 10}))
    assert default.fs.moves.warmup_s == 20.0 and short.fs.moves.warmup_s == 10.0
    alloc = {"read": 1, "lookup": 3, "pack": 1}
    for t in range(0, 16):  # delivering from t=0, unchanged since: measured only from 10 s (+1 s settle)
        short.fs.moves.record(float(t), alloc, 5000.0, 1.0, since_change_s=float(t) + 30.0)
        default.fs.moves.record(float(t), alloc, 5000.0, 1.0, since_change_s=float(t) + 30.0)
    assert short.fs.moves.ready(alloc) and not default.fs.moves.ready(alloc)


def test_rl_judges_its_moves_by_what_they_delivered_where_counters_are_too_noisy(monkeypatch):
    # rates from the first rows on, as when the judgement was made (off by default; rl's 6 s warm-up
    # alone lifts the unjudged mean from 0.72 to 0.92 here, the judged one 0.95 -> 0.96: tuner/README.md, run 20)
    monkeypatch.setattr(RLPolicyRunner, "measure_after_delivery_s", 0.0)
    _, optimum = _noisy_contended().optimum()
    share: dict[bool, list[float]] = {False: [], True: []}
    for seed in range(4):
        for judge in (False, True):
            # a burst taken for a cost shift at once, and a limit whose point that forgot not compared with,
            # as when the judgement was made (``rl_shift_confirm``, run 80, lifts the unjudged mean 0.81 ->
            # 0.85 here; ``rl_held_point_judges_return``, run 81, on top of it to 0.92)
            spec = TunerSpec(f"judge-{judge}-{seed}", "rl", 24.0, _noisy_contended().specs({"read": 1, "lookup": 3, "pack": 1}),
                             options={"rl_judge_moves": judge, "share_window_s": 0, "rl_shift_confirm": False,
                                      "rl_held_point_judges_return": False})
            trace = run_controller_in_sim(_noisy_contended(), spec, steps=160, seed=seed)
            share[judge].append(float(np.mean([x["throughput"] for x in trace[-80:]])) / optimum)
    # its own counters (sigma 0.8) still say "more lookup slots" often enough to leave it past the peak
    # on some seeds; judged by what each move delivered, it stays near the peak on every one
    assert min(share[True]) >= 0.85, share
    assert np.mean(share[True]) > np.mean(share[False]) + 0.1, share


def test_a_stray_window_on_the_return_forgets_the_count_above_unless_told_to_rescale_it():
    """6 slots, then 10 (slower: more did not pay), then back at 6 a reading 50% off its point (a stray
    window, or a shift): by default the count above, measured since 6 last was, is forgotten, and with it
    the limit; ``rescale_since`` rescales it by the same ratio, so the limit stands."""
    def run(rescale_since: bool) -> ScalingMemory:
        mem = ScalingMemory(["a"], shift_rescales=True, rescale_since=rescale_since)
        for _ in range(3):
            mem.record({"a": 6}, {"a": 6000.0})
        for _ in range(3):
            mem.record({"a": 10}, {"a": 4500.0})
        assert mem.limit("a") == 6
        mem.record({"a": 6}, {"a": 9000.0})
        return mem

    forgot, kept = run(False), run(True)
    assert list(forgot.curves["a"]) == [6] and forgot.limit("a") is None
    assert kept.settled("a")[10] == pytest.approx(4500.0 * 1.5) and kept.limit("a") == 6


def _hysteresis_memory(**kw) -> ScalingMemory:
    return ScalingMemory(["a"], shift_rescales=True, limit_hysteresis=0.1, **kw)


def test_with_limit_hysteresis_a_limit_holds_until_the_step_measures_clearly_paid():
    """6 -> 8 slots did not pay (line: 6,000 * (1 + 0.25 / 3) = 6,500); re-measured at 8 a little over
    the line, the plain limit vanishes (live: the contended lookup's limit came and went within a tick,
    and rl grew it past its peak again); held, it goes once 8 measures 10% over the line."""
    def at_eight(mem: ScalingMemory, cap: float, times: int = 1) -> ScalingMemory:
        for _ in range(times):
            mem.record({"a": 8}, {"a": cap})
        return mem

    plain, held = ScalingMemory(["a"], shift_rescales=True), _hysteresis_memory()
    for mem in (plain, held):
        _measure(mem, "a", 6, 6000.0)
        _measure(mem, "a", 8, 6000.0)
        assert mem.limit("a") == 6
        at_eight(mem, 7100.0)  # smoothed 6,550: just over the line
    assert plain.limit("a") is None
    assert held.limit("a") == 6
    at_eight(held, 7600.0, times=3)  # smoothed ~7,400 > 6,500 * 1.1
    assert held.limit("a") is None


def test_with_limit_hysteresis_a_stray_window_forgetting_the_counts_below_leaves_the_limit():
    """At 8 slots, past a peak at 6, a reading 40% off reads as a cost shift that forgets the counts
    below: with nothing below, the plain memory has no limit (live, the step up to 11 lookup slots then
    "counted as paid"); the held limit is judged by the figures it rests on, rescaled by the shift."""
    plain, held = ScalingMemory(["a"], shift_rescales=True), _hysteresis_memory()
    for mem in (plain, held):
        _measure(mem, "a", 6, 6000.0)
        _measure(mem, "a", 8, 5000.0)
        assert mem.limit("a") == 6
        mem.record({"a": 8}, {"a": 7000.0})  # 40% off its point: a "shift"
        assert list(mem.curves["a"]) == [8]
    assert plain.limit("a") is None
    assert held.limit("a") == 6
    assert held.held["a"].points[6][0] == pytest.approx(6000.0 * 1.4)


def test_with_limit_hysteresis_a_stray_window_on_the_return_keeps_the_limit():
    """The scenario of ``test_a_stray_window_on_the_return_...``: back at 6 a reading 50% off forgets 10
    (measured since 6 last was); its figure is kept as it was, and the limit stands."""
    mem = _hysteresis_memory()
    _measure(mem, "a", 6, 6000.0)
    _measure(mem, "a", 10, 4500.0)
    assert mem.limit("a") == 6
    mem.record({"a": 6}, {"a": 9000.0})
    assert list(mem.curves["a"]) == [6] and mem.limit("a") == 6
    assert mem.held["a"].points[10][0] == 4500.0


def test_with_limit_hysteresis_a_count_measured_after_a_real_shift_frees_the_limit():
    """A held-out simulated pipeline: read's cost doubles at 3 slots; at 4 it measures 8,900 (after the
    shift) against 14,000 at 3 (before): a limit. Back at 3, the shift shows (7,000): 4's figure, measured
    since, is kept as it is, and over the line at 3's new figure it frees the limit (rescaled by the
    shift's ratio, it held read at 3 to the end of the run, at 0.81 of the new optimum)."""
    mem = _hysteresis_memory()
    _measure(mem, "a", 3, 14000.0)
    _measure(mem, "a", 4, 8900.0)
    assert mem.limit("a") == 3
    _measure(mem, "a", 3, 7000.0)
    assert mem.limit("a") is None


def test_with_limit_hysteresis_a_held_limit_goes_with_its_points_expiry_or_a_delivered_rise():
    """Expiry: kept on past its point (while the other measured as when it was found), a limit cost
    held-out simulated pipelines 0.004-0.008 (false limits of noisy linear operators never re-tested)."""
    expiring = _hysteresis_memory(horizon=5, horizon_above=50)
    _measure(expiring, "a", 4, 4000.0)
    _measure(expiring, "a", 6, 4000.0)
    assert expiring.limit("a") == 4
    assert not expiring.released
    for _ in range(6):  # 4, below the count it runs at, expires: the limit with it
        expiring.record({"a": 6}, {"a": 4000.0})
    assert 4 not in expiring.curves["a"] and expiring.limit("a") is None
    assert expiring.released == {"a"}  # running past it, what lies past it is unknown again

    delivered = _hysteresis_memory(delivered_margin=0.15)
    for _ in range(3):
        delivered.record({"a": 3}, {"a": 3173.0}, delivered=3000.0)
    for _ in range(3):
        delivered.record({"a": 4}, {"a": 2239.0}, delivered=3100.0)
    assert delivered.limit("a") == 3
    for _ in range(3):  # the counters still say no, the pipeline delivered clearly more: no limit
        delivered.record({"a": 4}, {"a": 2239.0}, delivered=4500.0)
    assert delivered.limit("a") is None and not delivered.released  # freed by evidence, not by age


def test_only_a_limit_of_two_slots_or_more_expiring_below_the_operator_marks_it_released():
    """``released`` (rl's ``one_slot_after_release``): the limit's lower point expired while the operator
    ran past it. Not where the point above expired (the operator at the limit), nor for a one-slot step,
    whose "did not pay" lies within a linear operator's noise."""
    def expire(below: int, above: int, runs_at: int) -> ScalingMemory:
        mem = _hysteresis_memory(horizon=5, horizon_above=5)
        _measure(mem, "a", below, 4000.0)
        _measure(mem, "a", above, 4000.0)
        assert mem.limit("a") == below
        for _ in range(7):
            mem.record({"a": runs_at}, {"a": 4000.0})
        assert mem.limit("a") is None
        return mem

    assert expire(4, 6, runs_at=6).released == {"a"}
    assert not expire(4, 5, runs_at=5).released
    assert not expire(4, 6, runs_at=4).released


def test_a_limit_that_ends_by_age_marks_aged_out():
    """``aged_out`` (rl's ``one_slot_after_aged_limit``): "4 -> 5 slots did not pay" held while the operator
    ran at 4, and ended when its evidence aged out, nothing measured against it: the step past 4 is
    unmeasured again, whether 5 measured slower or only under the paid line (live, run 73f: 7 a little over
    6 at the contended lookup). Not a limit freed by evidence; forgetting the operator (a cost shift) drops
    the mark."""
    def limit_at_four(above: float) -> ScalingMemory:
        mem = _hysteresis_memory(horizon=5, horizon_above=5)
        _measure(mem, "a", 4, 4000.0)
        _measure(mem, "a", 5, above)
        assert mem.limit("a") == 4
        return mem

    def aged(mem: ScalingMemory) -> ScalingMemory:
        for _ in range(7):  # at 4 again: the point at 5 and the limit on it age out
            mem.record({"a": 4}, {"a": 4000.0})
            mem.limit("a")
        assert mem.limit("a") is None
        return mem

    slower = aged(limit_at_four(3500.0))
    assert slower.aged_out == {"a": 4}
    slower.forget("a")
    assert not slower.aged_out
    assert aged(limit_at_four(4100.0)).aged_out == {"a": 4}  # under the paid line (4,250), not slower
    past = limit_at_four(4100.0)
    for _ in range(7):  # run at 5, past the limit: the point at 4 ages out, and the limit with it
        past.record({"a": 5}, {"a": 4100.0})
        past.limit("a")
    assert past.limit("a") is None and past.aged_out == {"a": 4}
    freed = _hysteresis_memory(horizon=10, horizon_above=10, delivered_margin=0.15)
    for slots, cap, delivered in ((4, 4000.0, 1000.0), (5, 3500.0, 1000.0)):
        for _ in range(3):
            freed.record({"a": slots}, {"a": cap}, delivered=delivered)
    assert freed.limit("a") == 4
    for _ in range(3):  # the counters still say slower, the pipeline delivered clearly more: freed by evidence
        freed.record({"a": 5}, {"a": 3500.0}, delivered=2000.0)
    assert freed.limit("a") is None and not freed.aged_out


def test_with_limit_outlives_lower_a_limit_stands_past_its_lower_points_expiry_until_horizon_above():
    """``limit_outlives_lower`` (rl's ``rl_limit_outlives_lower``): an operator running past a limit of a
    step of that many slots or more never measures the lower count again, so its point expires after
    ``horizon`` while the evidence above is kept ``horizon_above``. The limit stands on the lower point's
    figure as last measured until ``horizon_above`` steps after it was found, and still goes where the
    step then measures paid. A one-slot step (under 2) goes with its point, as without the option."""
    def past(below: int, above: int, outlives: int | None) -> ScalingMemory:
        mem = _hysteresis_memory(horizon=5, horizon_above=20, limit_outlives_lower=outlives)
        _measure(mem, "a", below, 4000.0)
        _measure(mem, "a", above, 4000.0)
        assert mem.limit("a") == below
        for _ in range(7):  # the lower point expires; the operator runs on at `above`
            mem.record({"a": above}, {"a": 4000.0})
            mem.limit("a")
        assert below not in mem.curves["a"]
        return mem

    assert past(4, 6, outlives=None).limit("a") is None
    assert past(4, 5, outlives=2).limit("a") is None  # a one-slot step
    kept = past(4, 6, outlives=2)
    assert kept.limit("a") == 4 and not kept.released
    for _ in range(15):  # 20 steps after it was last found (step 8, the last with both points)
        kept.record({"a": 6}, {"a": 4000.0})
    assert kept.limit("a") == 4
    kept.record({"a": 6}, {"a": 4000.0})  # 21: horizon_above passed
    assert kept.limit("a") is None

    paid = past(4, 6, outlives=2)
    for _ in range(6):  # 6 slots now read ~5,100: 4 -> 6 paid by more than the hysteresis (line 4,500)
        paid.record({"a": 6}, {"a": 5150.0})  # (under shift_tolerance: no cost shift rescaling 4's figure)
    assert paid.limit("a") is None


def test_with_delivered_max_age_only_points_measured_close_in_time_compare_their_delivered_rates():
    """Live (run 33, round 2), 4 lookup slots held their limit (5 did not pay) for 50 s while the
    pipeline's delivered rate drifted: 15% below what 5's one window had read, which freed the limit
    (+4 to 8). With ``delivered_max_age`` a delivered rise counts only between figures measured within
    that many steps of each other."""
    def memory(max_age):
        mem = _hysteresis_memory(delivered_margin=0.15, delivered_max_age=max_age, horizon_above=90)
        for _ in range(3):
            mem.record({"a": 4}, {"a": 5600.0}, delivered=5600.0)
        for _ in range(3):
            mem.record({"a": 5}, {"a": 5000.0}, delivered=5800.0)
        assert mem.limit("a") == 4
        for _ in range(40):  # back at 4: its counters as before, the pipeline slower than 50 s ago
            mem.record({"a": 4}, {"a": 5600.0}, delivered=4800.0)
        return mem

    assert memory(None).limit("a") is None  # 5,800 against 4,800: "rose", across 40 steps
    assert memory(30).limit("a") == 4
    fresh = memory(30)
    for _ in range(3):  # measured again now, 5 delivers more than 4 does now: no limit
        fresh.record({"a": 5}, {"a": 5000.0}, delivered=5800.0)
    assert fresh.limit("a") is None


def test_with_delivered_window_s_a_point_keeps_the_long_window_delivered_once_unchanged_that_long():
    """Live, one window of the contended pipeline read 1,900-9,100 samples/s at fixed slots and such a
    burst cancelled the lookup's measured limit: with ``delivered_window_s`` the sink's 5 s figure is
    kept beside a point, and nothing until the allocation has been unchanged for 5 s."""
    from dlrm_platform.tuner.observe import Observation

    fs = FeatureState(["a"])
    fs.scaling = ScalingMemory(["a"], delivered_window_s=5.0)

    def obs(since_change_s: float) -> Observation:
        return Observation(t=10.0, window_s=1.0, ops=[], throughput=9100.0, mem_used=0.0, mem_limit=1e9,
                           spill_rate=0.0, budget=4.0, since_change_s=since_change_s,
                           extra={"throughput_long": 6000.0})

    assert RLPolicyRunner._delivered(obs(3.0), fs) is None
    assert RLPolicyRunner._delivered(obs(6.0), fs) == 6000.0
    fs.warming_up_t = 7.0  # the 5 s reach back into the warm-up's ramp (run 26: 4 slots read low there)
    assert RLPolicyRunner._delivered(obs(6.0), fs) is None
    fs.scaling = ScalingMemory(["a"])
    assert RLPolicyRunner._delivered(obs(3.0), fs) == 9100.0  # off: the window's own figure


def test_with_return_past_limit_an_operator_past_its_limit_measured_slower_goes_back_to_it():
    """Live, rl grew the contended lookup to 8-9 slots before any limit existed; the limit then held
    (5: 5 -> 8 did not pay) but ``better`` asks for 3x the lookup's noise, so it stayed at 8 with 5
    measured faster. ``_past_limit`` takes it back where the limit measured ``margin`` more."""
    from dlrm_platform.tuner.spec import OpSpec

    def memory(cap_at_8: float) -> FeatureState:
        fs = FeatureState(["a"])
        fs.scaling = ScalingMemory(["a"], limit_hysteresis=0.1)
        _measure(fs.scaling, "a", 5, 6000.0)
        _measure(fs.scaling, "a", 8, cap_at_8)
        return fs

    specs = [OpSpec("a", 1.0)]
    assert RLPolicyRunner._past_limit({"a": 8}, specs, memory(4800.0), 0.2) == (pytest.approx(1.25), "a", 5)
    assert RLPolicyRunner._past_limit({"a": 8}, specs, memory(5200.0), 0.2) is None  # within the margin
    assert RLPolicyRunner._past_limit({"a": 5}, specs, memory(4800.0), 0.2) is None  # at its limit already
    stale = memory(4800.0)
    stale.scaling.record({"a": 5}, {"a": 6000.0})  # 8 not measured now: its figure is an earlier visit's
    assert RLPolicyRunner._past_limit({"a": 8}, specs, stale, 0.2) is None


def test_an_operator_past_a_limit_whose_slots_bought_nothing_goes_back_to_it_and_says_why():
    """Live (run 73e), rl grew the contended lookup 9 -> 11 before any limit; "9 -> 11 did not pay" then
    held, but its counters (swinging 4-8x) never read the 20% less ``_past_limit`` asks for, and it sat at
    11 for 67 s. ``_bought_nothing_past_limit`` takes it back where, measured there now and often, it is no
    faster past the limit with the pipeline delivering no more, or the pipeline delivered 15% less there
    whatever its counters read; ``_move_back`` says which figures showed it."""
    from dlrm_platform.tuner.observe import Observation, OpObs
    from dlrm_platform.tuner.spec import OpSpec

    def state(cap_at_11: float, delivered_at_11: float, times: int = 3) -> FeatureState:
        fs = FeatureState(["a"])
        fs.scaling = ScalingMemory(["a"], limit_hysteresis=0.1)
        for _ in range(3):
            fs.scaling.record({"a": 9}, {"a": 6000.0}, delivered=5900.0)
        for _ in range(times):
            fs.scaling.record({"a": 11}, {"a": cap_at_11}, delivered=delivered_at_11)
        return fs

    specs = [OpSpec("a", 1.0)]
    runner = RLPolicyRunner(None, {})
    assert (runner.return_no_faster_past, runner.return_delivered_drop) == (0.10, 0.15)
    assert state(5800.0, 5500.0).scaling.limit("a") == 9
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 5500.0)) == ("a", 9)
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(6300.0, 5500.0)) == ("a", 9)  # within 10%
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 6100.0)) is None  # delivered more
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 5500.0, times=1)) is None
    assert runner._bought_nothing_past_limit({"a": 9}, specs, state(5800.0, 5500.0)) is None  # at its limit
    stale = state(5800.0, 5500.0)
    stale.scaling.record({"a": 9}, {"a": 6000.0}, delivered=5900.0)  # 11 not measured now
    assert runner._bought_nothing_past_limit({"a": 11}, specs, stale) is None
    # the second reading alone: the pipeline delivered 15% less at 11, whatever the counters read there
    # (live, run 74a: the lookup's at 8 read as its new workers started, and 12 read faster than that)
    runner.return_no_faster_past = None
    assert state(5800.0, 4900.0).scaling.delivered_less_past("a", 11, 9, 0.15)
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 4900.0)) == ("a", 9)
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 5500.0)) is None  # 7% less
    assert runner._bought_nothing_past_limit({"a": 11}, specs, state(5800.0, 4900.0, times=1)) is None
    runner.return_no_faster_past = 0.10

    obs = Observation(t=60.0, window_s=1.0, ops=[OpObs("a", 11, 1.0, 5500.0, 527.0, 1.0, 10.0, 0.9, 0.0,
                                                          2.0, 1e6, capacity=5800.0, measured=True)],
                      throughput=5500.0, mem_used=0.0, mem_limit=1e9, spill_rate=0.0, budget=12.0)
    new, why = runner._move_back(obs, {"a": 11}, specs, 12.0, state(5800.0, 5500.0))
    assert new == {"a": 9}
    assert why.startswith("-2 a: to 9 slots, the slots past its limit bought nothing (capacity -3% at 11")
    assert "5,500 samples/s there against 5,900" in why
    runner.return_no_faster_past = runner.return_delivered_drop = None
    assert runner._move_back(obs, {"a": 11}, specs, 12.0, state(5800.0, 5500.0)) is None  # off


def test_an_operator_past_a_limit_whose_delivered_figure_was_never_measured_goes_back_on_its_counters():
    """Live (run 78a), the contended lookup went 4 -> 6 -> 10 in 4.2 s, under the 5 s the delivered figure
    beside a point needs, so 6 had none; "6 -> 10 did not pay" held from its counters, and neither return
    reading (both compare delivered figures) could fire: 10 slots to the end, 0.875 of the oracle. With the
    limit's delivered figure missing, its counters at ``return_unmeasured_limit`` (0) under the limit's or
    more, with the pipeline delivering less now than the limit's capacity, take it back, to measure the
    pipeline there, where it runs ``return_unmeasured_limit_slots`` (2) or more past the limit; ``_move_back``
    says so."""
    from dlrm_platform.tuner.observe import Observation, OpObs
    from dlrm_platform.tuner.spec import OpSpec

    def state(cap_at_10: float, delivered_at_6: float | None = None, times: int = 3,
              delivered_at_10: float = 5000.0) -> FeatureState:
        fs = FeatureState(["a"])
        fs.scaling = ScalingMemory(["a"], limit_hysteresis=0.1, delivered_margin=0.15, delivered_max_age=30)
        for _ in range(2):
            fs.scaling.record({"a": 6}, {"a": 6400.0}, delivered=delivered_at_6)
        for _ in range(times):
            fs.scaling.record({"a": 10}, {"a": cap_at_10}, delivered=delivered_at_10)
        return fs

    specs = [OpSpec("a", 1.0)]
    runner = RLPolicyRunner(None, {})
    assert runner.return_unmeasured_limit == 0.0
    assert state(5000.0).scaling.limit("a") == 6
    assert state(5000.0).scaling.no_faster_past_unmeasured_limit("a", 10, 6, 0.0)
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0)) == ("a", 6)
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(6600.0)) is None  # 3% over the limit's
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0, times=2)) is None  # not often
    runner.return_unmeasured_limit_slots = 5  # 4 slots past its limit: fewer than asked
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0)) is None
    runner.return_unmeasured_limit_slots = RLPolicyRunner.return_unmeasured_limit_slots
    assert runner.return_unmeasured_limit_slots == 2
    # the pipeline delivers more now than the lookup alone did at the limit: going back could cap it lower
    # (simulated, noisy per_task_overhead: such returns to limits read from noise cost 0.02 of the optimum)
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0, delivered_at_10=6500.0)) is None
    # the limit's delivered figure measured: the two delivered readings decide, as before (5,000 against
    # 5,200: 4% less, and its counters 22% under with the pipeline delivering no more, so back)
    assert not state(5000.0, 5200.0).scaling.no_faster_past_unmeasured_limit("a", 10, 6, 0.0)
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0, 5200.0)) == ("a", 6)
    assert runner._bought_nothing_past_limit({"a": 10}, specs, state(5000.0, 4800.0)) is None  # delivered more

    obs = Observation(t=30.0, window_s=1.0, ops=[OpObs("a", 10, 1.0, 5000.0, 527.0, 1.0, 10.0, 0.9, 0.0,
                                                          2.0, 1e6, capacity=5000.0, measured=True)],
                      throughput=5000.0, mem_used=0.0, mem_limit=1e9, spill_rate=0.0, budget=12.0)
    noisy = state(5000.0)
    noisy.scaling.noise_k, noisy.scaling.noise["a"] = 3.0, 0.5  # live, the lookup's counters swing 4-8x:
    assert noisy.scaling.better("a", 10, runner.scaling_margin) is None  # no "measured +28% there"
    new, why = runner._move_back(obs, {"a": 10}, specs, 12.0, noisy)
    assert new == {"a": 6}
    assert why.startswith("-4 a: to 6 slots, the slots past its limit bought nothing by its counters "
                          "(capacity -22% at 10); what the pipeline delivers at 6 was never measured")
    runner.return_unmeasured_limit = None
    assert runner._move_back(obs, {"a": 10}, specs, 12.0, noisy) is None  # off


def test_an_operator_past_its_limit_is_no_faster_there_only_where_its_counters_and_the_pipeline_agree():
    """``no_faster_past`` (the shield's ``flat_past_limit``): at 5 slots past a limit of 4, measured often,
    its capacity within the margin of the limit's, and the pipeline delivering no more at 5. Simulated, a
    linear operator's limit from counter noise (8 -> 9 did not pay on its counters while the pipeline
    delivered more at 9) read flat gave its slots away."""
    def memory(cap_at_5: float, delivered_at_5: float, times: int = 3) -> ScalingMemory:
        mem = ScalingMemory(["read"])
        for _ in range(3):
            mem.record({"read": 4}, {"read": 9_870.0}, delivered=11_000.0)
        for _ in range(times):
            mem.record({"read": 5}, {"read": cap_at_5}, delivered=delivered_at_5)
        return mem

    assert memory(9_920.0, 8_800.0).limit("read") == 4
    assert memory(9_920.0, 8_800.0).no_faster_past("read", 5, 4, 0.10)
    assert not memory(9_920.0, 11_500.0).no_faster_past("read", 5, 4, 0.10)  # the pipeline delivered more
    assert not memory(11_000.0, 8_800.0).no_faster_past("read", 5, 4, 0.10)  # its counters read 11% more
    assert not memory(9_920.0, 8_800.0, times=1).no_faster_past("read", 5, 4, 0.10)  # measured once at 5
    no_delivered = ScalingMemory(["read"])
    _measure(no_delivered, "read", 4, 9_870.0)
    _measure(no_delivered, "read", 5, 9_920.0)
    assert not no_delivered.no_faster_past("read", 5, 4, 0.10)


def test_a_count_measured_at_less_than_half_a_smaller_ones_is_a_cost_shift_not_a_curve():
    """``cross_count_shift``: 1 slot measured 650 samples/s steady; then 2 slots 190 (the operator's cost rose
    8x between). No lock or channel limit halves what a slot more delivers: the old point is forgotten (with
    the limit it made) and the shift counted. A drop within the operator's own noise, or of an operator whose
    noise is not measured yet, is no such evidence."""
    mem = ScalingMemory(["a"], cross_count_shift=0.5)
    for cap in (640.0, 650.0, 660.0, 650.0):
        mem.record({"a": 1}, {"a": cap})
    mem.record({"a": 2}, {"a": 190.0})
    assert mem.settled("a") == {2: 190.0} and mem.limit("a") is None and mem.cross_shifts == 1
    noisy = ScalingMemory(["a"], cross_count_shift=0.5)
    for cap in (400.0, 900.0, 300.0, 800.0):  # readings that swing 2-3x
        noisy.record({"a": 1}, {"a": cap})
    noisy.record({"a": 2}, {"a": 190.0})
    assert set(noisy.settled("a")) == {1, 2} and noisy.cross_shifts == 0
    unknown = ScalingMemory(["a"], cross_count_shift=0.5)
    unknown.record({"a": 1}, {"a": 650.0})
    unknown.record({"a": 2}, {"a": 190.0})
    assert set(unknown.settled("a")) == {1, 2} and unknown.cross_shifts == 0
    off = ScalingMemory(["a"])
    for _ in range(4):
        off.record({"a": 1}, {"a": 650.0})
    off.record({"a": 2}, {"a": 190.0})
    assert off.limit("a") == 1 and off.cross_shifts == 0


def test_under_the_judgement_a_cost_shift_forgets_what_allocations_delivered_before_it():
    from dlrm_platform.tuner.observe import Observation
    from dlrm_platform.tuner.policies import RLPolicy
    from dlrm_platform.tuner.spec import OpSpec

    specs = [OpSpec("a", 1.0, initial=1), OpSpec("b", 1.0, initial=2)]
    policy = RLPolicy(TunerSpec("judged-shift", "rl", 8.0, specs, options={"rl_judge_moves": True}))
    assert policy.fs.scaling.cross_count_shift == RLPolicyRunner.cross_count_shift
    assert RLPolicy(TunerSpec("plain", "rl", 8.0, specs)).fs.scaling.cross_count_shift is None  # judged only
    policy.fs.moves.measured[policy.fs.moves.key({"a": 1, "b": 2})] = (900.0, 10.0, 5.0)
    policy.fs.moves.limits["a"] = (1, 1e9)
    policy.fs.scaling.cross_shifts += 1
    obs = Observation(30.0, 1.0, [], 100.0, 0.0, 1e9, 0.0, 8.0)
    policy.decide(obs, {"a": 2, "b": 2}, specs, 8.0)
    assert policy.fs.moves.key({"a": 1, "b": 2}) not in policy.fs.moves.measured
    assert policy.fs.moves.limit("a", 30.0) is None and policy.shifts_seen == 1


def test_an_expired_limit_leaves_its_steps_slope_to_size_the_next_move():
    """4 -> 5 slots of a did not pay (limit 4); a runs on at 5 until the point at 4 expires, and with it the
    limit. With ``keep_expired_slope`` the step's slope (no gain: share 0) still answers ``marginal_share``
    at 5, so rl's next "+1" is one slot, not ``max_repeat`` (live, the contended lookup went 5 -> 9 in one
    move once the limit had expired); once a smaller count is measured again, or after a cost shift, it
    answers from the curve."""
    for keep in (True, False):
        mem = ScalingMemory(["a"], horizon=30, horizon_above=90, limit_hysteresis=0.1, shift_rescales=True,
                            keep_expired_slope=keep)
        for _ in range(3):
            mem.record({"a": 4}, {"a": 1000.0})
        for _ in range(3):
            mem.record({"a": 5}, {"a": 1010.0})
        assert mem.limit("a") == 4
        for _ in range(30):
            mem.record({"a": 5}, {"a": 1010.0})
            mem.limit("a")
        assert 4 not in mem.curves["a"] and mem.limit("a") is None  # the evidence expired
        share = mem.marginal_share("a", 5)
        if keep:
            assert share is not None and share < 0.1, share
        else:
            assert share is None
    mem.keep_expired_slope = True
    mem.expired_share["a"] = (5, 0.0)
    mem.record({"a": 3}, {"a": 800.0})
    assert mem.marginal_share("a", 5) == pytest.approx(((1010.0 - 800.0) / 2) / (1010.0 / 5))
    mem.record({"a": 5}, {"a": 3000.0})  # its cost fell 3x: a shift
    assert "a" not in mem.expired_share


def test_with_superlinear_tolerance_a_burst_above_a_linear_gain_is_neither_a_peak_nor_a_limit():
    # Live (run 51), per_task_overhead's sparse hash: 9,232 at 6 slots, 32,076 at 7, 16,277 at 9. No slot
    # adds more than a linear share, so 7's figure is a burst of finished tasks: as measured it drew rl
    # back from 9 to 7 ("+97% there") and held a limit of 7 across the cost shift.
    def run(tolerance: float | None) -> ScalingMemory:
        mem = ScalingMemory(["h"], noise_k=3.0, limit_hysteresis=0.1, superlinear_tolerance=tolerance)
        _measure(mem, "h", 6, 9232.0)
        _measure(mem, "h", 7, 32076.0)
        _measure(mem, "h", 9, 16277.0)
        return mem

    as_measured, capped = run(None), run(0.2)
    assert as_measured.limit("h") == 7 and as_measured.better("h", 9, 0.1) == 7
    assert capped.settled("h")[7] == pytest.approx(9232.0 * 7 / 6 * 1.2)
    assert capped.settled("h")[9] == 16277.0  # within a linear gain over 7's figure as read
    assert capped.limit("h") is None and capped.better("h", 9, 0.1) is None
    # a real peak stays one: past it more slots deliver less, whatever the tolerance
    peak = ScalingMemory(["h"], superlinear_tolerance=0.2)
    _measure(peak, "h", 4, 4000.0)
    _measure(peak, "h", 6, 5600.0)
    _measure(peak, "h", 9, 4500.0)
    assert peak.limit("h") == 6 and peak.better("h", 9, 0.1) == 6


def test_a_larger_count_measured_no_faster_is_told():
    mem = ScalingMemory(["a"])
    assert not mem.measured_no_faster_above("a", 4)  # nothing measured
    mem.record({"a": 4}, {"a": 400.0})
    mem.record({"a": 6}, {"a": 560.0})
    assert not mem.measured_no_faster_above("a", 4) and not mem.measured_no_faster_above("a", 6)
    mem.record({"a": 8}, {"a": 540.0})
    assert mem.measured_no_faster_above("a", 6) and not mem.measured_no_faster_above("a", 4)
    assert not mem.measured_no_faster_above("a", 5)  # 5 itself never measured


def test_a_held_limit_that_ends_says_why_once():
    """Live, the contended lookup's limit vanished between two ticks and the net's "+1" took it past its peak,
    with nothing in the record to say why (runs 79c, 80): the memory keeps why each held limit ended until
    read, and the decision log prints it on the tick it happened."""
    mem = ScalingMemory(["a"], limit_hysteresis=0.1)
    for _ in range(3):
        mem.record({"a": 3}, {"a": 300.0})
    for _ in range(3):
        mem.record({"a": 5}, {"a": 300.0})
    assert mem.limit("a") == 3 and mem.pop_ended() == {}
    for cap in (380.0, 440.0):  # each within its noise of the last, the step's top climbs over the line
        mem.record({"a": 5}, {"a": cap})
        mem.limit("a")
    assert mem.limit("a") is None
    assert mem.pop_ended() == {"a": "its limit of 3 slots ended: capacity 390 at 5 slots against 300 at 3: the step paid"}
    assert mem.pop_ended() == {}  # said once
    for _ in range(2):
        mem.record({"a": 5}, {"a": 300.0})
    assert mem.limit("a") == 3
    mem.forget("a")
    assert mem.pop_ended() == {"a": "its limit of 3 slots ended: its cost per row changed"}


def test_with_shift_confirm_one_burst_window_does_not_rescale_the_step_above_a_limit():
    """5 -> 6 slots did not pay. One window at 5 reads 850 (42% over its point): taken for a cost shift, it
    rescales the point at 6 by x1.42 while the readings after it bring 5 back down, and the limit ends as "the
    step paid" (live, the contended lookup's 5 -> 6, then the net's "+1" took it 6 -> 10, run 80). With
    ``shift_confirm`` the lone window is left out and the limit holds; two in a row are a shift, and rescale
    the point above as before."""

    def run(confirm, readings):
        mem = ScalingMemory(["a"], shift_rescales=True, limit_hysteresis=0.1, shift_confirm=confirm)
        for k, cap in ((5, 600.0), (6, 610.0), (5, 600.0)):
            for _ in range(3):
                mem.record({"a": k}, {"a": cap})
        assert mem.limit("a") == 5
        for cap in readings:
            mem.record({"a": 5}, {"a": cap})
            mem.limit("a")
        return mem

    burst = (850.0, 600.0, 600.0, 600.0)
    off = run(False, burst)
    assert off.limit("a") is None
    assert off.pop_ended()["a"].startswith("its limit of 5 slots ended: capacity 864 at 6 slots")
    on = run(True, burst)
    assert on.limit("a") == 5 and on.pop_ended() == {}
    assert on.curves["a"][6][0] == 610.0
    shifted = run(True, (850.0, 850.0, 850.0))
    assert shifted.curves["a"][6][0] == pytest.approx(610.0 * 850.0 / 600.0)
    assert shifted.limit("a") == 5  # both counts rescaled alike: the step still did not pay


def test_with_ended_is_unmeasured_a_limit_that_ends_on_its_step_paying_marks_its_count_as_aged_out_does():
    """"3 -> 5 did not pay" ends on 5 measured faster: past 5, where the operator runs, nothing is measured. With
    ``ended_is_unmeasured`` the count is marked in ``aged_out`` (rl's ``one_slot_after_aged_limit`` then grows it
    one slot past at its next move); live, the contended lookup's limit ended on what the pipeline delivered at 8
    slots and the net's "+1" took it 8 -> 12 (run 80). Off, only a limit that ends by age is marked."""

    def run(mark):
        mem = ScalingMemory(["a"], limit_hysteresis=0.1, ended_is_unmeasured=mark)
        for k, cap in ((3, 300.0), (5, 300.0)):
            for _ in range(3):
                mem.record({"a": k}, {"a": cap})
        assert mem.limit("a") == 3
        for cap in (380.0, 440.0):
            mem.record({"a": 5}, {"a": cap})
            mem.limit("a")
        assert mem.limit("a") is None and "the step paid" in mem.pop_ended()["a"]
        return mem

    assert run(True).aged_out == {"a": 3}
    assert run(False).aged_out == {}


def _past_a_limit_whose_point_was_forgotten(judge: bool) -> ScalingMemory:
    """6 -> 8 slots paid by what the pipeline delivered (5,536 -> 6,920 samples/s); 12's first window reads
    1,900 (its workers starting): "8 -> 12 did not pay" holds. The next two at 12 read ~4,450, a cost shift
    by ``shift_confirm``: the counts below 12 are forgotten, 8's among them, while the limit of 8 holds
    (live, the contended lookup at 12 past 8 for 34 s, run 81)."""
    mem = ScalingMemory(["a"], noise_k=3.0, shift_rescales=True, horizon_above=90, delivered_margin=0.15,
                        limit_hysteresis=0.1, delivered_max_age=30, limit_outlives_lower=2, shift_confirm=True,
                        held_point_judges_return=judge)
    for k, cap, got in [(6, 5500.0, 5536.0)] * 3 + [(8, 5900.0, 6920.0)] * 3:
        mem.record({"a": k}, {"a": cap}, delivered=got)
        mem.limit("a")
    assert mem.limit("a") is None
    for cap, got in ((1900.0, None), (4500.0, None), (4400.0, 4560.0), (4500.0, 4560.0), (4450.0, 4560.0)):
        mem.record({"a": 12}, {"a": cap}, delivered=got)
        assert mem.limit("a") == 8
    assert sorted(mem.curves["a"]) == [12] and mem.measured_often("a", 12)
    return mem


def test_with_held_point_judges_return_a_limit_whose_point_was_forgotten_is_compared_by_its_figures():
    """The return rules compare the count past a held limit with the limit's figures when last measured where
    its point was forgotten (``held_point_judges_return``): 12 delivers 4,560 against 6,920 at 8, and reads
    less capacity. Off, nothing compares them and the operator stays past its limit until the limit ends."""
    on = _past_a_limit_whose_point_was_forgotten(True)
    # its figures when last measured, as the shift left them (the capacity rescaled as the counts above are)
    assert on.limit_point("a", 8) == on.held["a"].points[8][:2] and on.limit_point("a", 8)[1] == 6920.0
    assert on.delivered_past("a", 12, 8) == (4560.0, 6920.0)
    assert on.delivered_less_past("a", 12, 8, 0.15) and on.no_faster_past("a", 12, 8, 0.10)
    assert on.limit_point("a", 6) is None  # not the held limit's: forgotten is forgotten
    off = _past_a_limit_whose_point_was_forgotten(False)
    assert off.limit_point("a", 8) is None and off.delivered_past("a", 12, 8) is None
    assert not off.delivered_less_past("a", 12, 8, 0.15) and not off.no_faster_past("a", 12, 8, 0.10)


def test_rl_goes_back_to_a_held_limit_whose_point_was_forgotten_and_says_against_what():
    """The runner's return rule fires on such a limit, and its reason names the figures it compared."""
    specs = [OpSpec(name="a", num_cpus=1.0, min_slots=1, max_slots=16)]
    runner = RLPolicyRunner.load()
    moves = {}
    for judge in (True, False):
        fs = FeatureState(["a"])
        fs.scaling = _past_a_limit_whose_point_was_forgotten(judge)
        moves[judge] = runner._move_back(_obs({"a": 4450.0}, {"a": 12}), {"a": 12}, specs, 16.0, fs)
    assert moves[False] is None
    new, why = moves[True]
    assert new == {"a": 8}, why
    assert why.startswith("-4 a: to 8 slots, the slots past its limit bought nothing (capacity "), why
    assert "against 8's when its limit was last measured at 12, the pipeline delivering 4,560 samples/s there " \
           "against 6,920)" in why, why
