"""The tuner on the real job: `auto` against the best static pass configuration a bounded search finds.

    .venv/bin/python benchmarks/tuner_job.py [--dataset demo|criteo_shaped] [--reps 2] [--json PATH]
        [--workdir DIR] [--quick]

The per-operator tuner steers concurrency inside one execution; what else decides
a real job's data wait is set per pass: fusion, samples per block, the fused
operator's tasks, the trainer's prefetch depth, the epoch cache and reading
ahead. This benchmark is the job-level oracle for those knobs. It runs full
``dlrm-platform run`` jobs (2 epochs, ``configs/demo.yaml`` with the dataset's
overrides) and searches coordinate-wise, each knob's values measured ``--reps``
times with every other knob at its default (``tuner.policy: static``: nothing
moves inside a pass):

  1. the default configuration and each single-knob alternative (``KNOBS``);
  2. the combination of every knob's best alternative, where one beat the default;
  3. the best three by mean data-wait, measured ``--final-reps`` more times,
     interleaved with ``auto`` (the platform's default policy and settings),
     so the two share the machine's load.

The oracle is the finalist with the lowest mean data-wait over all its runs.
The check: ``auto``'s mean data-wait must not exceed the oracle's by more than
the two 95% half-widths combined (Student t over the runs); otherwise the run
fails (exit status 1, named on stderr, ``check`` in the JSON). Samples/s over
the job are reported alongside.

This is a search over a grid, not an exhaustive one: knobs that interact would
need the full product (``--exhaustive`` is not offered: 3 x 3 x 3 x 3 x 2 x 2 x 2
jobs of ~40 s each). Timing: wall clock on a machine shared with other work;
compare within one run. Prints the CPU features it found.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))


def _sibling(script: str):
    """``benchmarks/<script>.py`` as a module (by path: ``tests/`` has directories of the same names)."""
    name = f"_bench_{script}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{script}.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


ingest_bench = _sibling("ingest")  # the job runner and the datasets
mean_ci = _sibling("tuner").mean_ci  # the Student t interval of the tuner benchmark

# Each knob: its alternatives to the default, as `--set` overrides. The default of every knob is the
# platform's own (what `auto` runs with); the fused operator's default is 2 tasks of 0.5 CPU on the
# job's 1 data CPU, blocks of ~8 batches, prefetch 2, cache auto, read-ahead on.
KNOBS: dict[str, dict[str, list[str]]] = {
    "fusion": {"off (split, config concurrency)": ["ingest.fusion=off"]},
    "fused tasks": {"1 x 1.0 CPU": ["ingest.fused={concurrency: 1, num_cpus: 1.0}"],
                    "4 x 0.25 CPU": ["ingest.fused={concurrency: 4, num_cpus: 0.25}"]},
    "block rows": {"2 batches": ["ingest.block_rows=@2"], "32 batches": ["ingest.block_rows=@32"]},
    "prefetch": {"1": ["ingest.prefetch_batches=1"], "4": ["ingest.prefetch_batches=4"]},
    "epoch cache": {"off": ["ingest.cache.mode=off"]},
    "read ahead": {"off": ["ingest.read_ahead=false"]},
}
FUSED_ONLY = ("fused tasks", "block rows")  # knobs of the fused operator: moot once fusion is off
STATIC = ["tuner.policy=static"]
AUTO_LABEL = "auto (defaults)"
DEFAULT_LABEL = "default"


def resolve(overrides: list[str], batch_size: int) -> list[str]:
    """``@N`` in a value means N batches of samples."""
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        out.append(f"{key}={int(value[1:]) * batch_size}" if value.startswith("@") else o)
    return out


def summarise_runs(label: str, overrides: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [r["job_data_wait_fraction"] for r in runs]
    return {
        "label": label, "overrides": overrides, "runs": runs,
        "data_wait": mean_ci(waits),
        "samples_per_s": mean_ci([r["job_samples_per_s"] for r in runs]),
        "later_epoch_wait_max": max((max(r["epoch_data_wait_fraction"][1:], default=0.0) for r in runs), default=0.0),
    }


def auto_check(auto: dict[str, Any], oracle: dict[str, Any]) -> dict[str, Any]:
    """Does ``auto`` wait no more than the oracle's static configuration, within noise?

    ``auto`` and ``oracle``: {"mean", "ci95"} of the data-wait fraction (lower is better). ``auto``
    fails when its mean exceeds the oracle's by more than the two half-widths combined.
    """
    noise = math.sqrt(auto["ci95"] ** 2 + oracle["ci95"] ** 2)
    margin = auto["mean"] - oracle["mean"]
    ok = not margin > noise  # an infinite noise (one run) cannot fail
    message = (f"auto data-wait {auto['mean']:.4f} +- {auto['ci95']:.4f} vs the best static "
               f"{oracle['mean']:.4f} +- {oracle['ci95']:.4f}: "
               + ("within the noise" if ok and margin > 0 else "no higher" if ok
                  else f"higher by {margin:.4f}, more than the noise ({noise:.4f})"))
    return {"ok": ok, "margin": margin, "noise": noise, "message": message}


class JobSearch:
    """Runs and remembers the jobs of one dataset: every configuration's runs by label."""

    def __init__(self, base: list[str], batch_size: int, workdir: Path):
        self.base, self.batch_size, self.workdir = base, batch_size, workdir
        self.overrides: dict[str, list[str]] = {}
        self.runs: dict[str, list[dict[str, Any]]] = {}

    def measure(self, label: str, overrides: list[str], reps: int) -> dict[str, Any]:
        self.overrides[label] = overrides
        for _ in range(reps):
            run = ingest_bench.run_job(self.base + overrides, 2, self.workdir, label)
            self.runs.setdefault(label, []).append(run)
            ingest_bench.log(f"    {label}: data-wait {run['job_data_wait_fraction']:.4f}, "
                             f"{run['job_samples_per_s']:,.0f} samples/s ({run['wall_s']:.0f} s)")
        return self.result(label)

    def result(self, label: str) -> dict[str, Any]:
        return summarise_runs(label, self.overrides[label], self.runs[label])


def search(s: JobSearch, reps: int, final_reps: int, auto_reps: int) -> dict[str, Any]:
    default = s.measure(DEFAULT_LABEL, STATIC, reps)
    best_per_knob: dict[str, str] = {}
    for knob, values in KNOBS.items():
        for value, overrides in values.items():
            s.measure(f"{knob}: {value}", STATIC + resolve(overrides, s.batch_size), reps)
        best = min([f"{knob}: {v}" for v in values], key=lambda lb: s.result(lb)["data_wait"]["mean"])
        if s.result(best)["data_wait"]["mean"] < default["data_wait"]["mean"]:
            best_per_knob[knob] = best
    if "fusion" in best_per_knob:
        for knob in FUSED_ONLY:
            best_per_knob.pop(knob, None)
    if len(best_per_knob) >= 2:
        combined = STATIC + [o for lb in best_per_knob.values() for o in s.overrides[lb] if o not in STATIC]
        s.measure("combined: " + " + ".join(best_per_knob.values()), combined, reps)
    finalists = sorted(s.runs, key=lambda lb: s.result(lb)["data_wait"]["mean"])[:3]
    ingest_bench.log(f"  finalists: {finalists}; measured again with auto, interleaved")
    s.overrides[AUTO_LABEL] = []
    for i in range(max(final_reps, auto_reps)):
        for lb in finalists:
            if i < final_reps:
                s.measure(lb, s.overrides[lb], 1)
        if i < auto_reps:
            s.measure(AUTO_LABEL, [], 1)
    oracle = min(finalists, key=lambda lb: s.result(lb)["data_wait"]["mean"])
    check = auto_check(s.result(AUTO_LABEL)["data_wait"], s.result(oracle)["data_wait"])
    return {"configurations": {lb: s.result(lb) for lb in s.runs}, "best_per_knob": best_per_knob,
            "finalists": finalists, "oracle": oracle, "check": check}


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"\n== {name}: 2-epoch jobs, data-wait fraction (mean +- 95% half-width over runs) and samples/s")
    rows = sorted(rep["configurations"].values(), key=lambda r: r["data_wait"]["mean"])
    for r in rows:
        w, sps = r["data_wait"], r["samples_per_s"]
        tag = " <- oracle" if r["label"] == rep["oracle"] else ""
        print(f"  {r['label']:<46} {w['mean']:.4f} +- {w['ci95']:.4f}  (n={w['n']})  "
              f"later epochs <= {r['later_epoch_wait_max']:.3f}  {sps['mean']:>9,.0f} samples/s{tag}")
    print(f"  {rep['check']['message']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", choices=["demo", "criteo_shaped"], default="demo")
    ap.add_argument("--samples", type=int, default=160_000, help="samples per dataset (demo: 160k)")
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration in the search")
    ap.add_argument("--final-reps", type=int, default=2, help="further runs of each finalist")
    ap.add_argument("--auto-reps", type=int, default=3, help="runs of auto, interleaved with the finalists")
    ap.add_argument("--quick", action="store_true", help="1 run per configuration, 1 more per finalist, 2 of auto")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--workdir", type=Path, help="data and runs (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.final_reps, args.auto_reps = 1, 1, 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlrm-tuner-job-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"cpu": ingest_bench.cpu_report(), "load_average_at_start": os.getloadavg()}
    print("CPU:", json.dumps(report["cpu"]), flush=True)
    make = ingest_bench.demo_overrides if args.dataset == "demo" else ingest_bench.criteo_overrides
    base = make(workdir, args.samples if args.dataset == "demo" else args.samples * 3 // 4)
    job = ingest_bench.load(base)
    ingest_bench.ensure_data(job)
    start = time.perf_counter()
    rep = search(JobSearch(base, job.ingest.batch_size, workdir), args.reps, args.final_reps, args.auto_reps)
    report[args.dataset] = rep
    report["wall_s"] = time.perf_counter() - start
    report["load_average_at_end"] = os.getloadavg()
    print_report(args.dataset, rep)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=float))
        print(f"written to {args.json}")
    if not rep["check"]["ok"]:
        print(f"FAILED RUN: {rep['check']['message']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
