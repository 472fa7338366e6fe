"""rl policy options side by side in the simulator: the suite pipelines and held-out random ones.

    .venv/bin/python benchmarks/tuner_rl_options.py \
        [--arm hysteresis='{"rl_limit_hysteresis": 0.1}' ...] [--seeds 30] [--held-out 96] [--json PATH]

Every arm (and ``default``, rl with no options) runs on the same simulated pipelines and seeds,
in one process:

* the suite's synthetic pipelines (``benchmarks/pipelines/*.yaml``, their true costs) with extra noise
  on the operators' own counters (op noise 0.2 and 0.4: live, an operator whose tasks outlast a
  window sees 0-3 of them finish per second), with every operator at 0.4 of its rate for the first
  6 s (a warm-up) and without; and ``contended_lookup`` with its lookup alone at 0.35 for 7 s (what
  the live runs showed). Score: rl's mean share of the optimum over the last 40 of 100 steps.
  Also each run's steps to 95% of its final level (``t95``: convergence).
* the suite's synthetic pipelines with their YAML's cost shift (``shift:``, at ``at_s`` of a 130 s run, no
  extra counter noise), ``--shift-seeds`` seeds each: the seconds to recover to 95% of the post-shift level
  (as ``benchmarks/tuner.py`` times them), their maximum, how many runs took longer than 30 s, and the
  post-shift level's share of the post-shift optimum (a recovery to a lower level is no faster one).
* ``--held-out`` random pipelines of the training mix, drawn from a seed training never uses, half
  with a cost shift half-way (``rl_train.evaluate_policies``), with and without the warm-up.

Prints each arm's figures and its ratio to ``default``. A simulation: no timing enters the figures
(the CPU features are printed all the same, as every benchmark does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT / "benchmarks"))

PIPELINES = ("contended_lookup", "wide_skewed", "dlrm_preprocessing", "storage_saturated", "per_task_overhead")
OP_NOISES = (0.2, 0.4)
WARM_UP = (0.4, 6.0)  # every operator at this share of its rate for the first seconds
LOOKUP_WARM_UP = {"user_lookup": (0.35, 7.0)}


def _steps_to_95(throughput: list[float]) -> float:
    """Steps until a run's 5-step mean first reached 95% of its final level (its last 40 steps' mean): its
    convergence, as ``benchmarks/tuner.py`` times live runs (the whole run where it never did)."""
    final = float(np.mean(throughput[-40:]))
    for i in range(5, len(throughput) + 1):
        if np.mean(throughput[i - 5:i]) >= 0.95 * final:
            return float(i - 2.5)
    return float(len(throughput))


def _suite_run(job: tuple[dict, str, float, int, str]) -> tuple[float, float]:
    from dlrm_platform.tuner.simulator import from_profile, run_controller_in_sim
    from dlrm_platform.tuner.sleep_pipelines import load_pipeline
    from dlrm_platform.tuner.spec import TunerSpec
    from tuner import block_rows_spec

    options, name, op_noise, seed, warm = job
    pipe = load_pipeline(ROOT / "benchmarks" / "pipelines" / f"{name}.yaml")
    sim = from_profile(pipe.ground_truth())
    sim.op_noise = op_noise
    warmup = {"all": {n: WARM_UP for n in sim.names}, "lookup": LOOKUP_WARM_UP, "none": None}[warm]
    with tempfile.TemporaryDirectory(prefix="tuner-options-") as tmp:
        spec = TunerSpec(f"options-{name}", "rl", sim.budget, pipe.op_specs(), options=dict(options),
                         block_rows=block_rows_spec(pipe, Path(tmp)))
        trace = run_controller_in_sim(sim, spec, steps=100, seed=seed, warmup=warmup)
    share = float(np.mean([min(x["throughput"] / x["t_opt"], 1.0) for x in trace[-40:]]))
    return share, _steps_to_95([x["throughput"] for x in trace])


def suite(options: dict, seeds: int, pool) -> dict:
    jobs = [(options, p, n, s, w) for w in ("all", "none") for p in PIPELINES for n in OP_NOISES
            for s in range(seeds)]
    jobs += [(options, "contended_lookup", n, s, "lookup") for n in OP_NOISES for s in range(seeds)]
    scores = pool.map(_suite_run, jobs)
    cells: dict[str, list[float]] = {}
    for (_, p, n, _, w), (share, t95) in zip(jobs, scores):
        cells.setdefault(f"{p}@{n}/{w}", []).append(share)
        cells.setdefault(f"t95 {p}@{n}/{w}", []).append(t95)
    out = {k: float(np.mean(v)) for k, v in cells.items()}
    for w in ("all", "none"):
        out[f"mean/{w}"] = float(np.mean([out[f"{p}@{n}/{w}"] for p in PIPELINES for n in OP_NOISES]))
        out[f"t95 mean/{w}"] = float(np.mean([out[f"t95 {p}@{n}/{w}"] for p in PIPELINES for n in OP_NOISES]))
        out[f"t95 max/{w}"] = float(max(max(cells[f"t95 {p}@{n}/{w}"]) for p in PIPELINES for n in OP_NOISES))
    return out


SHIFT_RUN_S = 130
SHIFT_TARGET_S = 30.0


def _shift_run(job: tuple[dict, str, int]) -> tuple[float | None, float]:
    """Seconds after the YAML's cost shift until the run reached 95% of its post-shift level (None: never),
    and that level's share of the post-shift optimum (a recovery to a lower level is no faster one)."""
    from dlrm_platform.tuner.sleep_pipelines import load_pipeline
    from tuner import _seconds_to, _sim_trace

    options, name, seed = job
    pipe = load_pipeline(ROOT / "benchmarks" / "pipelines" / f"{name}.yaml")
    at = int(pipe.shift.at_s)
    args = argparse.Namespace(rl_policy=None)
    with tempfile.TemporaryDirectory(prefix="tuner-options-") as tmp:
        thr, t_opt = _sim_trace(pipe, "rl", dict(options), args, Path(tmp), seed, SHIFT_RUN_S, shift_at=at)
    post = float(thr[at + int(0.6 * (len(thr) - at)):].mean())
    return _seconds_to(thr[at:], 0.95 * post), min(post / t_opt, 1.0)


def shift_recovery(options: dict, seeds: int, pool) -> dict:
    jobs = [(options, p, s) for p in PIPELINES for s in range(seeds)]
    runs = pool.map(_shift_run, jobs)
    recs = [r for r, _ in runs]
    out: dict = {}
    for p in PIPELINES:
        mine = [math.inf if r is None else r for (_, q, _), r in zip(jobs, recs) if q == p]
        out[f"shift max {p}"] = float(max(mine))
    out["shift post-shift share"] = float(np.mean([share for _, share in runs]))
    every = [math.inf if r is None else r for r in recs]
    out["shift mean"] = float(np.mean(every))
    out["shift max"] = float(max(every))
    out[f"shift runs > {SHIFT_TARGET_S:.0f} s"] = float(sum(r > SHIFT_TARGET_S for r in every))
    return out


def _held_out_run(job: tuple[dict, int, bool]) -> float:
    import dlrm_platform.tuner.simulator as simulator
    from dlrm_platform.tuner.rl import RLPolicyRunner
    from dlrm_platform.tuner.rl_train import evaluate_policies

    options, n, warm = job
    if warm:
        plain = simulator.run_controller_in_sim

        def warmed(pipe, spec, **kw):
            kw.setdefault("warmup", {name: WARM_UP for name in pipe.names})
            return plain(pipe, spec, **kw)

        simulator.run_controller_in_sim = warmed  # this worker process only
    try:
        res = evaluate_policies({"rl": RLPolicyRunner.load()}, baselines=(), n_pipelines=n, steps=90, seed=123,
                                rl_options=options)
    finally:
        if warm:
            simulator.run_controller_in_sim = plain
    return res["policies"]["rl"]["mean"]


def held_out(options: dict, n: int, pool) -> dict:
    warm, cold = pool.map(_held_out_run, [(options, n, True), (options, n, False)])
    return {"held_out/all": warm, "held_out/none": cold}


class _Serial:
    """``Pool``'s ``map`` in this process (``--workers 1``)."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def map(self, fn, jobs):
        return [fn(j) for j in jobs]


def parse_arm(text: str) -> tuple[str, dict]:
    name, sep, raw = text.partition("=")
    if not sep:
        raise SystemExit(f"--arm {text!r}: expected NAME=JSON, e.g. hysteresis='{{\"rl_limit_hysteresis\": 0.1}}'")
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--arm {name}: the options are not JSON ({e})") from e
    if not isinstance(options, dict):
        raise SystemExit(f"--arm {name}: the options must be a JSON object of rl options")
    return name, options


def main(argv: list[str] | None = None) -> int:
    from ingest import cpu_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=JSON",
                    help="rl options to compare with the default (repeatable)")
    ap.add_argument("--seeds", type=int, default=30, help="seeds per suite pipeline and noise (default 30)")
    ap.add_argument("--shift-seeds", type=int, default=10, help="seeds per suite pipeline's cost shift (0: none)")
    ap.add_argument("--held-out", type=int, default=96, help="held-out random pipelines (default 96; 0: none)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    arms = dict([("default", {}), *(parse_arm(a) for a in args.arm)])
    print("CPU:", json.dumps(cpu_report()), flush=True)
    results: dict[str, dict] = {}
    with (Pool(args.workers) if args.workers > 1 else _Serial()) as pool:
        for name, options in arms.items():
            print(f"[{name}] {json.dumps(options)}: suite, {args.seeds} seeds ...", flush=True)
            results[name] = suite(options, args.seeds, pool)
            if args.shift_seeds:
                print(f"[{name}] cost shifts, {args.shift_seeds} seeds per pipeline ...", flush=True)
                results[name].update(shift_recovery(options, args.shift_seeds, pool))
            if args.held_out:
                print(f"[{name}] held out, {args.held_out} pipelines ...", flush=True)
                results[name].update(held_out(options, args.held_out, pool))
    keys = [*(f"mean/{w}" for w in ("all", "none")),
            *(f"contended_lookup@{n}/{w}" for w in ("all", "none", "lookup") for n in OP_NOISES),
            *(f"wide_skewed@{n}/all" for n in OP_NOISES),
            *([f"held_out/{w}" for w in ("all", "none")] if args.held_out else []),
            *(f"t95 {p}@0.2/all" for p in PIPELINES), *(f"t95 {m}/{w}" for m in ("mean", "max") for w in ("all", "none")),
            *([*(f"shift max {p}" for p in PIPELINES), "shift mean", "shift max", f"shift runs > {SHIFT_TARGET_S:.0f} s",
               "shift post-shift share"]
              if args.shift_seeds else [])]
    width = max(len(k) for k in keys)
    print(f"\n{'share of the optimum':{width}}  " + "  ".join(f"{a:>18}" for a in arms))
    for k in keys:
        base = results["default"][k]
        cells = [f"{results[a][k]:.3f}" + (f" ({results[a][k] / base:.3f}x)"
                                            if a != "default" and 0 < base < math.inf else "")
                 for a in arms]
        print(f"{k:{width}}  " + "  ".join(f"{c:>18}" for c in cells))
    print("(/all: every operator warming up at 0.4 for 6 s; /none: no warm-up; /lookup: the lookup alone "
          "at 0.35 for 7 s; @n: extra noise on the operators' counters; t95: steps to 95% of the final level, "
          "lower is better; shift: seconds from the YAML's cost shift to 95% of the post-shift level, lower is "
          "better)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"arms": arms, "seeds": args.seeds, "held_out": args.held_out,
                                         "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
