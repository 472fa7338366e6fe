"""The shipped RL policy: small, loads without RLlib, acts feasibly, generalises."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dlrm_platform.tuner.actions import is_feasible
from dlrm_platform.tuner.features import OBS_DIM, FeatureState, featurize
from dlrm_platform.tuner.observe import Observation, OpObs
from dlrm_platform.tuner.rl import META, PRETRAINED_DIR, WEIGHTS, RLPolicyRunner, resolve_policy_path
from dlrm_platform.tuner.simulator import SimOp, SimPipeline, run_controller_in_sim
from dlrm_platform.tuner.spec import OpSpec, TunerSpec


def test_shipped_policy_is_small_and_described():
    w = PRETRAINED_DIR / WEIGHTS
    assert w.exists() and w.stat().st_size < 300 * 1024
    meta = json.loads((PRETRAINED_DIR / META).read_text())
    assert "PPO" in meta["algorithm"] and meta["hidden"] > 0
    assert resolve_policy_path(None) == w


def test_missing_policy_path_is_a_user_error(tmp_path):
    from dlrm_platform.errors import UserError

    with pytest.raises(UserError, match="tuner train"):
        resolve_policy_path(tmp_path / "nope")


def _obs(caps, alloc, thr):
    ops = [OpObs(n, alloc[n], 1.0, thr, caps[n] / alloc[n], 1.0, alloc[n] * 0.9, 0.9, 0.0, 2.0, 1e6,
                 capacity=caps[n]) for n in alloc]
    return Observation(10.0, 3.0, ops, thr, 1e7, 1e9, 0.0, float(sum(alloc.values())),
                       extra={"sink_factors": [1.0] * len(ops)})


def test_acting_is_feasible_and_deterministic():
    runner = RLPolicyRunner.load()
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    alloc = {"a": 4, "b": 4, "c": 4}
    obs = _obs({"a": 4000.0, "b": 500.0, "c": 2000.0}, alloc, 500.0)
    outs = []
    for _ in range(2):
        fs = FeatureState(["a", "b", "c"])
        new, what = runner.act(obs, alloc, specs, 12.0, fs)
        outs.append((new, what))
    assert outs[0] == outs[1]
    vec, mask = featurize(obs, alloc, specs, 12.0, FeatureState(["a", "b", "c"]))
    assert vec.shape == (OBS_DIM,) and vec.dtype == np.float32
    new = outs[0][0] or alloc
    assert is_feasible(new, specs, 12.0)
    # b is the bottleneck: a sensible policy never takes a slot from it
    assert new["b"] >= alloc["b"]


def test_features_do_not_depend_on_absolute_speed():
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0)]
    alloc = {"a": 3, "b": 5}
    slow = _obs({"a": 900.0, "b": 700.0}, alloc, 700.0)
    fast = _obs({"a": 90_000.0, "b": 70_000.0}, alloc, 70_000.0)
    v1, _ = featurize(slow, alloc, specs, 8.0, FeatureState(["a", "b"]))
    v2, _ = featurize(fast, alloc, specs, 8.0, FeatureState(["a", "b"]))
    assert np.allclose(v1, v2)


@pytest.mark.parametrize("mus,budget", [((900.0, 120.0), 12.0), ((800.0, 100.0, 200.0, 400.0, 1600.0, 300.0, 250.0), 30.0)])
def test_shipped_policy_improves_unseen_pipelines_in_simulation(mus, budget):
    pipe = SimPipeline(ops=[SimOp(f"op{i}", m) for i, m in enumerate(mus)], budget=budget, noise=0.04)
    per = int(budget // len(mus))
    specs = [OpSpec(o.name, 1.0, initial=per) for o in pipe.ops]
    start = pipe.throughput({s.name: per for s in specs})
    trace = run_controller_in_sim(replace(pipe), TunerSpec("rl-test", "rl", budget, specs), steps=70)
    _, t_opt = pipe.optimum()
    tail = float(np.mean([x["throughput"] for x in trace[-15:]]))
    assert tail > 1.2 * start
    assert tail > 0.85 * t_opt


def test_rl_holds_until_the_operators_it_moved_have_been_measured_again():
    from dlrm_platform.tuner.policies import RLPolicy

    class MovesOneSlotToB:  # stands in for the net: the gate is what is under test
        calls = 0

        def act(self, obs, alloc, specs, budget, fs):
            self.calls += 1
            return {**alloc, "a": alloc["a"] - 1, "b": alloc["b"] + 1}, "+1 b"

    specs = [OpSpec("a", 1.0, initial=4), OpSpec("b", 1.0, initial=4), OpSpec("c", 1.0, initial=4)]
    policy = RLPolicy(TunerSpec("rl-gate", "rl", 12.0, specs))
    policy.runner = runner = MovesOneSlotToB()
    alloc = {"a": 4, "b": 4, "c": 4}
    obs = _obs({"a": 4000.0, "b": 500.0, "c": 2000.0}, alloc, 500.0)
    new = policy.decide(replace(obs, since_change_s=30.0), dict(alloc), specs, 12.0)
    assert new == {"a": 3, "b": 5, "c": 4} and runner.calls == 1
    # long after the move, but b (moved) has finished nothing since: hold without asking the net
    only_a = replace(obs, since_change_s=10.0, ops=[replace(o, measured=o.name == "a") for o in obs.ops])
    assert policy.decide(only_a, dict(new), specs, 12.0) is None and runner.calls == 1
    assert "measuring the last move" in policy.describe()
    # both measured, but too soon after the move to trust: hold
    both = [replace(o, measured=o.name in ("a", "b")) for o in obs.ops]
    assert policy.decide(replace(obs, since_change_s=0.5, ops=both), dict(new), specs, 12.0) is None
    assert runner.calls == 1
    # every moved operator measured under its new slots: the net is asked again
    policy.decide(replace(obs, since_change_s=5.0, ops=both), dict(new), specs, 12.0)
    assert runner.calls == 2
