"""Offline pretraining of the RL tuner: RLlib PPO (new API stack) in the simulator.

``dlrm-platform tuner train`` calls :func:`train_policy`. The policy network is
``nets.PerOpPolicyNet`` inside an RLlib ``TorchRLModule``; after training its
weights are exported to a plain torch ``state_dict`` (``policy.pt``, tens of
KB) plus ``policy.json`` describing the run, because an RLlib checkpoint is
megabytes and seconds to restore, while acting needs one small forward pass.

Episodes come from random pipelines of a mix (``simulator.PIPELINE_MIXES``; the
default is the issue's: 3-8 operators, costs up to 50x apart, storage-bound reads,
filters, expanding operators, packing, slow-starting slots, trainer-bound phases)
and, when a profile of a real pipeline is given, from jittered copies of it; half
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
from dlrm_platform.tuner.simulator import DEFAULT_MIX

log = logging.getLogger(__name__)


def _module_class():
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis import ValueFunctionAPI
    from ray.rllib.core.rl_module.torch import TorchRLModule

    from dlrm_platform.tuner.nets import PerOpPolicyNet

    class TunerRLModule(TorchRLModule, ValueFunctionAPI):
        """RLlib wrapper of ``PerOpPolicyNet`` (masked logits + value)."""

        def setup(self):
            import torch

            self.net = PerOpPolicyNet(hidden=int(self.model_config.get("hidden", 64)))
            init = self.model_config.get("init_state_path")
            if init:
                self.net.load_state_dict(torch.load(init, map_location="cpu", weights_only=True))

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


def evaluate_net(net, n_pipelines: int = 12, steps: int = 90, seed: int = 123, mix: str = DEFAULT_MIX) -> dict:
    """Mean share of the optimum the policy reaches over its last 20 steps, on random
    simulated pipelines (half with a mid-run cost shift), next to the plumber policy."""
    from dlrm_platform.tuner.rl import RLPolicyRunner

    res = evaluate_policies({"rl": RLPolicyRunner(net)}, n_pipelines=n_pipelines, steps=steps, seed=seed, mix=mix)
    return {k: v["mean"] for k, v in res["policies"].items()}


def ablation_runners(net=None, *, hidden: int = 64, seed: int = 0) -> dict:
    """The learned policy and what it must beat, all behind the same gates and shield:
    ``net`` (the shipped policy when None), ``no_net`` (the first "+1" the shield allows,
    else hold) and ``random_net`` (an untrained ``PerOpPolicyNet``, seeded)."""
    import torch

    from dlrm_platform.tuner.nets import PerOpPolicyNet
    from dlrm_platform.tuner.rl import NoNetRunner, RLPolicyRunner

    if net is None:
        shipped = RLPolicyRunner.load()
        net, hidden = shipped.net, shipped.net.hidden
    torch.manual_seed(seed)
    random_net = PerOpPolicyNet(hidden=hidden).eval()
    return {"net": RLPolicyRunner(net), "no_net": NoNetRunner(), "random_net": RLPolicyRunner(random_net)}


def evaluate_policies(
    runners: dict,
    *,
    baselines: tuple[str, ...] = ("plumber", "static"),
    n_pipelines: int = 12,
    steps: int = 90,
    seed: int = 123,
    tail: int = 20,
    mix: str = DEFAULT_MIX,
    rl_options: dict | None = None,
) -> dict:
    """Every RL runner (``{name: RLPolicyRunner}``, acting through the ``rl`` policy with its
    evidence gate and shield, and ``rl_options``) and every baseline policy on the same random simulated
    pipelines: ``n_pipelines`` drawn from ``seed`` (training draws from other seeds), every
    second one with an operator's cost doubled half-way. Score of a run: the mean share of
    the optimum over its last ``tail`` steps. Returns per policy the mean, the means over
    the steady and the shifted pipelines, the per-pipeline scores (paired across policies),
    and for the runners how often the gate held and the shield vetoed the net's own choice."""
    from dlrm_platform.tuner.simulator import initial_allocation, random_pipeline, run_controller_in_sim
    from dlrm_platform.tuner.spec import TunerSpec

    rng = np.random.default_rng(seed)
    keys = {name: r.register(f"<in-memory {name} {id(r)}>") for name, r in runners.items()}
    for r in runners.values():
        r.stats = dict.fromkeys(r.stats, 0)
    policies = [*runners, *baselines]
    scores: dict[str, list[float]] = {p: [] for p in policies}
    held = dict.fromkeys(runners, 0)
    ticks = dict.fromkeys(runners, 0)
    shifted: list[bool] = []
    for i in range(n_pipelines):
        pipe_seed = int(rng.integers(1 << 30))
        shift = i % 2 == 1
        shifted.append(shift)
        for pol in policies:
            prng = np.random.default_rng(pipe_seed)
            pipe = random_pipeline(prng, mix=mix)
            init = initial_allocation(pipe, prng, "even")
            kind = "rl" if pol in runners else pol
            spec = TunerSpec(f"eval-{i}", kind, pipe.budget, pipe.specs(init), policy_path=keys.get(pol),
                             options=dict(rl_options or {}) if pol in runners else {})
            shift_op = pipe.ops[int(prng.integers(len(pipe.ops)))].name
            trace = run_controller_in_sim(pipe, spec, steps=steps, seed=i,
                                          shift_at=steps // 2 if shift else None,
                                          shift=(shift_op, 2.0) if shift else None)
            scores[pol].append(float(np.mean([min(x["throughput"] / x["t_opt"], 1.0) for x in trace[-tail:]])))
            if pol in runners:
                ticks[pol] += len(trace)
                held[pol] += sum("measuring the last move" in x["policy_state"] for x in trace)
    mask = np.array(shifted)
    out: dict = {"n_pipelines": n_pipelines, "steps": steps, "seed": seed, "tail": tail, "mix": mix, "policies": {}}
    for pol, v in scores.items():
        a = np.array(v)
        row = {"mean": float(a.mean()), "steady": float(a[~mask].mean()) if (~mask).any() else None,
               "shifted": float(a[mask].mean()) if mask.any() else None, "per_pipeline": [float(x) for x in a]}
        if pol in runners:
            st = runners[pol].stats
            row["gate_hold_share"] = held[pol] / max(ticks[pol], 1)
            row["asked_share"] = st["asked"] / max(ticks[pol], 1)
            row["veto_share_of_wanted_moves"] = st["vetoed"] / max(st["moves_wanted"], 1)
        out["policies"][pol] = row
    return out


def paired_difference(a: list[float], b: list[float]) -> dict:
    """Mean of the per-pipeline differences a - b, its standard error, and a's wins/losses
    (differences within 0.001 count as ties)."""
    d = np.asarray(a) - np.asarray(b)
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se, "wins": int((d > 1e-3).sum()), "losses": int((d < -1e-3).sum()),
            "ties": int((abs(d) <= 1e-3).sum())}


def reference_outputs(net, n: int = 12, seed: int = 2024) -> dict:
    """``n`` observations of simulated pipelines (a teacher rollout from ``seed``) and the
    net's logits on them, recorded in ``policy.json`` next to the weights: loading the
    weights must reproduce them (``tests/tuner/test_rl_policy.py``)."""
    import torch

    from dlrm_platform.tuner.simulator import EnvConfig, make_env_class

    env = make_env_class()(EnvConfig(seed=seed))
    vec, _ = env.reset(seed=seed)
    obs = []
    for i in range(5 * n):
        if i % 5 == 0:
            obs.append(np.asarray(vec, dtype=np.float32).copy())
        vec, _, _, trunc, _ = env.step(teacher_action(env))
        if trunc:
            vec, _ = env.reset()
    with torch.no_grad():
        logits, _ = net(torch.as_tensor(np.stack(obs)))
    return {"seed": seed, "obs": [[float(x) for x in v] for v in obs],
            "logits": [[float(x) for x in row] for row in logits.numpy()],
            "actions": [int(a) for a in logits.argmax(-1)]}


def teacher_action(env) -> int:
    """A privileged teacher: it knows the simulated pipeline's true costs.

    It takes the valid action that raises the true throughput most; on a plateau
    (two operators tied as bottleneck) it moves toward the true optimum; at
    (near) the optimum it holds."""
    from dlrm_platform.tuner.actions import K_MAX, grow_while_it_pays

    pipe, alloc, specs = env.pipe, env.alloc, env.specs
    now = pipe.throughput(alloc)
    if now >= 0.985 * env.t_opt:
        return 0
    caps = {o.name: o.capacity for o in env.last_obs.ops}
    best_a, best = 0, now
    for a in np.flatnonzero(env.mask):
        if a == 0:
            continue
        thr = pipe.throughput(grow_while_it_pays(int(a), alloc, specs, pipe.budget, caps,
                                                 max_slots=env.cfg.move_slots,
                                                 memory_bound=env.last_obs.at_memory_limit))
        if thr > best * 1.0005:
            best_a, best = int(a), thr
    if best_a:
        return best_a
    target = env.opt_alloc
    deficits = [(target[s.name] - alloc[s.name], k) for k, s in enumerate(specs)]
    for d, k in sorted(deficits, reverse=True):
        if d > 0 and env.mask[1 + k]:
            return 1 + k
    for d, k in sorted(deficits):
        if d < 0 and env.mask[1 + K_MAX + k] and now >= 0.95 * env.t_opt:
            return 1 + K_MAX + k
    return 0


def imitation_pretrain(
    *,
    rounds: int = 6,
    steps_per_round: int = 5000,
    hidden: int = 64,
    seed: int = 0,
    profile: dict | None = None,
    gamma: float = 0.9,
    mix: str = DEFAULT_MIX,
    progress=print,
):
    """DAgger: roll out (teacher with probability beta, else the student), label every
    visited state with the teacher's action, fit the student (cross-entropy on the
    masked logits) and its value head (discounted returns). Returns the net."""
    import torch

    from dlrm_platform.tuner.nets import PerOpPolicyNet
    from dlrm_platform.tuner.simulator import EnvConfig, make_env_class

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    env = make_env_class()(EnvConfig(seed=seed, profile=profile, mix=mix))
    net = PerOpPolicyNet(hidden=hidden)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xs: list[np.ndarray] = []
    ys: list[int] = []
    rets: list[float] = []
    t0 = time.time()
    for r in range(rounds):
        beta = 0.5 ** r
        vec, _ = env.reset(seed=int(rng.integers(1 << 30)))
        ep_x, ep_y, ep_r = [], [], []
        agree = 0
        for _ in range(steps_per_round):
            a_t = teacher_action(env)
            if rng.random() < beta:
                a_exec = a_t
            else:
                with torch.no_grad():
                    logits, _ = net(torch.as_tensor(vec).unsqueeze(0))
                a_exec = int(torch.argmax(logits[0]))
            agree += int(a_exec == a_t)
            ep_x.append(vec)
            ep_y.append(a_t)
            vec, rew, _, trunc, _ = env.step(a_exec)
            ep_r.append(rew)
            if trunc:
                g = 0.0
                returns = []
                for x in reversed(ep_r):
                    g = x + gamma * g
                    returns.append(g)
                xs.extend(ep_x)
                ys.extend(ep_y)
                rets.extend(reversed(returns))
                ep_x, ep_y, ep_r = [], [], []
                vec, _ = env.reset(seed=int(rng.integers(1 << 30)))
        x = torch.as_tensor(np.stack(xs))
        y = torch.as_tensor(np.array(ys), dtype=torch.long)
        g = torch.as_tensor(np.array(rets), dtype=torch.float32)
        n = len(y)
        for _ in range(4):
            perm = torch.randperm(n)
            for i in range(0, n, 512):
                idx = perm[i:i + 512]
                logits, value = net(x[idx])
                loss = torch.nn.functional.cross_entropy(logits, y[idx]) + 0.5 * torch.mean((value - g[idx]) ** 2)
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            logits, _ = net(x)
            acc = float((logits.argmax(-1) == y).float().mean())
        if progress:
            progress(f"imitation round {r + 1}/{rounds}: {n} labelled states, student agrees with teacher"
                     f" {acc:.0%} (executed {agree / steps_per_round:.0%} teacher-equal), {time.time() - t0:.0f} s")
    net.eval()
    return net


def train_policy(
    out_dir: str | Path,
    *,
    iterations: int = 15,
    imitation_rounds: int = 16,
    imitation_steps: int = 8000,
    profile: dict | None = None,
    seed: int = 1,
    hidden: int = 64,
    train_batch: int = 4000,
    lr: float = 3e-5,
    num_envs: int = 8,
    mix: str = DEFAULT_MIX,
    evaluate: bool = True,
    init_state: str | Path | None = None,
    progress=print,
) -> dict:
    """Imitation warm start, then RLlib PPO fine-tuning in the simulator; export
    ``policy.pt`` + ``policy.json`` to ``out_dir``. PPO needs a running Ray
    (``ray.init``) - callers are entry points."""
    import torch

    from dlrm_platform.tuner.nets import PerOpPolicyNet
    from dlrm_platform.tuner.simulator import PIPELINE_MIXES, EnvConfig, make_env_class

    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    phases: dict = {}
    init_path = None
    if init_state is not None:  # continue from given weights instead of imitating again
        init_path = out / "imitation.pt"
        torch.save(torch.load(init_state, map_location="cpu", weights_only=True), init_path)
        phases["init"] = {"from": str(init_state)}
    elif imitation_rounds > 0:
        net = imitation_pretrain(rounds=imitation_rounds, steps_per_round=imitation_steps, hidden=hidden,
                                 seed=seed, profile=profile, mix=mix, progress=progress)
        init_path = out / "imitation.pt"
        torch.save(net.state_dict(), init_path)
        phases["imitation"] = {"rounds": imitation_rounds, "steps": imitation_rounds * imitation_steps,
                               "seconds": time.time() - t0}
        if evaluate:
            phases["imitation"]["sim_eval"] = evaluate_net(net, mix=mix)
            if progress:
                progress(f"after imitation: {phases['imitation']['sim_eval']}")
    history = []
    state = None
    if iterations > 0:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        model_config = {"hidden": hidden}
        if init_path is not None:
            model_config["init_state_path"] = str(init_path)
        config = (
            PPOConfig()
            .environment(make_env_class(), env_config={"seed": seed, "profile": profile, "episode_steps": 80,
                                                       "mix": mix})
            .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs, rollout_fragment_length="auto")
            .training(
                lr=lr,
                gamma=0.9,
                lambda_=0.9,
                train_batch_size_per_learner=train_batch,
                minibatch_size=min(256, train_batch),
                num_epochs=4,
                entropy_coeff=0.003,
                vf_loss_coeff=0.5,
                clip_param=0.1,
            )
            .rl_module(rl_module_spec=RLModuleSpec(module_class=_module_class(), model_config=model_config))
            .debugging(seed=seed)
            .reporting(metrics_num_episodes_for_smoothing=20)
        )
        algo = config.build_algo()
        t1 = time.time()
        for it in range(iterations):
            res = algo.train()
            er = res.get("env_runners", {})
            ret = er.get("episode_return_mean")
            steps = res.get("num_env_steps_sampled_lifetime") or er.get("num_env_steps_sampled_lifetime")
            history.append({"iteration": it + 1, "episode_return_mean": ret, "env_steps": steps,
                            "seconds": time.time() - t1})
            if progress:
                progress(f"PPO iteration {it + 1}/{iterations}: mean episode return {ret}, env steps {steps},"
                         f" {time.time() - t1:.0f} s")
        module = algo.get_module()
        state = {k: v.detach().cpu() for k, v in module.net.state_dict().items()}
        algo.stop()
        phases["ppo"] = {"iterations": iterations, "env_steps": history[-1]["env_steps"],
                         "seconds": time.time() - t1}
    if state is None:
        state = torch.load(init_path, weights_only=True)
    torch.save(state, out / WEIGHTS)
    net = PerOpPolicyNet(hidden=hidden)
    net.load_state_dict(state)
    net.eval()
    scores = evaluate_net(net, mix=mix) if evaluate else {}
    if init_path is not None:
        init_path.unlink(missing_ok=True)
    meta = {
        "format": "dlrm_platform.tuner.nets.PerOpPolicyNet state_dict (torch.save)",
        "hidden": hidden,
        "algorithm": "DAgger imitation warm start, then RLlib PPO (new API stack) fine-tuning",
        "ray_version": __import__("ray").__version__,
        "phases": phases,
        "seed": seed,
        "profile": profile,
        "env": {k: v for k, v in EnvConfig(mix=mix).__dict__.items() if k not in ("profile", "extra")},
        "pipeline_mix": {"name": mix, **PIPELINE_MIXES[mix].__dict__},
        "ppo": {"lr": lr, "train_batch": train_batch, "num_envs": num_envs, "history": history},
        "sim_eval_share_of_optimum": scores,
        "seconds": time.time() - t0,
        "reference_outputs": reference_outputs(net),
    }
    (out / META).write_text(json.dumps(meta, indent=1, default=float))
    return meta
