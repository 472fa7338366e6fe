"""The pipeline simulator: steady state, saturation, lag, memory, the gym API."""

from __future__ import annotations

import numpy as np

from dlrm_platform.tuner.actions import N_ACTIONS
from dlrm_platform.tuner.features import OBS_DIM
from dlrm_platform.tuner.simulator import (
    EnvConfig,
    PipelineSim,
    SimOp,
    SimPipeline,
    make_env_class,
    random_pipeline,
    run_controller_in_sim,
)
from dlrm_platform.tuner.spec import OpSpec, TunerSpec


def _pipe(**kw):
    ops = [SimOp("a", 1000.0), SimOp("b", 250.0), SimOp("c", 500.0)]
    return SimPipeline(ops=ops, budget=7.0, noise=0.0, **kw)


def test_steady_state_throughput_is_the_slowest_operator():
    pipe = _pipe()
    sim = PipelineSim(pipe, np.random.default_rng(0))
    alloc = {"a": 1, "b": 4, "c": 2}
    sim.set_allocation(alloc)
    for _ in range(20):
        snap = sim.step(1.0)
    before = snap.sink_rows
    for _ in range(10):
        snap = sim.step(1.0)
    assert abs((snap.sink_rows - before) / 10 - 1000.0) < 1.0
    assert pipe.throughput(alloc) == 1000.0


def test_optimum_matches_exhaustive_search():
    pipe = _pipe()
    best = max(((a, b, c) for a in range(1, 6) for b in range(1, 6) for c in range(1, 6) if a + b + c <= 7),
               key=lambda n: pipe.throughput(dict(zip("abc", n))))
    _, t = pipe.optimum()
    assert np.isclose(t, pipe.throughput(dict(zip("abc", best))))


def test_saturating_operator_stops_scaling():
    op = SimOp("io", 100.0, sat=4.0)
    assert op.n_eff(2) > 1.9
    assert op.n_eff(16) < 4.01 and op.n_eff(16) > 3.9


def test_added_slots_start_after_their_lag():
    pipe = SimPipeline(ops=[SimOp("a", 100.0, lag=2.0)], budget=4.0, noise=0.0)
    sim = PipelineSim(pipe, np.random.default_rng(0))
    sim.set_allocation({"a": 1})
    sim.step(1.0)
    sim.set_allocation({"a": 3})
    sim.step(1.0)
    assert sim.active["a"] == 1
    sim.step(1.5)
    assert sim.active["a"] == 3


def test_memory_guard_bounds_queues():
    pipe = SimPipeline(ops=[SimOp("fast", 10_000.0), SimOp("slow", 10.0)], budget=4.0, noise=0.0,
                       row_bytes=100.0, mem_limit=1e6)
    sim = PipelineSim(pipe, np.random.default_rng(0))
    sim.set_allocation({"fast": 3, "slow": 1})
    for _ in range(30):
        snap = sim.step(1.0)
    assert snap.mem_used <= 1.05 * pipe.mem_limit


def test_gym_env_contract_and_determinism():
    Env = make_env_class()
    env = Env(EnvConfig(seed=3, episode_steps=12))
    obs, _ = env.reset(seed=3)
    assert obs.shape == (OBS_DIM,) and env.action_space.n == N_ACTIONS
    assert env.observation_space.contains(np.clip(obs, -2, 2))
    traj = []
    for _ in range(12):
        a = int(np.flatnonzero(env.mask)[-1])
        obs, r, term, trunc, info = env.step(a)
        traj.append(round(r, 6))
        assert -3.0 <= r <= 1.0
    assert trunc and not term
    env2 = Env(EnvConfig(seed=3, episode_steps=12))
    env2.reset(seed=3)
    traj2 = [round(env2.step(int(np.flatnonzero(env2.mask)[-1]))[1], 6) for _ in range(12)]
    assert traj == traj2


def test_random_pipelines_are_valid():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = random_pipeline(rng)
        assert 2 <= len(p.ops) <= 8
        assert sum(o.num_cpus for o in p.ops) <= p.budget
        _, t = p.optimum()
        assert t > 0


def test_the_issue_mix_draws_what_the_policy_must_generalize_over():
    """3-8 operators, costs up to 50x apart, storage-bound reads, filters and expanding operators."""
    from dlrm_platform.tuner.simulator import PIPELINE_MIXES

    pipes = [random_pipeline(np.random.default_rng(s), mix="issue11") for s in range(400)]
    assert {len(p.ops) for p in pipes} == set(range(3, 9))
    sec_per_block = [1000.0 * o.ratio / o.mu for p in pipes for o in p.ops]
    assert max(sec_per_block) / min(sec_per_block) > 30
    assert all(max(s) / min(s) <= PIPELINE_MIXES["issue11"].cost_span + 1e-6
               for s in ([1000.0 * o.ratio / o.mu for o in p.ops] for p in pipes))
    assert sum(p.ops[0].sat is not None and p.ops[0].sat <= 6 for p in pipes) > 80  # storage channels
    assert sum(any(1.5 <= o.ratio <= 4 for o in p.ops) for p in pipes) > 40       # expanding
    assert sum(any(0.5 <= o.ratio < 1 for o in p.ops) for p in pipes) > 40        # filters
    for p in pipes:
        assert sum(o.num_cpus for o in p.ops) <= p.budget and p.optimum()[1] > 0
    # the first mix (the shipped policy's first training and evaluation): 2-8 operators, ~30x, no expanding
    v1 = [random_pipeline(np.random.default_rng(s), mix="v1") for s in range(200)]
    assert min(len(p.ops) for p in v1) == 2
    assert not any(o.ratio > 1 for p in v1 for o in p.ops)
    assert all(max(s) / min(s) <= 30 + 1e-6 for s in ([1000.0 * o.ratio / o.mu for o in p.ops] for p in v1))


def test_a_warming_operator_runs_slower_for_its_first_seconds_then_at_its_rate():
    """``run_controller_in_sim(warmup=...)``: the live start, where workers still warm up after the first
    rows (an operator at a share of its rate for the first seconds); the pipeline is left warm."""
    def pipe() -> SimPipeline:
        return SimPipeline(ops=[SimOp("a", 4000.0), SimOp("b", 1000.0)], budget=4.0, lumpy=False)

    specs = [OpSpec("a", 1.0, initial=1), OpSpec("b", 1.0, initial=2)]
    warming = pipe()
    slow = run_controller_in_sim(warming, TunerSpec("w", "static", 4.0, specs), steps=20, warmup={"b": (0.25, 8.0)})
    warm = run_controller_in_sim(pipe(), TunerSpec("w", "static", 4.0, specs), steps=20)
    assert max(x["throughput"] for x in slow[:7]) <= 0.3 * warm[5]["throughput"]
    assert slow[-1]["throughput"] == warm[-1]["throughput"] == 2000.0
    assert [o.mu for o in warming.ops] == [4000.0, 1000.0]
