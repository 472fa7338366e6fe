"""Offline training of the RL tuner (``rl_train.train_policy``) end to end, on a tiny budget:
DAgger imitation, RLlib PPO, the export to a plain state_dict, and loading it to act."""

from __future__ import annotations

import json

import pytest
import torch

from dlrm_platform.tuner.nets import PerOpPolicyNet
from dlrm_platform.tuner.rl import META, WEIGHTS, RLPolicyRunner
from dlrm_platform.tuner.rl_train import imitation_pretrain, train_policy


@pytest.fixture(scope="module")
def local_ray():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    if started:
        ray.shutdown()


def test_train_policy_imitates_then_ppo_and_exports_a_loadable_policy(tmp_path, local_ray):
    out = tmp_path / "policy"
    lines: list[str] = []
    meta = train_policy(out, iterations=1, imitation_rounds=1, imitation_steps=200, hidden=16,
                        train_batch=160, num_envs=1, evaluate=False, progress=lines.append)
    # both phases ran and said so
    assert any(line.startswith("imitation round 1/1") for line in lines)
    assert any(line.startswith("PPO iteration 1/1") for line in lines)
    assert meta["phases"]["imitation"]["steps"] == 200 and meta["phases"]["ppo"]["iterations"] == 1
    assert meta["ppo"]["history"][0]["env_steps"] >= 160
    assert json.loads((out / META).read_text())["hidden"] == 16
    assert not (out / "imitation.pt").exists()  # the intermediate file is cleaned up
    # the weights are PPO's, not the imitation warm start's: PPO's update moved them
    state = torch.load(out / WEIGHTS, weights_only=True)
    torch.manual_seed(0)
    warm = imitation_pretrain(rounds=1, steps_per_round=200, hidden=16, seed=0, progress=None).state_dict()
    assert state.keys() == warm.keys()
    assert any(not torch.equal(state[k], warm[k]) for k in state)
    # the exported pair is what a job loads through tuner.policy_path
    runner = RLPolicyRunner.load(out)
    assert isinstance(runner.net, PerOpPolicyNet) and runner.net.hidden == 16
    assert all(torch.equal(runner.net.state_dict()[k], state[k]) for k in state)
    ref = meta["reference_outputs"]  # recorded with the weights: what test_rl_policy checks for the shipped pair
    with torch.no_grad():
        logits, _ = runner.net(torch.tensor(ref["obs"]))
    assert torch.allclose(logits, torch.tensor(ref["logits"]), atol=1e-4)


def test_imitation_alone_learns_the_teacher():
    """A few DAgger rounds fit the privileged teacher far better than an untrained net does."""
    from dlrm_platform.tuner.rl_train import teacher_action
    from dlrm_platform.tuner.simulator import EnvConfig, make_env_class

    net = imitation_pretrain(rounds=3, steps_per_round=600, hidden=32, seed=1, progress=None)
    torch.manual_seed(1)
    untrained = PerOpPolicyNet(hidden=32).eval()

    def agreement(model) -> float:
        env = make_env_class()(EnvConfig(seed=99))
        vec, _ = env.reset(seed=99)
        hits = 0
        for _ in range(400):
            a_t = teacher_action(env)
            with torch.no_grad():
                a = int(torch.argmax(model(torch.as_tensor(vec).unsqueeze(0))[0][0]))
            hits += a == a_t
            vec, _, _, trunc, _ = env.step(a_t)
            if trunc:
                vec, _ = env.reset()
        return hits / 400

    trained, chance = agreement(net), agreement(untrained)
    assert trained > 0.6 and trained > chance + 0.2, (trained, chance)
