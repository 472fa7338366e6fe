"""Offline pretraining of the RL tuner: RLlib PPO (new API stack) in the simulator.

``dlrm-platform tuner train`` calls :func:`train_policy`. The policy network is
``nets.PerOpPolicyNet`` inside an RLlib ``TorchRLModule``; after training its
weights are exported to a plain torch ``state_dict`` (``policy.pt``, tens of
KB) plus ``policy.json`` describing the run, because an RLlib checkpoint is
megabytes and seconds to restore, while acting needs one small forward pass.

Episodes come from random pipelines (2-8 operators, 30x cost spread, filters,
packing, saturating operators, slow-starting slots, trainer-bound phases) and,
when a profile of a real pipeline is given, from jittered copies of it; half
of the episodes shift one operator's cost mid-way so the policy learns to
re-adapt.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from dlrm_platform.tuner.rl import META, WEIGHTS

log = logging.getLogger(__name__)


def _module_class():
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis import ValueFunctionAPI
    from ray.rllib.core.rl_module.torch import TorchRLModule

    from dlrm_platform.tuner.nets import PerOpPolicyNet

    class TunerRLModule(TorchRLModule, ValueFunctionAPI):
        """RLlib wrapper of ``PerOpPolicyNet`` (masked logits + value)."""

        def setup(self):
            self.net = PerOpPolicyNet(hidden=int(self.model_config.get("hidden", 64)))

        def _forward(self, batch, **kwargs):
            logits, _ = self.net(batch[Columns.OBS])
            return {Columns.ACTION_DIST_INPUTS: logits}

        def _forward_train(self, batch, **kwargs):
            logits, value = self.net(batch[Columns.OBS])
            return {Columns.ACTION_DIST_INPUTS: logits, Columns.EMBEDDINGS: value}

        def compute_values(self, batch, embeddings=None):
            if embeddings is not None:
                return embeddings
            _, value = self.net(batch[Columns.OBS])
            return value

    return TunerRLModule


def evaluate_net(net, n_pipelines: int = 12, steps: int = 90, seed: int = 123) -> dict:
    """Mean share of the optimum the policy reaches over its last 20 steps, on random
    simulated pipelines (half with a mid-run cost shift), next to the plumber policy."""
    import torch

    from dlrm_platform.tuner.features import FeatureState
    from dlrm_platform.tuner.rl import RLPolicyRunner
    from dlrm_platform.tuner.simulator import initial_allocation, random_pipeline, run_controller_in_sim
    from dlrm_platform.tuner.spec import TunerSpec

    rng = np.random.default_rng(seed)
    runner = RLPolicyRunner(net)
    del FeatureState, torch
    scores: dict[str, list[float]] = {"rl": [], "plumber": [], "static": []}
    for i in range(n_pipelines):
        pipe_seed = int(rng.integers(1 << 30))
        shift = i % 2 == 1
        for pol in scores:
            prng = np.random.default_rng(pipe_seed)
            pipe = random_pipeline(prng)
            init = initial_allocation(pipe, prng, "even")
            spec = TunerSpec(f"eval-{i}", pol, pipe.budget, pipe.specs(init))
            shift_op = pipe.ops[int(prng.integers(len(pipe.ops)))].name
            if pol == "rl":
                import dlrm_platform.tuner.rl as rlmod

                orig = rlmod.RLPolicyRunner.load
                rlmod.RLPolicyRunner.load = classmethod(lambda cls, path=None: runner)
                try:
                    trace = run_controller_in_sim(pipe, spec, steps=steps, seed=i,
                                                  shift_at=steps // 2 if shift else None,
                                                  shift=(shift_op, 2.0) if shift else None)
                finally:
                    rlmod.RLPolicyRunner.load = orig
            else:
                trace = run_controller_in_sim(pipe, spec, steps=steps, seed=i,
                                              shift_at=steps // 2 if shift else None,
                                              shift=(shift_op, 2.0) if shift else None)
            tail = trace[-20:]
            scores[pol].append(float(np.mean([min(x["throughput"] / x["t_opt"], 1.0) for x in tail])))
    return {k: float(np.mean(v)) for k, v in scores.items()}


def train_policy(
    out_dir: str | Path,
    *,
    iterations: int = 60,
    profile: dict | None = None,
    seed: int = 0,
    hidden: int = 64,
    train_batch: int = 4000,
    lr: float = 5e-4,
    num_envs: int = 8,
    evaluate: bool = True,
    progress=print,
) -> dict:
    """Train with PPO in the simulator and export ``policy.pt`` + ``policy.json`` to ``out_dir``.

    Needs a running Ray (``ray.init``) - callers are entry points.
    """
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from dlrm_platform.tuner.simulator import EnvConfig, make_env_class

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_cls = make_env_class()
    env_config = {"seed": seed, "profile": profile, "episode_steps": 80}
    config = (
        PPOConfig()
        .environment(env_cls, env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs, rollout_fragment_length="auto")
        .training(
            lr=lr,
            gamma=0.9,
            lambda_=0.9,
            train_batch_size_per_learner=train_batch,
            minibatch_size=256,
            num_epochs=6,
            entropy_coeff=0.01,
            vf_loss_coeff=0.5,
            clip_param=0.2,
        )
        .rl_module(rl_module_spec=RLModuleSpec(module_class=_module_class(), model_config={"hidden": hidden}))
        .debugging(seed=seed)
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    algo = config.build_algo()
    t0 = time.time()
    history = []
    for it in range(iterations):
        res = algo.train()
        er = res.get("env_runners", {})
        ret = er.get("episode_return_mean")
        steps = res.get("num_env_steps_sampled_lifetime") or er.get("num_env_steps_sampled_lifetime")
        history.append({"iteration": it + 1, "episode_return_mean": ret, "env_steps": steps,
                        "seconds": time.time() - t0})
        if progress and (it % 5 == 4 or it == iterations - 1):
            progress(f"iteration {it + 1}/{iterations}: mean episode return {ret}, env steps {steps},"
                     f" {time.time() - t0:.0f} s")
    module = algo.get_module()
    state = {k: v.detach().cpu() for k, v in module.net.state_dict().items()}
    torch.save(state, out / WEIGHTS)
    from dlrm_platform.tuner.nets import PerOpPolicyNet

    net = PerOpPolicyNet(hidden=hidden)
    net.load_state_dict(state)
    net.eval()
    scores = evaluate_net(net) if evaluate else {}
    meta = {
        "format": "dlrm_platform.tuner PerOpPolicyNet state_dict",
        "hidden": hidden,
        "algorithm": "RLlib PPO (new API stack)",
        "ray_version": __import__("ray").__version__,
        "iterations": iterations,
        "train_batch": train_batch,
        "env_steps": history[-1]["env_steps"] if history else 0,
        "seconds": time.time() - t0,
        "seed": seed,
        "profile": profile,
        "env": {k: v for k, v in EnvConfig().__dict__.items() if k not in ("profile", "extra")},
        "final_episode_return_mean": history[-1]["episode_return_mean"] if history else None,
        "sim_eval_share_of_optimum": scores,
        "history": history,
    }
    (out / META).write_text(json.dumps(meta, indent=1, default=float))
    algo.stop()
    return meta
