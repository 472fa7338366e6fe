"""Commands: ``analyze CONFIG`` and ``tuner train``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_analyze(args: argparse.Namespace) -> int:
    from dlrm_platform.tuner.analysis import run_analysis

    run = run_analysis(args.config, seconds=args.seconds)
    payload = run.report.to_dict()
    payload["source"] = run.source
    payload["fused_operators"] = run.fused
    payload["operators_not_found"] = run.missing
    if args.json:
        json.dump(payload, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print(run.report.render())
        if run.fused:
            print(f"\nnote: operators fused by Ray Data into one (tuned together): {run.fused}")
        if run.missing:
            print(f"note: operators not found in the running pipeline: {run.missing}")
    if args.profile_out:
        Path(args.profile_out).write_text(json.dumps(run.profile_dict(), indent=1))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import ray

    from dlrm_platform.tuner.rl import PRETRAINED_DIR
    from dlrm_platform.tuner.rl_train import train_policy

    profile = None
    if args.profile:
        p = Path(args.profile)
        if p.suffix == ".json":
            profile = json.loads(p.read_text())
        else:
            from dlrm_platform.tuner.analysis import run_analysis

            print(f"profiling {p} for {args.profile_seconds:g} s ...")
            profile = run_analysis(p, seconds=args.profile_seconds).profile_dict()
    out = Path(args.out) if args.out else PRETRAINED_DIR
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        meta = train_policy(
            out,
            iterations=args.iterations,
            imitation_rounds=args.imitation_rounds,
            imitation_steps=args.imitation_steps,
            profile=profile,
            seed=args.seed,
            lr=args.lr,
            train_batch=args.train_batch,
            mix=args.mix,
        )
    finally:
        ray.shutdown()
    print(f"policy written to {out} ({(out / 'policy.pt').stat().st_size / 1024:.0f} KB)")
    print(f"simulated share of the optimum (last 20 steps): {meta.get('sim_eval_share_of_optimum')}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="run the pipeline briefly and print the Plumber-style bottleneck report",
        description="Run the ingest pipeline of a job config (or a benchmark pipeline YAML) for a few"
        " seconds at its configured allocation and report per-operator rate per core, CPU share, the"
        " bottleneck and why, the LP's predicted maximum throughput and recommended allocation.",
    )
    p.add_argument("config", help="job config YAML, or a pipeline YAML (benchmarks/pipelines/*.yaml)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to measure, from the pipeline's first output (default 20)")
    p.add_argument("--profile-out", metavar="PATH", help="also write the simulator profile (JSON) here")
    p.set_defaults(handler=_cmd_analyze)

    t = sub.add_parser("tuner", help="the pipeline tuner's RL policy")
    tsub = t.add_subparsers(dest="tuner_command", metavar="COMMAND", required=True)
    tr = tsub.add_parser(
        "train",
        help="retrain the RL tuner policy offline in the pipeline simulator",
        description="Imitation warm start (DAgger on a privileged simulator teacher), then RLlib PPO"
        " (new API stack) in the gymnasium pipeline simulator; exports a torch state_dict + JSON."
        " With --profile, a share of the episodes are built from a profiling pass of that pipeline.",
    )
    tr.add_argument("--out", help="output directory (default: the package's pretrained/ directory)")
    # the defaults are how the shipped policy was trained (its policy.json)
    tr.add_argument("--iterations", type=int, default=15, help="PPO iterations (default 15)")
    tr.add_argument("--imitation-rounds", type=int, default=16)
    tr.add_argument("--imitation-steps", type=int, default=8000, help="simulator steps per imitation round")
    tr.add_argument("--lr", type=float, default=3e-5, help="PPO learning rate")
    tr.add_argument("--train-batch", type=int, default=4000, help="PPO env steps per iteration")
    # the names of simulator.PIPELINE_MIXES, spelled out: importing the simulator costs every CLI start ~0.3 s
    tr.add_argument("--mix", default="issue11", choices=["issue11", "v1"],
                    help="random simulated pipelines' distribution (tuner/simulator.py PIPELINE_MIXES)")
    tr.add_argument("--profile", help="job config / pipeline YAML to profile, or a profile JSON from analyze")
    tr.add_argument("--profile-seconds", type=float, default=20.0)
    tr.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray used for training")
    tr.add_argument("--seed", type=int, default=1)
    tr.set_defaults(handler=_cmd_train)
