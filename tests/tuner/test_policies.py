"""Policies driven by the real controller against the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm_platform.tuner.controller import Controller
from dlrm_platform.tuner.observe import Observation, RawOp, RawSnapshot
from dlrm_platform.tuner.policies import enumerate_allocations, neighbourhood
from dlrm_platform.tuner.simulator import SimOp, SimPipeline, run_controller_in_sim
from dlrm_platform.tuner.spec import OpSpec, TunerSpec


def _pipe():
    # b is 8x as expensive as a, c 4x; optimum at 13 CPUs: (1, 8, 4)
    return SimPipeline(ops=[SimOp("a", 800.0), SimOp("b", 100.0), SimOp("c", 200.0)], budget=13.0, noise=0.03)


def _spec(policy, pipe, initial=4, **options):
    specs = [OpSpec(o.name, o.num_cpus, initial=initial) for o in pipe.ops]
    return TunerSpec(f"test-{policy}", policy, pipe.budget, specs, options=options)


def _tail(trace, n=15):
    return float(np.mean([x["throughput"] / x["t_opt"] for x in trace[-n:]]))


def test_static_holds_the_config():
    pipe = _pipe()
    trace = run_controller_in_sim(pipe, _spec("static", pipe), steps=30)
    assert all(x["allocation"] == {"a": 4, "b": 4, "c": 4} for x in trace)


def test_plumber_reaches_the_optimum():
    pipe = _pipe()
    trace = run_controller_in_sim(pipe, _spec("plumber", pipe), steps=40)
    assert _tail(trace) > 0.95
    assert trace[-1]["allocation"]["b"] >= 7


def test_hill_climb_adds_where_it_helps_until_nothing_helps():
    pipe = _pipe()
    trace = run_controller_in_sim(pipe, _spec("hill_climb", pipe), steps=80)
    allocs = [x["allocation"] for x in trace]
    assert allocs[1] == {"a": 1, "b": 1, "c": 1}  # AUTOTUNE-style: starts at one slot each
    sizes = [sum(a.values()) for a in allocs]
    assert max(sizes) <= 13
    assert _tail(trace) > 0.7 and sum(allocs[-1].values()) == 13  # sqrt-like split: not the max-min optimum
    # it spends the budget, most where the latency model says (b is the most expensive)
    final = allocs[-1]
    assert final["b"] == max(final.values())


def test_oracle_measures_every_allocation_when_few():
    pipe = SimPipeline(ops=[SimOp("a", 400.0), SimOp("b", 100.0)], budget=6.0, noise=0.0)
    spec = _spec("oracle", pipe, initial=3, oracle_settle_s=1.0, oracle_measure_s=2.0, oracle_max_measured=10)
    every = enumerate_allocations(spec.ops, 6.0)
    assert len(every) == 5 and all(sum(a.values()) == 6 for a in every)
    trace = run_controller_in_sim(pipe, spec, steps=30)
    assert trace[-1]["allocation"] == {"a": 2, "b": 4} or trace[-1]["allocation"] == {"a": 1, "b": 5}
    assert _tail(trace, 5) > 0.99


def test_enumeration_is_maximal_and_within_budget():
    specs = [OpSpec("a", 1.0), OpSpec("b", 2.0), OpSpec("c", 0.5)]
    every = enumerate_allocations(specs, 6.0)
    assert every
    for a in every:
        used = a["a"] + 2 * a["b"] + 0.5 * a["c"]
        assert used <= 6.0 and used > 6.0 - 0.5
    assert enumerate_allocations([OpSpec(f"o{i}", 1.0) for i in range(8)], 60.0, limit=1000) is None


def test_neighbourhood_is_every_allocation_near_the_center_within_budget():
    specs = [OpSpec(f"o{i}", 2.0 if i == 0 else 1.0) for i in range(8)]  # too many to enumerate on 32 CPUs
    center = {s.name: 3 for s in specs}
    near = neighbourhood(specs, center, 32.0)
    assert center in near and len({tuple(sorted(a.items())) for a in near}) == len(near)
    for a in near:
        assert all(abs(a[n] - 3) <= 2 and a[n] >= 1 for n in a)
        assert 2 * a["o0"] + sum(a[f"o{i}"] for i in range(1, 8)) <= 32
    assert {"o0": 5, **{f"o{i}": 3 for i in range(1, 8)}} in near  # 31 CPUs
    assert {"o0": 5, **{f"o{i}": 4 for i in range(1, 8)}} not in near  # 38 CPUs: over the budget


def test_ray_default_never_acts():
    pipe = _pipe()
    trace = run_controller_in_sim(pipe, _spec("ray_default", pipe), steps=20)
    assert all(x["allocation"] == {"a": 4, "b": 4, "c": 4} for x in trace)


def test_controller_keeps_its_allocation_across_epochs_and_records():
    pipe = _pipe()
    spec = _spec("plumber", pipe)
    trace = run_controller_in_sim(pipe, spec, steps=30)
    ctl = Controller(spec)
    ctl.allocation = dict(trace[-1]["allocation"])
    ctl.start_epoch()
    ctl.end_epoch("succeeded")
    ctl.start_epoch()
    recs = ctl.pop_records()
    assert [r["type"] for r in recs] == ["epoch_start", "epoch_end", "epoch_start"]
    assert recs[-1]["epoch"] == 2 and recs[-1]["allocation"] == trace[-1]["allocation"]


def test_controller_masks_any_proposal_to_the_budget():
    spec = TunerSpec("m", "static", 4.0, [OpSpec("a", 1.0, initial=9), OpSpec("b", 1.0, initial=9)])
    ctl = Controller(spec)
    assert sum(ctl.allocation.values()) <= 4
    snap0 = RawSnapshot(0.0, {"a": RawOp(), "b": RawOp()}, 0.0)
    ctl.start_epoch()
    ctl.tick(snap0, budget=2.0)
    snap1 = RawSnapshot(1.0, {"a": RawOp(rows_out=10, slot_seconds=1), "b": RawOp(rows_out=10, slot_seconds=1)}, 10)
    ctl.tick(snap1, budget=2.0)
    tick = [r for r in ctl.pop_records() if r["type"] == "tick"][-1]
    assert tick["budget"] == 2.0


def test_a_pass_ended_before_its_second_tick_is_observed_at_its_end_and_a_longer_one_is_left_as_ticked():
    spec = TunerSpec("e", "auto", 4.0, [OpSpec("a", 1.0, initial=2), OpSpec("b", 1.0, initial=2)])
    ctl = Controller(spec)

    def snap(t: float, rows: int) -> RawSnapshot:
        return RawSnapshot(t, {n: RawOp(rows_out=rows, slot_seconds=2 * t) for n in ("a", "b")}, rows)

    ctl.start_epoch()
    assert ctl.tick(snap(0.0, 0), budget=4.0) is None  # the first snapshot only opens the window
    ctl.observe_at_end(snap(0.5, 400), budget=4.0)
    ctl.end_epoch("succeeded")
    recs = ctl.pop_records()
    # auto's choice is made and recorded as the execution starts, not at its first observation
    assert [r["type"] for r in recs[:2]] == ["epoch_start", "note"] and recs[1]["choice"] == "plumber"
    (tick,) = [r for r in recs if r["type"] == "tick"]
    assert tick["decision"] is None and tick["throughput"] == pytest.approx(800.0)
    assert tick["allocation"] == {"a": 2, "b": 2}
    assert [r for r in recs if r["type"] == "report"][0]["report"] is not None

    ctl.start_epoch()
    ctl.tick(snap(10.0, 1000), budget=4.0)
    ctl.tick(snap(11.0, 2000), budget=4.0)
    ctl.observe_at_end(snap(11.1, 2001), budget=4.0)  # draining: not a reading to keep
    ticks = [r for r in ctl.pop_records() if r["type"] == "tick"]
    assert [t["throughput"] for t in ticks] == [pytest.approx(1000.0)]


SHIFT_AT, WITHIN = 45, 30


# rl held at (4, 6, 3), 0.8 of the new optimum, in every seed while it moved one slot per move
# (marked xfail then); growing as far as the measured rates say each slot pays, it recovers.
@pytest.mark.parametrize("policy", ["plumber", "hill_climb", "rl", "rl_judged", "auto"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policies_re_adapt_to_a_cost_shift(policy, seed):
    # a's cost rises 8x at tick 45: the allocation that suited a cheap a, (1, 8, 4) for plumber,
    # now delivers 1/5 of the new optimum (5, 5, 3). Re-adapting = back to 95% of the new
    # optimum within 30 ticks (hill_climb re-probes every 20 s) and staying there. rl_judged: rl with
    # rl_judge_moves, which held at (1, 8, 4) on every seed, judging "2 slots of a" by what 1 slot had
    # delivered before the shift, until a count measured at less than half a smaller one's counted as one.
    pipe = _pipe()
    options = {"rl_judge_moves": True} if policy == "rl_judged" else {}
    spec = _spec(policy.removesuffix("_judged"), pipe, **options)
    trace = run_controller_in_sim(pipe, spec, steps=SHIFT_AT + WITHIN + 15, shift_at=SHIFT_AT,
                                  shift=("a", 8.0), seed=seed)
    for x in trace:  # the controller's guarantees, for any policy
        assert sum(x["allocation"].values()) <= 13 and min(x["allocation"].values()) >= 1
    share = [x["throughput"] / x["t_opt"] for x in trace]
    assert min(share[SHIFT_AT : SHIFT_AT + 2]) < 0.5  # the shift hurt: there is something to re-adapt to
    late = share[SHIFT_AT + WITHIN :]
    assert min(late) > 0.95, f"{policy} did not recover within {WITHIN} ticks: {np.round(late, 3)}," \
                             f" allocation {trace[-1]['allocation']}"
    assert trace[-1]["allocation"]["a"] > trace[SHIFT_AT - 1]["allocation"]["a"]


def test_oracle_settles_then_averages_each_candidate():
    # (2, 4) is the best allocation, 10% above (1, 5). Measured on one noisy tick right after the
    # switch, (1, 5) wins almost always: it is measured while the queue (2, 4) built drains.
    # Settling first and averaging over the window picks (2, 4).
    for seed in range(10):
        pipe = SimPipeline(ops=[SimOp("a", 400.0), SimOp("b", 110.0)], budget=6.0, noise=0.2)
        spec = _spec("oracle", pipe, initial=3, oracle_settle_s=5.0, oracle_measure_s=30.0, oracle_max_measured=10)
        trace = run_controller_in_sim(pipe, spec, steps=250, seed=seed)
        assert trace[-1]["allocation"] == {"a": 2, "b": 4}, seed


def test_oracle_remeasures_its_finalists_and_keeps_the_best_remeasured():
    # (5, 1) is the best allocation, 12% above (4, 2). Ranked on short noisy windows the pick is
    # the luckiest window (winner's curse); re-measuring the three best for longer and picking
    # from that second measurement finds (5, 1) (upstream is the bottleneck: no queue to drain).
    def wins(**options):
        n = 0
        for seed in range(10):
            pipe = SimPipeline(ops=[SimOp("a", 100.0), SimOp("b", 450.0)], budget=6.0, noise=0.5)
            spec = _spec("oracle", pipe, initial=3, oracle_settle_s=2.0, oracle_measure_s=2.0,
                         oracle_max_measured=10, **options)
            trace = run_controller_in_sim(pipe, spec, steps=200, seed=seed)
            assert trace[-1]["policy_state"].startswith("oracle: done")
            if options:
                assert any("re-measuring finalist 3/3" in x["policy_state"] for x in trace)
            n += trace[-1]["allocation"] == {"a": 5, "b": 1}
        return n

    single_pass = wins()
    with_finalists = wins(oracle_finalists=3, oracle_final_measure_s=40.0)
    assert with_finalists >= 8 and with_finalists > single_pass


def test_oracle_given_shortlist_measures_each_candidate_even_the_current_one():
    pipe = SimPipeline(ops=[SimOp("a", 400.0), SimOp("b", 100.0)], budget=6.0, noise=0.0)
    cands = [{"a": 3, "b": 3}, {"a": 2, "b": 4}, {"a": 1, "b": 5}]
    spec = _spec("oracle", pipe, initial=3, oracle_settle_s=1.0, oracle_measure_s=3.0, oracle_candidates=cands)
    trace = run_controller_in_sim(pipe, spec, steps=30)
    allocs = [x["allocation"] for x in trace]
    # the first candidate is the allocation in force; it still gets its settle + measure time
    first_switch = next(i for i, a in enumerate(allocs) if a != {"a": 3, "b": 3})
    assert first_switch >= 4
    assert allocs[-1] in ({"a": 2, "b": 4}, {"a": 1, "b": 5})


def test_oracle_waits_while_the_budget_fits_no_allocation():
    from dlrm_platform.tuner.observe import Observation
    from dlrm_platform.tuner.policies import OraclePolicy

    spec = _spec("oracle", _pipe(), initial=4, oracle_max_measured=8)
    policy = OraclePolicy(spec)
    obs = Observation(1.0, 1.0, [], 0.0, 0.0, 1e9, 0.0, 0.0)
    assert policy.decide(obs, {"a": 4, "b": 4, "c": 4}, spec.ops, 0.0) is None  # 3 minimums > 0 CPUs
    assert policy.candidates is None


def test_policy_and_operator_names_come_from_the_config() -> None:
    from typing import get_args

    from dlrm_platform import config, tuner
    from dlrm_platform.ingest import pipeline
    from dlrm_platform.tuner import spec
    from dlrm_platform.tuner.policies import POLICY_CLASSES

    assert get_args(config.TunerConfig.model_fields["policy"].annotation) == config.TUNER_POLICIES == spec.POLICIES
    assert set(POLICY_CLASSES) == set(spec.POLICIES)  # every policy the config accepts has an implementation
    assert set(spec.CONTROLLING_POLICIES) == set(spec.POLICIES) - {"ray_default"}
    assert config.OPERATOR_NAMES == ("read", "parse", "dense_transform", "sparse_transform", "batch")
    assert pipeline.OPERATOR_NAMES is config.OPERATOR_NAMES
    assert [s.name for s in tuner.operator_specs(config.IngestConfig())] == list(config.OPERATOR_NAMES)


def _records_in_sim(pipe, spec, steps):
    """A real Controller against the simulator; every record it makes (ticks, notes, reports)."""
    from dlrm_platform.tuner.simulator import NoisyCounters, PipelineSim

    rng = np.random.default_rng(0)
    spec.options.setdefault("samples_per_sink_row", pipe.samples_per_sink_row)
    ctl = Controller(spec)
    sim = PipelineSim(pipe, rng)
    sim.set_allocation(ctl.allocation)
    noise = NoisyCounters(pipe.noise, rng, 0.0)
    ctl.start_epoch()
    ctl.tick(noise(RawSnapshot(0.0, {n: RawOp() for n in pipe.names}, 0.0, 0.0, pipe.mem_limit)), pipe.budget)
    for _ in range(steps):
        new = ctl.tick(noise(sim.step(spec.interval_s)), pipe.budget)
        if new is not None:
            sim.set_allocation(new)
    ctl.end_epoch("succeeded")
    return ctl, ctl.pop_records()


def test_auto_steers_split_operators_with_plumber_and_explains_every_move():
    pipe = _pipe()
    ctl, records = _records_in_sim(pipe, _spec("auto", pipe), steps=40)
    (note,) = [r for r in records if r["type"] == "note"]
    assert note["choice"] == "plumber" and "3 operators" in note["reason"]
    assert ctl.allocation["b"] >= 7  # the optimum is (1, 8, 4), as plumber finds it
    moves = [r for r in records if r["type"] == "tick" and r["decision"]]
    assert moves
    for m in moves:
        ex = m["explanation"]
        assert ex["bottleneck"] in pipe.names and ex["expected_gain"] > 0, ex
        assert ex["bottleneck"] in ex["text"] and "expected" in ex["text"]
    assert moves[0]["explanation"]["bottleneck"] == "b"  # the 8x operator starts as the bottleneck
    (report,) = [r for r in records if r["type"] == "report"]
    assert "bottleneck:" in report["text"] and report["report"]["bottleneck"] in pipe.names


def test_auto_holds_a_fused_pipeline_and_says_why():
    pipe = SimPipeline(ops=[SimOp("read", 300.0, num_cpus=0.5)], budget=1.0, noise=0.03)
    spec = _spec("auto", pipe, initial=2)
    ctl, records = _records_in_sim(pipe, spec, steps=20)
    (note,) = [r for r in records if r["type"] == "note"]
    assert note["choice"] == "static" and "fused" in note["reason"]
    assert all(not r.get("decision") for r in records if r["type"] == "tick")
    assert ctl.allocation == {"read": 2}
    assert ctl.policy.describe() == "auto -> static"


def test_auto_re_decides_each_execution():
    from dlrm_platform.tuner.policies import AutoPolicy

    spec = TunerSpec("a", "auto", 4.0, [OpSpec("a", 1.0), OpSpec("b", 1.0)])
    policy = AutoPolicy(spec)
    obs = Observation(1.0, 1.0, [], 0.0, 0.0, 1e9, 0.0, 4.0)
    policy.decide(obs, {"a": 1}, spec.ops[:1], 4.0)
    policy.on_epoch_start(2)
    policy.decide(obs, {"a": 1, "b": 1}, spec.ops, 4.0)
    assert [n["choice"] for n in policy.pop_notes()] == ["static", "plumber"]
    assert policy.pop_notes() == []


def test_oracle_re_measures_the_allocations_it_must_beat_and_keeps_the_best():
    # its own shortlist holds only poor allocations; another policy's final one (the optimum) is a finalist
    pipe = SimPipeline(ops=[SimOp("a", 400.0), SimOp("b", 100.0)], budget=6.0, noise=0.0)
    spec = _spec("oracle", pipe, initial=3, oracle_settle_s=1.0, oracle_measure_s=2.0, oracle_final_measure_s=2.0,
                 oracle_candidates=[{"a": 5, "b": 1}, {"a": 4, "b": 2}],
                 oracle_extra_candidates=[{"a": 1, "b": 5}, {"a": 9}])  # the second names other operators: ignored
    trace = run_controller_in_sim(pipe, spec, steps=30)
    assert trace[-1]["allocation"] == {"a": 1, "b": 5}
    assert "done" in trace[-1]["policy_state"]


def _moves_and_tail(pipe_seed: int, **options) -> tuple[int, float]:
    from dlrm_platform.tuner.simulator import random_pipeline

    pipe = random_pipeline(np.random.default_rng(pipe_seed))
    pipe.noise = max(pipe.noise, 0.10)
    specs = [OpSpec(o.name, o.num_cpus, initial=max(1, int(pipe.budget // len(pipe.ops) // o.num_cpus)))
             for o in pipe.ops]
    trace = run_controller_in_sim(pipe, TunerSpec("t", "plumber", pipe.budget, specs, options=options),
                                  steps=150, seed=pipe_seed)
    allocs = [x["allocation"] for x in trace[60:]]
    return sum(a != b for a, b in zip(allocs, allocs[1:])), _tail(trace, 90)


def test_plumber_does_not_swap_between_near_equal_allocations_under_noise():
    # Without the hysteresis (noise_k 0, no memory) the LP re-plans on every window's noise. Rates per slot
    # from rows per occupied slot-second (share_window_s 0): from the workers' time per row they are too
    # steady for either to swap (1 move in 12 runs each, tuner/README.md run 53), and the hysteresis is for
    # operators whose workers' time is not told or is itself noisy.
    seeds = range(12)
    without = [_moves_and_tail(s, plumber_noise_k=0.0, plumber_memory_s=0.0, share_window_s=0) for s in seeds]
    with_ = [_moves_and_tail(s, share_window_s=0) for s in seeds]
    moves_without, moves_with = sum(m for m, _ in without), sum(m for m, _ in with_)
    assert moves_with <= 0.6 * moves_without, (moves_with, moves_without)
    # holding still costs no throughput
    assert np.mean([t for _, t in with_]) >= np.mean([t for _, t in without]) - 0.01


def test_plumber_measures_noise_and_holds_gains_below_it():
    from dlrm_platform.tuner.observe import OpObs
    from dlrm_platform.tuner.policies import PlumberPolicy

    pipe = _pipe()
    policy = PlumberPolicy(_spec("plumber", pipe))

    def obs(t: float, rates: dict[str, float]) -> Observation:
        ops = [OpObs(n, 4, 1.0, r * 4, r, 1.0, 4.0, 1.0, 0.0, 0.0, 0.0, measured=True) for n, r in rates.items()]
        return Observation(t, 1.0, ops, min(r * 4 for r in rates.values()), 0.0, 1e12, 0.0, 12.0,
                           since_change_s=t)

    # b's rate swings +-20% from window to window; a and c hold still
    for i in range(12):
        policy.mem.update(obs(3.0 + i, {"a": 100.0, "b": 100.0 * (1.2 if i % 2 else 0.8), "c": 100.0}), 0.0)
    assert policy.mem.noise["a"] == 0.0 and policy.mem.noise["b"] > 0.2
    per_slot = {"a": 200.0, "b": 100.0, "c": 200.0}  # b is the bottleneck before and after the move
    alloc = {"a": 4, "b": 4, "c": 4}
    # a move whose before/after bottleneck is the noisy b must clear about 2 x 0.58 x sqrt(2) x noise(b)
    assert 0.25 >= policy.required_gain(alloc, {"a": 3, "b": 5, "c": 4}, per_slot) > 0.2
    # one between quiet operators only needs the configured minimum
    quiet = {"a": 100.0, "b": 1000.0, "c": 100.0}
    assert policy.required_gain(alloc, {"a": 5, "b": 3, "c": 4}, quiet) == policy.min_gain


def test_held_plans_reach_the_tuner_report_through_auto():
    # auto -> plumber on a noisy 3-operator pipeline: the plans its hysteresis held back are recorded
    # (allocation, predicted and required gain, why) and listed in the run's tuner report.
    from dlrm_platform.tuner.controller import Controller
    from dlrm_platform.tuner.recorder import TunerHandle
    from dlrm_platform.tuner.simulator import NoisyCounters, PipelineSim

    pipe = SimPipeline(ops=[SimOp("a", 400.0), SimOp("b", 390.0), SimOp("c", 410.0)], budget=12.0, noise=0.15)
    spec = _spec("auto", pipe, share_window_s=0)  # rates from the noisy counters, not the workers' time
    ctl = Controller(spec)
    rng = np.random.default_rng(3)
    sim, noise = PipelineSim(pipe, rng), NoisyCounters(pipe.noise, rng)
    sim.set_allocation(ctl.allocation)
    ctl.start_epoch()
    ctl.tick(noise(RawSnapshot(0.0, {n: RawOp() for n in pipe.names}, 0.0, 0.0, pipe.mem_limit)), pipe.budget)
    for _ in range(120):
        new = ctl.tick(noise(sim.step(spec.interval_s)), pipe.budget)
        if new is not None:
            sim.set_allocation(new)
    handle = TunerHandle(spec)
    handle._cache = ctl.pop_records()
    held = handle.held()
    assert held, "near-equal operators under 15% noise: some plan must have been held back"
    assert all(h["predicted_gain"] < h["required_gain"] or h["reason"].startswith("measured") for h in held)
    assert handle.summary()["held"] == len(held)
    assert "plans held back" in handle.report() and held[-1]["reason"] in handle.report()
