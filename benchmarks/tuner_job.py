"""The tuner on the real job: `auto` against the best static pass configuration a bounded search finds.

    .venv/bin/python benchmarks/tuner_job.py [--dataset demo|criteo_shaped] [--reps 2] [--json PATH]
        [--workdir DIR] [--quick] [--policies static,ray_default,plumber,hill_climb,rl,auto]

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

With ``--policies`` (what ``benchmarks/tuner.py --suite`` runs on its job pipelines), each
policy also runs jobs (``tuner.policy``: fused under ``static`` and ``auto``, split under the
policies that steer operators one by one): once before the finalists are drawn, where the task
counts a split-pipeline policy ended at join the finalists as a static configuration (the oracle
must match every policy's final allocation, by construction), then interleaved with the finalists
up to ``--policy-reps`` runs. Each policy's samples/s is reported over the throughput oracle's (the
finalist with the highest mean samples/s), with its data-wait; a policy whose mean samples/s
exceeds the oracle's by more than the two 95% half-widths fails the run.

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
import statistics
import subprocess
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
tuner_bench = _sibling("tuner")
mean_ci = tuner_bench.mean_ci  # the Student t interval of the tuner benchmark

# Each knob: its alternatives to the default, as `--set` overrides. The default of every knob is the
# platform's own (what `auto` runs with); the fused operator's default on the job's 1 data CPU is 2 tasks
# of 0.5 CPU, or one task per read task where an epoch has 3 or 4 (the demo: 3 x 0.333), blocks of ~8
# batches, prefetch 2, cache auto, read-ahead on.
FUSED_TASKS: dict[str, list[str]] = {  # the fused operator's tasks x CPUs, against its default (one wave)
    f"{n} x {cpus} CPU": [f"ingest.fused={{concurrency: {n}, num_cpus: {cpus}}}"]
    for n, cpus in ((2, 0.5), (1, 1.0), (4, 0.25))
}
SPLIT = {"off (split, config concurrency)": ["ingest.fusion=off"]}
KNOBS: dict[str, dict[str, list[str]]] = {
    "fusion": SPLIT,
    "fused tasks": {k: FUSED_TASKS[k] for k in ("1 x 1.0 CPU", "4 x 0.25 CPU")},
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


# The per-operator policies a job can run (`tuner.policy`), as the suite compares them on the real pipelines.
# `static` is the default configuration itself; `oracle` is this search.
JOB_POLICIES = ("static", "ray_default", "plumber", "hill_climb", "rl", "auto")


def policy_label(policy: str) -> str:
    return {"static": DEFAULT_LABEL, "auto": AUTO_LABEL}.get(policy, f"policy: {policy}")


def policy_overrides(policy: str) -> list[str]:
    return [] if policy == "auto" else [f"tuner.policy={policy}"]


def final_as_static(run: dict[str, Any]) -> list[str] | None:
    """A split pipeline's final task counts (``run``'s tuner account) as a static configuration, for the oracle
    to measure; None when the policy ran the fused operator (its count is one of the searched knobs) or left
    no allocation (``ray_default`` only observes)."""
    final = (run.get("tuner") or {}).get("final_allocation")
    if not final or not str(run.get("pipeline", "")).startswith("split"):
        return None
    return STATIC + ["ingest.fusion=off"] + [f"ingest.operators.{op}.concurrency={int(n)}"
                                             for op, n in sorted(final.items())]


def search(s: JobSearch, reps: int, final_reps: int, auto_reps: int, policies: tuple[str, ...] = (),
           policy_reps: int = 2) -> dict[str, Any]:
    """The coordinate search, then its finalists measured again interleaved with ``auto`` and ``policies``.

    With ``policies`` (besides ``static`` and ``auto``, which are the default configuration and ``auto``):
    each runs a job once before the finalists are drawn, and the task counts each split-pipeline policy
    ended at join the finalists as a static configuration ("final of <policy>"), so the oracle is at least
    as good as each of them by construction; all of them then run ``policy_reps`` times in all,
    interleaved with the finalists. The throughput oracle is the finalist with the highest mean samples/s.
    """
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
    statics = list(s.runs)
    steered = [p for p in policies if p not in ("static", "auto", "oracle")]
    reproduced: list[str] = []
    for p in steered:
        run = s.measure(policy_label(p), policy_overrides(p), 1)["runs"][-1]
        final = final_as_static(run)
        if final is not None and final not in (s.overrides[lb] for lb in statics + reproduced):
            reproduced.append(f"final of {p}")
            s.overrides[reproduced[-1]] = final
    by_wait = sorted(statics, key=lambda lb: s.result(lb)["data_wait"]["mean"])[:3]
    by_sps = max(statics, key=lambda lb: s.result(lb)["samples_per_s"]["mean"])
    finalists = by_wait + [lb for lb in [by_sps] + reproduced if lb not in by_wait]
    ingest_bench.log(f"  finalists: {finalists}; measured again with auto"
                     + (f" and {', '.join(steered)}" if steered else "") + ", interleaved")
    s.overrides[AUTO_LABEL] = []
    # the reproduced allocations have not run yet: at least once each
    rounds = {lb: max(final_reps, 1) if lb in reproduced else final_reps for lb in finalists}
    for i in range(max([*rounds.values(), auto_reps, policy_reps if steered else 0])):
        for lb in finalists:
            if i < rounds[lb]:
                s.measure(lb, s.overrides[lb], 1)
        if i < auto_reps:
            s.measure(AUTO_LABEL, [], 1)
        for p in steered:
            if len(s.runs[policy_label(p)]) < policy_reps:
                s.measure(policy_label(p), policy_overrides(p), 1)
    oracle = min(finalists, key=lambda lb: s.result(lb)["data_wait"]["mean"])
    check = auto_check(s.result(AUTO_LABEL)["data_wait"], s.result(oracle)["data_wait"])
    out = {"configurations": {lb: s.result(lb) for lb in s.runs}, "best_per_knob": best_per_knob,
           "finalists": finalists, "oracle": oracle, "check": check}
    if policies:
        out.update(policy_comparison(s, finalists, policies))
    return out


def policy_comparison(s: JobSearch, finalists: list[str], policies: tuple[str, ...]) -> dict[str, Any]:
    """Each policy's job samples/s and data-wait against the throughput oracle (the finalist with the highest
    mean samples/s), and the oracle check of the synthetic suite: a policy whose mean samples/s exceeds the
    oracle's by more than the two 95% half-widths combined makes the run a failed one."""
    oracle = max(finalists, key=lambda lb: s.result(lb)["samples_per_s"]["mean"])
    shown = [p for p in policies if p != "oracle"]
    stats = {p: s.result(policy_label(p))["samples_per_s"] for p in shown if policy_label(p) in s.runs}
    stats["oracle"] = s.result(oracle)["samples_per_s"]
    o = stats["oracle"]["mean"]
    return {
        "throughput_oracle": oracle,
        "throughput": {p: st["mean"] for p, st in stats.items()},
        "data_wait": {**{p: s.result(policy_label(p))["data_wait"]["mean"] for p in stats if p != "oracle"},
                      "oracle": s.result(oracle)["data_wait"]["mean"]},
        "vs_oracle": {p: st["mean"] / o for p, st in stats.items() if p != "oracle"},
        "oracle_check": tuner_bench.oracle_check(stats),
    }


# --------------------------------------------------------------------------- the pipeline alone, per policy

# Static configurations of the job's train pipeline the pipeline oracle measures (besides every steering
# policy's final task counts): the fused operator's tasks, and the split pipeline at the config's numbers.
PIPELINE_STATICS: dict[str, list[str]] = {  # the job search's fusion and fused-task knobs, and 2 x 0.5
    "fused, default tasks": STATIC,  # demo, 1 data CPU: 3 x 0.333 (one wave of its 3 shard pairs)
    **{f"fused {label}": STATIC + overrides for label, overrides in FUSED_TASKS.items()},
    "split, config tasks": STATIC + SPLIT["off (split, config concurrency)"],
}
PIPELINE_FINALISTS = 2  # the best static configurations measured again; the oracle is the best re-measurement


def pipeline_under(overrides: list[str], seconds: float, workdir: Path, data_cpus: float = 1.0) -> dict[str, Any]:
    """The job's train pipeline alone (no trainer), as ``dlrm-platform run`` builds it under ``overrides``
    (its tuner policy steering it), epoch after epoch for ``seconds`` after a cold first epoch, on a fresh
    2-CPU local cluster with ``data_cpus`` for Ray Data, consumed as the feed service consumes it. Returns
    the samples/s of every epoch ending in the last 60% of the time (the steady state), their mean, and
    the tuner's account (its final task counts). Runs in a child process: a tuner's controller lives for
    its process."""
    out = workdir / f"pipeline-{abs(hash((tuple(overrides), seconds)))}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--pipeline-run", json.dumps(overrides),
           "--pipeline-s", str(seconds), "--data-cpus", str(data_cpus), "--json", str(out), "--workdir", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline run {overrides} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _pipeline_run(overrides: list[str], seconds: float, workdir: Path, data_cpus: float) -> dict[str, Any]:
    """In the child process: see :func:`pipeline_under`."""
    import ray
    from ray.data import DataContext, ExecutionOptions, ExecutionResources

    from dlrm_platform.ingest.batching import packed_num_samples
    from dlrm_platform.ingest.feed_blocks import bundle_block_refs
    from dlrm_platform.ingest.source import validate_dataset
    from dlrm_platform.tuner.job_pipelines import build_tuned_datasets

    job = ingest_bench.load(overrides)
    files = validate_dataset(job.data)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        DataContext.get_current().enable_progress_bars = False
        DataContext.get_current().print_on_execution_start = False
        datasets, handle = build_tuned_datasets(job, files, workdir / "quarantine", data_cpus)
        ds = datasets.train
        ds.context.execution_options = ExecutionOptions(resource_limits=ExecutionResources(cpu=data_cpus))
        epochs: list[tuple[float, float]] = []  # (end, samples/s) of each epoch after the cold one
        start = None
        while start is None or time.perf_counter() - start < seconds:
            t0, n = time.perf_counter(), 0
            for bundle in ds.iter_internal_ref_bundles():
                for block in bundle_block_refs(bundle)[0]:
                    n += sum(packed_num_samples(block.rows_of(ray.get(block.ref))))
            if start is None:
                start = time.perf_counter()  # the cold epoch (worker start-up) is no policy's doing
                continue
            epochs.append((time.perf_counter() - start, n / (time.perf_counter() - t0)))
        total = epochs[-1][0]
        steady = [sps for end, sps in epochs if end > 0.4 * total] or [epochs[-1][1]]
        account = {}
        if handle is not None:
            account = {k: v for k, v in handle.summary().items() if k in ("policy", "decisions", "final_allocation")}
            handle.close()
        return {"epoch_samples_per_s": steady, "samples_per_s": mean_ci(steady), "epochs": len(epochs),
                "pipeline": datasets.describe(), "tuner": account}
    finally:
        ray.shutdown()


run_noise = tuner_bench.run_noise  # the pooled run-to-run spread, shared with the synthetic suite's oracle check
t95 = tuner_bench.t95  # Student t's 95% quantile, as mean_ci reads it
POOLED_NOISE = tuner_bench.POOLED_NOISE
WITHIN_RUN_NOISE = "within-run epochs (no repeated runs)"


def run_figure(run_means: list[float], noise: dict[str, Any], within_run_ci95: float) -> dict[str, Any]:
    """One configuration's samples/s over its runs (:func:`tuner.run_figure`); with nothing repeated, its one
    run's per-epoch half-width stands in."""
    return tuner_bench.run_figure(run_means, noise, within_run_ci95, within_run=WITHIN_RUN_NOISE)


def ran_unchanged(runs: list[dict[str, Any]], like: list[dict[str, Any]]) -> bool:
    """Each of ``runs`` (a policy's) ran the pipeline the runs ``like`` (a static configuration's) ran and left it as
    it was: the same pipeline, the same final task counts, and no decision of its tuner (an account that says
    nothing of its decisions says nothing either)."""
    def shape(run: dict[str, Any]) -> tuple[str, str]:
        return str(run.get("pipeline")), json.dumps((run.get("tuner") or {}).get("final_allocation"), sort_keys=True)

    shapes = {shape(r) for r in like}
    return bool(runs) and len(shapes) == 1 and all(
        shape(r) in shapes and (r.get("tuner") or {}).get("decisions") == 0 for r in runs)


def interleave(finalists: list[str], policies: list[str]) -> list[str]:
    """One round's order: the finalists spread evenly among the policies (two among six: F P P P F P P P), so
    drift within a round falls on the oracle's candidates and the policies alike, not on whichever runs
    last."""
    order: list[str] = []
    pending = list(finalists)
    for i, policy in enumerate(policies):
        while pending and (len(finalists) - len(pending)) * len(policies) <= i * len(finalists):
            order.append(pending.pop(0))
        order.append(policy)
    return order + pending


def pipeline_comparison(base: list[str], policies: tuple[str, ...], seconds: float, workdir: Path,
                        rounds: int = 1) -> dict[str, Any]:
    """Every policy on the job's train pipeline alone, against the pipeline oracle, with run-to-run noise.

    A first pass runs every policy once, then every static configuration of :data:`PIPELINE_STATICS` and
    every steering policy's final task counts (split, static), each for ``seconds``. The best
    :data:`PIPELINE_FINALISTS` statics of that pass are the finalists. Then ``rounds`` rounds, each running
    the finalists and every policy again, interleaved (:func:`interleave`), so the machine's drift hits the
    oracle's candidates and the policies alike.

    The figures the oracle check compares: the oracle is the finalist with the best mean over its
    re-measurements alone (its first pass is what selected it: the luckiest of several, the winner's
    curse); each policy's figure is the mean over all its runs (a policy is not selected, so its first run
    is as good as any). Their 95% half-widths come from the pooled run-to-run spread (:func:`run_noise`)
    of the policies' runs and the finalists' re-measurements, not from the epochs within a run, which are
    far narrower than the drift between runs (run 3 of the demo failed the check on it).

    Where the oracle is the job's own configuration (:data:`STATIC`: every ingest setting as the policies
    have it), a policy whose runs left that pipeline as it was (:func:`ran_unchanged`) measured the oracle's
    configuration, and its runs count among the oracle's too (``oracle_runs``): no selection chose them. On the
    demo every policy runs the fused default and decides nothing, and the oracle's one re-measurement alone
    read 852k samples/s against 700-822k for the eleven other runs of the same pipeline (tuner/README.md, run 83).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1 (the oracle is the finalists' re-measurements), got {rounds}")
    measured: dict[str, list[dict[str, Any]]] = {}  # label (a policy, or a static's) -> each run's result

    def measure(label: str, overrides: list[str]) -> None:
        res = pipeline_under(base + overrides, seconds, workdir)
        res["overrides"] = overrides
        measured.setdefault(label, []).append(res)
        ingest_bench.log(f"    pipeline {label} (run {len(measured[label])}): {res['samples_per_s']['mean']:,.0f} +- "
                         f"{res['samples_per_s']['ci95']:,.0f} samples/s over {len(res['epoch_samples_per_s'])} "
                         f"steady epochs; {res['pipeline']}")

    shown = [p for p in policies if p != "oracle"]
    for p in shown:
        measure(p, policy_overrides(p))
    statics = dict(PIPELINE_STATICS)
    for p in shown:
        final = final_as_static(measured[p][0])
        if final is not None and final not in statics.values():
            statics[f"final of {p}"] = final
    for label, overrides in statics.items():
        measure(label, overrides)
    first = {label: measured[label][0] for label in statics}
    finalists = sorted(first, key=lambda lb: -first[lb]["samples_per_s"]["mean"])[:PIPELINE_FINALISTS]
    overrides_of = {**{p: policy_overrides(p) for p in shown}, **statics}
    for _ in range(rounds):
        for label in interleave(finalists, shown):
            measure(label, overrides_of[label])

    run_means = {label: [r["samples_per_s"]["mean"] for r in results] for label, results in measured.items()}
    remeasured = {label: run_means[label][1:] for label in finalists}
    noise = run_noise({**{p: run_means[p] for p in shown}, **remeasured})
    oracle = max(finalists, key=lambda lb: statistics.fmean(remeasured[lb]))
    same = ([p for p in shown if ran_unchanged(measured[p], measured[oracle])]
            if statics[oracle] == STATIC else [])

    def figure(label: str, means: list[float]) -> dict[str, Any]:
        return run_figure(means, noise, measured[label][-1]["samples_per_s"]["ci95"])

    figures = {p: figure(p, run_means[p]) for p in shown}
    figures["oracle"] = figure(oracle, remeasured[oracle] + [m for p in same for m in run_means[p]])
    o = figures["oracle"]["mean"]
    return {
        "policies": {p: {**measured[p][0], "run_means": run_means[p]} for p in shown},
        "statics": first,
        "finalists": {lb: {"overrides": statics[lb], "remeasurements": measured[lb][1:], "run_means": remeasured[lb],
                           "samples_per_s": figure(lb, remeasured[lb])} for lb in finalists},
        "oracle": oracle, "oracle_runs": {"re-measurements": len(remeasured[oracle]), "policies": same},
        "runs": run_means, "noise": noise, "figures": figures,
        "throughput": {p: st["mean"] for p, st in figures.items()},
        "vs_oracle": {p: st["mean"] / o for p, st in figures.items() if p != "oracle"},
        "oracle_check": tuner_bench.oracle_check(figures),
    }


def dataset_base(dataset: str, samples: int, workdir: Path) -> tuple[list[str], int]:
    """The overrides of ``dataset``'s jobs (its data generated once) and its batch size."""
    make = ingest_bench.demo_overrides if dataset == "demo" else ingest_bench.criteo_overrides
    base = make(workdir, samples if dataset == "demo" else samples * 3 // 4)
    job = ingest_bench.load(base)
    ingest_bench.ensure_data(job)
    return base, job.ingest.batch_size


def suite_entry(dataset: str, policies: tuple[str, ...], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One real job pipeline of ``benchmarks/tuner.py --suite``: every policy on the train pipeline alone
    against the pipeline oracle (:func:`pipeline_comparison`, ``args.pipeline_s`` each, its re-measuring rounds
    ``args.job_pipeline_rounds``, default 1), then every policy's 2-epoch jobs (``args.policy_reps`` each):
    their data-wait fraction and samples/s."""
    base, batch_size = dataset_base(dataset, args.samples, workdir)
    rounds = getattr(args, "job_pipeline_rounds", 1)
    pipe = pipeline_comparison(base, policies, args.pipeline_s, workdir, rounds=rounds)
    jobs = JobSearch(base, batch_size, workdir)
    shown = [p for p in policies if p != "oracle"]
    for _ in range(args.policy_reps):  # interleaved, so the policies share the machine's load
        for p in shown:
            jobs.measure(policy_label(p), policy_overrides(p), 1)
    results = {p: jobs.result(policy_label(p)) for p in shown}
    return {**pipe, "data_wait": {p: r["data_wait"]["mean"] for p, r in results.items()},
            "job_samples_per_s": {p: r["samples_per_s"]["mean"] for p, r in results.items()},
            "jobs": results}


def print_suite_entry(name: str, rep: dict[str, Any]) -> None:
    """The pipeline figures (mean over runs +- the half-width the oracle check used) and the jobs' figures."""
    oracle, noise = rep["figures"]["oracle"], rep["noise"]
    runs = rep.get("oracle_runs") or {}
    pooled = (f"{runs['re-measurements']} re-measurements and the runs of {', '.join(runs['policies'])}, which left its"
              " pipeline as it was" if runs.get("policies") else "re-measurements")
    print(f"\n== {name}: the train pipeline alone (samples/s over runs, ratio to the oracle '{rep['oracle']}' at "
          f"{oracle['mean']:,.0f} +- {oracle['ci95']:,.0f} over {oracle['n']} runs: {pooled}) "
          "and 2-epoch jobs (data-wait, samples/s)")
    print(f"  noise: {oracle['noise']}" + (f", sd {100 * noise['rel_sd']:.1f}% of a configuration's mean over "
                                          f"{noise['df']} df" if noise["df"] else ""))
    for p, v in rep["throughput"].items():
        if p != "oracle":
            fig = rep["figures"][p]
            print(f"  {p:<12} pipeline {v:>9,.0f} +- {fig['ci95']:>7,.0f} (n={fig['n']})  "
                  f"{rep['vs_oracle'][p]:.3f}x   job: wait "
                  f"{rep['data_wait'][p]:.4f}, {rep['job_samples_per_s'][p]:>9,.0f} samples/s  "
                  f"({rep['policies'][p]['pipeline'].split(':')[0]}, final tasks "
                  f"{(rep['policies'][p]['tuner'] or {}).get('final_allocation')})")
    for v in rep["oracle_check"]["violations"]:
        print(f"  ORACLE CHECK: {v['message']}")


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"\n== {name}: 2-epoch jobs, data-wait fraction (mean +- 95% half-width over runs) and samples/s")
    rows = sorted(rep["configurations"].values(), key=lambda r: r["data_wait"]["mean"])
    for r in rows:
        w, sps = r["data_wait"], r["samples_per_s"]
        tag = " <- oracle" if r["label"] == rep["oracle"] else ""
        print(f"  {r['label']:<46} {w['mean']:.4f} +- {w['ci95']:.4f}  (n={w['n']})  "
              f"later epochs <= {r['later_epoch_wait_max']:.3f}  {sps['mean']:>9,.0f} samples/s{tag}")
    print(f"  {rep['check']['message']}")
    if "throughput" in rep:
        o = rep["throughput"]["oracle"]
        print(f"  policies (job samples/s, its ratio to the oracle '{rep['throughput_oracle']}' at {o:,.0f}; data-wait):")
        for p, v in rep["throughput"].items():
            if p != "oracle":
                print(f"    {p:<12} {v:>9,.0f} samples/s  {rep['vs_oracle'][p]:.3f}x  wait {rep['data_wait'][p]:.4f}")
        for v in rep["oracle_check"]["violations"]:
            print(f"  ORACLE CHECK: {v['message']}")


def run_dataset(dataset: str, args: argparse.Namespace, workdir: Path, policies: tuple[str, ...] = ()) -> dict[str, Any]:
    """The search (and, with ``policies``, the policy comparison) on ``dataset``'s 2-epoch jobs."""
    base, batch_size = dataset_base(dataset, args.samples, workdir)
    return search(JobSearch(base, batch_size, workdir), args.reps, args.final_reps, args.auto_reps,
                  policies=policies, policy_reps=args.policy_reps)


def failures(rep: dict[str, Any]) -> list[str]:
    """What makes a run a failed one: auto waits more than the best static configuration, or a policy beats the
    throughput oracle, by more than the noise."""
    out = [] if rep["check"]["ok"] else [rep["check"]["message"]]
    return out + [v["message"] for v in rep.get("oracle_check", {}).get("violations", [])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", choices=["demo", "criteo_shaped"], default="demo")
    ap.add_argument("--samples", type=int, default=160_000, help="samples per dataset (demo: 160k)")
    ap.add_argument("--reps", type=int, default=2, help="runs per configuration in the search")
    ap.add_argument("--final-reps", type=int, default=2, help="further runs of each finalist")
    ap.add_argument("--auto-reps", type=int, default=3, help="runs of auto, interleaved with the finalists")
    ap.add_argument("--pipeline-run", help=argparse.SUPPRESS)  # the child of pipeline_under: its overrides, JSON
    ap.add_argument("--pipeline-s", type=float, default=30.0,
                    help="with --policies: seconds each policy and static configuration steers the pipeline alone")
    ap.add_argument("--data-cpus", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--policies", default="",
                    help="also compare these tuner policies on the job (comma-separated, of "
                         f"{','.join(JOB_POLICIES)}), each against the throughput oracle")
    ap.add_argument("--policy-reps", type=int, default=2, help="runs of each policy (with --policies)")
    ap.add_argument("--quick", action="store_true",
                    help="1 run per configuration, 1 more per finalist, 2 of auto and of each policy")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--workdir", type=Path, help="data and runs (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.final_reps, args.auto_reps, args.policy_reps = 1, 1, 2, 2
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    unknown = sorted(set(policies) - set(JOB_POLICIES) - {"oracle"})
    if unknown:
        ap.error(f"--policies: unknown {unknown}; choose from {', '.join(JOB_POLICIES)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlrm-tuner-job-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.pipeline_run is not None:
        args.json.write_text(json.dumps(_pipeline_run(json.loads(args.pipeline_run), args.pipeline_s, workdir,
                                                      args.data_cpus), default=float))
        return 0
    report: dict[str, Any] = {"cpu": ingest_bench.cpu_report(), "load_average_at_start": os.getloadavg()}
    print("CPU:", json.dumps(report["cpu"]), flush=True)
    start = time.perf_counter()
    rep = run_dataset(args.dataset, args, workdir, policies)
    report[args.dataset] = rep
    report["wall_s"] = time.perf_counter() - start
    report["load_average_at_end"] = os.getloadavg()
    print_report(args.dataset, rep)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=float))
        print(f"written to {args.json}")
    for message in failures(rep):
        print(f"FAILED RUN: {message}", file=sys.stderr)
    return 1 if failures(rep) else 0


if __name__ == "__main__":
    sys.exit(main())
