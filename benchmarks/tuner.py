"""Pipeline tuner benchmark: every policy on the same pipeline, side by side in one run.

    .venv/bin/python benchmarks/tuner.py [--pipeline benchmarks/pipelines/dlrm_preprocessing.yaml]
        [--json PATH] [--policies static,ray_default,plumber,hill_climb,rl,oracle]
        [--run-s 100] [--shift-run-s 130] [--no-shift] [--cluster local|multinode|both] [--rounds 1]
    .venv/bin/python benchmarks/tuner.py --suite [--sim-only] [--json PATH] [other options as above]
    .venv/bin/python benchmarks/tuner.py --ablation [--sim-only] [--ablation-seeds 123,7]
        [--ablation-pipelines 48] [--run-s 100]

The pipeline (YAML) has operators that *wait* for their cost (GIL-free), on a
local Ray with many logical CPUs: on this 2-core machine that models a large
host faithfully (ARCHITECTURE.md) - allocation, not the two real cores, decides
throughput. ``--cluster multinode`` runs the same on a simulated multi-node
cluster (``ray.cluster_utils.Cluster``).

Per policy it reports steady-state samples/s (consumer-side, last 40% of the
run), seconds to reach 95% of that, peak object-store memory, stalls (10 s
without a delivered row after the first one) and crashes (the JSON also keeps
every move with the policy's reason, ``moves``, and what it observed each
interval, ``timeline``); then the shift
scenario (an operator's cost changes mid-run): time to recover to 95% of the
post-shift steady state and the throughput recovered to, each level also as a
share of the model optimum before and after the shift (a policy that never
recovers reaches its low level at once). ``oracle`` measures a shortlist of
allocations live: every allocation within the budget is scored by the model
measured live after a warm-up (or, with ``--oracle-shortlist truth``,
by the YAML's overhead-free true costs) and the best ``--oracle-k`` are each
measured live (4 s to settle, then the mean rate over 8 s); the best 3 of those are
measured again for 20 s each and the best of that second measurement is kept (the
maximum of the first pass alone is the luckiest window). Its run is longer by the
search; its steady state is the same last 40 s as every other policy's.

The oracle is checked, not trusted. It runs last in every round, and every other policy's
final allocation (for ray_default, the tasks Ray ran) joins its finalists, measured as long
as its own best: by construction its pick is at least as good as each of them. Its winner
is then measured again over the steady state, and once more in a fresh run of ``--run-s`` with
its pick held static, and so is every configuration a policy held while it measured above that
(``--no-oracle-fresh-pick`` skips them): the best of those is its winner (fresh runs take part because
inside its own run, several times longer than the others' and switching configuration dozens of times,
live a configuration measured up to ~45% below the same one fresh). The winner's figure comes from a run
that did not select it: its pick's fresh run where nothing else ran fresh, else one more fresh run of the
winner (the best of several noisy readings leans high: a biased ratio's denominator, a loose bound).
With ``--oracle-search-rounds N`` only the first N rounds search; the later ones measure the last winner
fresh beside the policies' runs (and any configuration a policy measured above it), so that many rounds
of the ratio fit a sitting; rl's ratio to the oracle is also printed round by round with a 95% interval
over rounds (each round runs both, so the ratio cancels the drift between rounds). Each figure is a mean over rounds with a 95%
confidence interval from the run-to-run spread pooled over every policy's rounds, the oracle's included:
with ``--rounds 2`` or more the check allows for the drift between runs, which on a shared machine is
far wider than the 5 s intervals within one. With one round nothing is repeated, and each run's 5 s
intervals stand in (said so in the output: too narrow, so a one-round check errs strict). A policy whose
mean exceeds the oracle's by more than the two half-widths combined beats the oracle by more than the
noise, and the run fails (exit status 1, the offending policies named on stderr, ``oracle_check`` in the
JSON).

Two bounds put the ratios in context. The *overhead ceiling* runs the same pipeline
with operators that cost nothing (``--no-ceiling`` skips it): what Ray Data moves
through six operators on this machine at all. The *effective optimum* is the best
allocation under the YAML's costs with the per-task overheads put back: each
operator's output rows per occupied slot-second, the best any run measured for it.

``--suite`` runs the comparison on every pipeline under ``benchmarks/pipelines/`` (the DLRM
preprocessing pipeline; ``storage_saturated``, where the read sits behind 3 storage channels so a
linear per-slot model over-predicts it; ``wide_skewed``, eight operators with costs 50x apart, a
filter and a 2-CPU operator; ``contended_lookup``, whose lookup slows down past 5 concurrent tasks),
then, live, the real job pipelines (``--jobs demo,criteo_shaped``): the train pipeline of a
``dlrm-platform run`` job with ``tuner.policy`` set to each policy, built as the job builds it (fused under
``static`` and ``auto``, split under the policies that steer operators one by one), run alone epoch after
epoch for ``--job-pipeline-s`` against its own oracle (static configurations of the fused and the split
pipeline, and every policy's final task counts as a static one; then ``--job-pipeline-rounds`` rounds
measuring the best two and every policy again, interleaved; the oracle is the best re-measured mean and the
check's noise the pooled run-to-run spread), and each policy's 2-epoch jobs for the data-wait fraction and
the job's samples/s (``benchmarks/tuner_job.py``), and then prints rl's samples/s over each baseline's per
pipeline and the geometric means over the suite, against the targets (``SUITE_TARGETS``): rl >= 0.95x the oracle
on every pipeline, its geometric mean >= 1.05x plumber's and >= 1.3x ray_default's (live only:
Ray's allocator is not simulated). Beside each geometric mean it prints the same mean for the best
configuration the run found (the exact optimum where simulated, else the oracle): a target above that
headroom is out of reach for any policy in that run. With ``--sim-only`` it takes a minute (no job pipelines); live, each
synthetic pipeline takes as long as one comparison and each job pipeline ~15 min (``--no-synthetic``: the
job pipelines alone).

``--ablation`` asks whether the learned part of ``rl`` earns its place. The ``rl`` policy
is its network behind two rules (the evidence gate and the shield, ``tuner/README.md``);
the ablation runs the same policy with the shipped net, with no net (the first "+1" the
shield allows, else hold), with an untrained random net, and plumber, on held-out random
simulated pipelines (``rl_train.evaluate_policies``: ``--ablation-pipelines`` per seed,
every second one with an operator's cost doubled half-way; the seeds are not the training
ones) and prints each one's share of the optimum, the paired per-pipeline differences
(mean, standard error, wins/losses), how often the gate held and how often the shield
vetoed the net's own choice. Without ``--sim-only`` it then runs the four live on the
benchmark pipeline (``--run-s`` each). It replaces the policy comparison in that run.

``--json PATH`` writes {"throughput": {policy: sps}, "rl_vs_oracle", "rl_vs_ray_default",
"rl_vs_plumber", "rl_vs_hill_climb", "rl_seconds_to_95pct", "stalls", ...}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

from dlrm_platform import tuner as tuner_api  # noqa: E402
from dlrm_platform.config import TunerConfig  # noqa: E402
from dlrm_platform.tuner.observe import OccupiedSlotRates  # noqa: E402
from dlrm_platform.tuner.policies import enumerate_allocations, neighbourhood  # noqa: E402
from dlrm_platform.tuner.simulator import DEFAULT_MIX, PIPELINE_MIXES, from_profile  # noqa: E402
from dlrm_platform.tuner.spec import BlockRowsSpec  # noqa: E402
from dlrm_platform.tuner.sleep_pipelines import (  # noqa: E402
    PipelineDef,
    block_row_sizes,
    build_dataset,
    expected_optimum,
    load_pipeline,
    set_cost_multipliers,
    stop_storage,
)

POLICIES = ["static", "ray_default", "plumber", "hill_climb", "rl", "oracle"]
ORACLE_SHORTLIST = "measured"
RL_OPTIONS: dict = {}  # policy options for `rl` (--rl-judge-moves)
ORACLE_SETTLE_S, ORACLE_MEASURE_S = 4.0, 8.0  # per candidate: settle after the switch, then average
ORACLE_WARMUP_S = 15.0  # the initial allocation measured before the model shortlist is drawn
ORACLE_FINALISTS, ORACLE_FINAL_MEASURE_S = 3, 20.0  # the best 3 measured again, longer
STALL_S = 10.0


def moving_average(ts: np.ndarray, rows: np.ndarray, window: float, step: float = 1.0):
    """Delivered rows/s over a trailing ``window`` seconds, sampled every ``step``."""
    if len(ts) == 0:
        return np.array([]), np.array([])
    grid = np.arange(window, ts[-1] + 1e-9, step)
    cum = np.cumsum(rows)
    out = []
    for g in grid:
        hi = np.searchsorted(ts, g, side="right")
        lo = np.searchsorted(ts, g - window, side="right")
        total = cum[hi - 1] - (cum[lo - 1] if lo > 0 else 0) if hi > 0 else 0
        out.append(total / window)
    return grid, np.array(out)


def steady(ts, rows, start, end) -> float:
    sel = (ts > start) & (ts <= end)
    return float(rows[sel].sum() / max(end - start, 1e-9))


ORACLE_BIN_S = 5.0  # the steady state's per-interval samples/s: the noise the oracle check allows
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13,
       20: 2.09, 30: 2.04}


def interval_rates(ts, rows, start, end, bin_s: float = ORACLE_BIN_S) -> list[float]:
    """Samples/s in consecutive ``bin_s`` intervals of (start, end]: a run's per-interval samples."""
    out = []
    t = start
    while t + bin_s <= end + 1e-9:
        out.append(steady(ts, rows, t, t + bin_s))
        t += bin_s
    return out


def t95(df: int) -> float:
    """Student t's 95% two-sided quantile at ``df`` degrees of freedom: the nearest tabulated df at or
    below (:data:`T95`), so the interval errs wide."""
    return T95[max(k for k in T95 if k <= df)]


def mean_ci(samples: list[float]) -> dict:
    """Mean and 95% confidence half-width (Student t) of per-interval samples/s."""
    n = len(samples)
    if n == 0:
        return {"mean": float("nan"), "ci95": float("inf"), "n": 0}
    mean = float(np.mean(samples))
    if n == 1:
        return {"mean": mean, "ci95": float("inf"), "n": 1}
    se = float(np.std(samples, ddof=1)) / math.sqrt(n)
    return {"mean": mean, "ci95": t95(n - 1) * se, "n": n}


def run_noise(runs_by_config: dict[str, list[float]]) -> dict:
    """The pooled run-to-run spread of one configuration's samples/s, relative to its mean: the noise of an
    oracle check.

    ``runs_by_config``: {label: [the mean samples/s of each of its runs]}. Every configuration run at least
    twice contributes the deviations of its runs about its own mean, as fractions of that mean (the drift
    scales with throughput: a split pipeline at 150k and a fused one at 500k drift by similar fractions, not
    by similar samples/s); the pooled variance is their sum of squares over the degrees of freedom,
    sum(n_i - 1). Why runs and not epochs: the runs are separate child processes minutes apart on a shared
    machine, and their drift is far wider than the spread of the epochs within one run (run 3 of the demo:
    ``auto``, running exactly the oracle's configuration, measured 8% higher than the oracle's
    re-measurement, 551k +- 21k against 511k +- 26k in per-epoch half-widths).
    Returns {"rel_sd", "df", "configs"} (the labels pooled); rel_sd nan and df 0 when nothing was repeated.
    """
    repeated = {label: means for label, means in runs_by_config.items() if len(means) >= 2}
    squares = sum(sum((x / statistics.fmean(means) - 1.0) ** 2 for x in means) for means in repeated.values())
    df = sum(len(means) - 1 for means in repeated.values())
    return {"rel_sd": math.sqrt(squares / df) if df else float("nan"), "df": df, "configs": list(repeated)}


POOLED_NOISE = "pooled run-to-run"


def run_figure(run_means: list[float], noise: dict, within_run_ci95: float,
               within_run: str = "within-run intervals (no repeated runs)") -> dict:
    """One configuration's (or policy's) samples/s over its runs: {"mean", "ci95", "n", "noise"}, the 95%
    half-width t95(df) x pooled relative sd x mean / sqrt(n) from :func:`run_noise`'s pooled spread. With
    nothing repeated (df 0) there is no run-to-run estimate: ``within_run_ci95`` (its one run's half-width)
    stands in, and "noise" says so (``within_run``), since that interval is known to be too narrow on a
    shared machine."""
    n, mean = len(run_means), statistics.fmean(run_means)
    if noise["df"] == 0:
        return {"mean": mean, "ci95": within_run_ci95, "n": n, "noise": within_run}
    return {"mean": mean, "ci95": t95(noise["df"]) * noise["rel_sd"] * mean / math.sqrt(n), "n": n,
            "noise": POOLED_NOISE}


def oracle_check(stats: dict[str, dict], oracle: str = "oracle") -> dict:
    """Is the oracle at least as good as every policy within noise?

    ``stats``: {policy: {"mean", "ci95"}} (samples/s, 95% half-widths from :func:`mean_ci`). A policy
    beats the oracle by more than the noise when its mean exceeds the oracle's by more than the two
    half-widths combined (``sqrt(ci_p**2 + ci_o**2)``); any such policy makes the run a failed run.
    """
    if oracle not in stats:
        return {"ok": True, "checked": False, "violations": [], "note": "no oracle run"}
    o = stats[oracle]
    violations = []
    for p, st in stats.items():
        if p == oracle:
            continue
        noise = math.sqrt(st["ci95"] ** 2 + o["ci95"] ** 2)
        margin = st["mean"] - o["mean"]
        if margin > noise:
            violations.append({"policy": p, "samples_per_s": st["mean"], "oracle_samples_per_s": o["mean"],
                               "margin": margin, "noise": noise,
                               "message": f"{p} {st['mean']:,.0f} +- {st['ci95']:,.0f} samples/s beats the oracle "
                                          f"{o['mean']:,.0f} +- {o['ci95']:,.0f} by {margin:,.0f}, more than the "
                                          f"noise ({noise:,.0f}): the oracle is not an upper bound"})
    return {"ok": not violations, "checked": True, "violations": violations,
            "oracle": {"samples_per_s": o["mean"], "ci95": o["ci95"]}}


def seconds_to(ts, rows, target, after=0.0, window=5.0) -> float | None:
    grid, ma = moving_average(ts, rows, window)
    for g, v in zip(grid, ma):
        if g >= after + window and v >= target:
            return float(g - window / 2)  # centre of the window that first reaches it
    return None


#: a dip counts against a recovery only below the post-shift level by this many standard deviations of that
#: level's own 10 s windows (``recovery_seconds``): recorded live rl runs with no shift at all, a shift put at
#: 40 or 50 s of 100, read more than 30 s of "recovery" in 14 of 40 places with 95% of the level and its span's
#: lowest window as the only lines, 3 of 40 with this one too (tuner/README.md, run 56)
RECOVERY_NOISE_K = 3.0
#: the throughput's fall below 95% counts as the shift reaching the sink only this many seconds after the
#: shift (the blocks in flight at the old cost drain in 5-15 s here); a fall after that is a dip, judged as
#: one. Live, one 5 s window one block short (0.93 of the level) 35 s after a shift, the allocation unchanged
#: from 3.2 s after it, read as the shift's arrival: "34.5 s" (dlrm_preprocessing, tuner/README.md, run 67)
RECOVERY_FALL_WITHIN_S = 20.0
#: ... and a dip counts only where the window of this many seconds centred on it is below 95% of the level too:
#: a 10 s window holds 28-50 blocks here, one block more or less moves it 2-4%, and the level's span (18 s)
#: is too short to measure that noise. Live, storage_saturated's 10 s window at 0.92 of the level 50 s after
#: its shift, the allocation unchanged from 2.2 s after it, its 20 s window 0.97: "45 s" (run 67). A move that
#: costs a third of the throughput for 7 s still counts (test)
RECOVERY_SUSTAIN_S = 20.0


def recovery_seconds(ts, rows, shift_at: float, post: float, steady_from: float,
                     noise_k: float = RECOVERY_NOISE_K, fall_within_s: float | None = RECOVERY_FALL_WITHIN_S,
                     sustain_s: float | None = RECOVERY_SUSTAIN_S) -> float | None:
    """Seconds from a cost shift until the delivered throughput is back at 95% of its post-shift level
    ``post`` (measured from ``steady_from`` to the end) for good; None: never. Live, the shift reaches the
    sink only once the blocks already in flight have drained (5-15 s here), so the first 5 s window at 95%
    after the shift is often one the shift had not touched yet, and a pipeline that then sinks for half a
    minute has not recovered at its first good window. The clock stops at the later of: the first 5 s
    window at 95% after the throughput first fell below it within ``fall_within_s`` of the shift (None: any
    time before ``steady_from``; the shift itself where it never did), and the centre of the last 10 s window
    before ``steady_from`` that fell below 95% of ``post``, every 10 s window of the level's own span, and
    ``post`` less ``noise_k`` standard deviations of those windows (0: the first two only), where the
    ``sustain_s`` window centred on it is below 95% of ``post`` too (None: the 10 s window alone). The level's
    span is shorter than the one searched for a dip (18 s against 40 s in a 130 s run), so its lowest window
    alone is no measure of its noise: blocks of 8,000 rows swing a 10 s window by a fifth, and a window 7% low
    with the allocation unchanged for 30 s read as a recovery of 42 s (dlrm_preprocessing, run 55b)."""
    target = 0.95 * post
    grid, ma = moving_average(ts, rows, 5.0)
    after = [(g, v) for g, v in zip(grid, ma) if g >= shift_at + 5.0]
    fall_by = steady_from if fall_within_s is None else min(steady_from, shift_at + fall_within_s)
    fell = next((i for i, (g, v) in enumerate(after) if v < target and g <= fall_by), None)
    if fell is None:
        back = shift_at
    else:
        back = next((g - 2.5 for g, v in after[fell:] if v >= target), None)  # the window's centre
        if back is None:
            return None
    grid10, ma10 = moving_average(ts, rows, 10.0)
    level = [v for g, v in zip(grid10, ma10) if g >= steady_from + 10.0]
    noise = noise_k * float(np.std(level)) if noise_k and len(level) >= 2 else 0.0
    floor = min([target, *level, post - noise])
    dips = [g for g, v in zip(grid10, ma10) if shift_at + 10.0 <= g < steady_from + 10.0 and v < floor]
    if sustain_s and dips:
        # the sustain_s window centred on the 10 s window ending at g ends at g - 5 + sustain_s / 2
        wide_grid, wide = moving_average(ts, rows, sustain_s)
        dips = [g for g in dips if np.interp(g - 5.0 + sustain_s / 2, wide_grid, wide) < target]
    if dips:
        back = max(back, dips[-1] - 5.0)
    return float(back - shift_at)


def last_move_seconds(allocations: list, shift_at: float) -> float:
    """Seconds from a cost shift to the tuner's last change of the allocation in the run (0.0: none after
    the shift). ``allocations`` is ``[[elapsed_s, allocation], ...]`` in time order. Beside
    ``recovery_seconds``: a recovery the throughput clock reads long with no move after the first seconds
    timed the level's own swings (blocks in flight draining, the machine's other load), not a tuner still
    searching; a late last move with a short recovery is a refinement after it."""
    last, prev = None, None
    for t, alloc in allocations:
        if alloc != prev and t >= shift_at:  # each entry is a decision: the first one is a move too
            last = t
        prev = alloc
    return 0.0 if last is None else round(float(last - shift_at), 1)


def count_stalls(ts: np.ndarray, run_s: float) -> int:
    if len(ts) == 0:
        return 1
    gaps = np.diff(np.concatenate([ts, [run_s]]))
    return int((gaps > STALL_S).sum())


def final_allocation(res: dict) -> dict | None:
    """The allocation a policy's run ended at; for ray_default (the tuner only observes) the tasks Ray ran."""
    if res.get("policy") == "ray_default":
        running = res.get("observed_tasks_running") or {}
        return {n: max(1, int(round(v))) for n, v in running.items()} or None
    return res.get("final_allocation")


def final_configuration(res: dict) -> dict | None:
    """What the oracle must re-measure of a policy's run: its final allocation and, where the blocks
    are resizable, its final rows per block."""
    alloc = final_allocation(res)
    return {"allocation": alloc, "block_rows": res.get("final_block_rows")} if alloc else None


def steady_configurations(res: dict, steady_s: float, initial: dict, min_share: float = 0.25) -> list[dict]:
    """What the oracle must re-measure of a policy's run: every (allocation, rows per block) the policy
    held for at least ``min_share`` of its steady state (the last ``steady_s``), and its final one. A
    policy's steady-state figure is not always its final configuration's: live, auto held read 3,
    parse 5, sparse_hash 8, feature_cross 5, pack 3 for 17 of its last 40 s (~19,500 samples/s) and
    moved one slot 9 s before the end; the oracle re-measured only the final one and came out below."""
    final = final_configuration(res)
    if res.get("policy") == "ray_default" or not res.get("allocations"):
        return [final] if final else []
    end = float(res.get("elapsed_s") or 0.0)
    start = end - steady_s
    # each configuration change, in time: allocation moves and block-size steps
    rows_at = [(float(t), int(r)) for t, r, *_ in res.get("block_rows_steps") or []]
    timeline = [(0.0, initial["allocation"])] + [(float(t), a) for t, a in res["allocations"]]
    changes = sorted({t for t, _ in timeline} | {t for t, _ in rows_at})
    held: dict[str, float] = {}
    configs: dict[str, dict] = {}
    for i, t in enumerate(changes):
        until = changes[i + 1] if i + 1 < len(changes) else end
        span = max(min(until, end) - max(t, start), 0.0)
        if span <= 0:
            continue
        alloc = next(a for ta, a in reversed(timeline) if ta <= t)
        rows = next((r for tr, r in reversed(rows_at) if tr <= t), initial["block_rows"])
        cfg = {"allocation": alloc, "block_rows": rows}
        key = json.dumps(cfg, sort_keys=True)
        held[key] = held.get(key, 0.0) + span
        configs[key] = cfg
    out = [configs[k] for k, s in held.items() if s >= min_share * steady_s]
    return out + [final] if final and final not in out else out


def pick_pipeline(pipe: PipelineDef, config: dict) -> PipelineDef:
    """``pipe`` held at one configuration: every operator at its slots in ``config["allocation"]``,
    fixed blocks of ``config["block_rows"]`` rows (where given), nothing resizable."""
    alloc = config["allocation"]
    raw = pipe.model_dump()
    for op in raw["operators"]:
        op["concurrency"] = int(alloc.get(op["name"], op["concurrency"]))
    raw.update(name=f"{pipe.name}_pick", max_rows_per_block=None,
               rows_per_block=int(config.get("block_rows") or pipe.rows_per_block))
    return PipelineDef.model_validate(raw)


def oracle_winner(search: dict | None, fresh: list[tuple[dict, dict]]) -> tuple[dict, float, str]:
    """The oracle's selection in one round: the configuration it settles on, the figure that selected it and
    where that figure came from. The best of its search run's steady state (its pick's) and every fresh run
    (``fresh``: ``(configuration, run)`` pairs, its pick first, then the challengers); crashed runs do not count.

    Every policy's figure is the last 40 s of a fresh 100 s run; the oracle's search run is 8-9x as
    long and switches configuration dozens of times, and inside it a configuration measured far
    below the same one fresh (per_task_overhead: its pick ~14,100 at the end of its run against
    16,020-16,920 fresh; rl's final configuration 9,625 in the oracle's finalist pass against 17,640
    in rl's own run), so the fresh runs take part in the selection."""
    pick = fresh[0][0]
    best = (pick, float(search["samples_per_s"]), "search run") if search and search.get("samples_per_s") \
        else (pick, -math.inf, "none")
    for cfg, run in fresh:
        if run.get("crash") is None and run.get("samples_per_s") is not None and run["samples_per_s"] > best[1]:
            best = (cfg, float(run["samples_per_s"]), f"fresh run of {_config_text(cfg)}")
    return best


def needs_confirmation(fresh: list[tuple[dict, dict]]) -> bool:
    """Whether the winner's figure must come from one more run: where anything beside the pick ran fresh, the
    winner is whichever read highest, and the highest of several noisy readings leans high (the winner's
    curse). Where only the pick ran fresh, its run was not used to choose it and is its figure."""
    return len(fresh) > 1


def adopt_fresh_runs(search: dict | None, fresh: list[tuple[dict, dict]], confirm: dict | None = None) -> dict:
    """The oracle's result for one round: its winner (:func:`oracle_winner`) and the winner's figure, measured
    by a run that did not select it: ``confirm`` (a fresh run of the winner, :func:`needs_confirmation`), else
    the pick's fresh run. ``search``: its search run (None in a round that re-measures an earlier round's pick).

    The figure is the ratio's denominator (rl / oracle) and the bound the oracle check compares every policy
    with, and a best-of-several figure is biased high for the one and loose for the other: live, the oracle's
    contended_lookup figures were the higher of its search run's and its fresh run's readings of one
    configuration (5,700 over a fresh 5,500 in run 41). The selection itself is unchanged: every policy's held
    configurations join it, so by construction nothing a policy ran is left unmeasured beside the winner."""
    base = search if search is not None else {**fresh[0][1], "policy": "oracle"}
    out = dict(base)
    out["search_run"] = None if search is None else {k: search.get(k) for k in (
        "samples_per_s", "interval_samples_per_s", "seconds_to_95pct", "final_allocation", "final_block_rows")}
    out["fresh_runs"] = [{"configuration": cfg, **{k: run.get(k) for k in (
        "samples_per_s", "interval_samples_per_s", "seconds_to_95pct", "stalls", "crash")}} for cfg, run in fresh]
    winner, selected, selected_from = oracle_winner(search, fresh)
    out["selection"] = {"configuration": winner, "samples_per_s": selected, "from": selected_from}
    figure_run, what = (confirm, "confirmation run") if confirm is not None else (fresh[0][1], "fresh run")
    if figure_run.get("crash") is not None or figure_run.get("samples_per_s") is None:
        # no unbiased figure this round: the selection's stands in, and says so
        out.update(samples_per_s=selected if math.isfinite(selected) else 0.0, final_allocation=winner["allocation"],
                   final_block_rows=winner.get("block_rows"),
                   figure_from=f"{selected_from} (the {what} crashed: the selection's figure)")
        return out
    out["confirmation_run"] = None if confirm is None else {k: confirm.get(k) for k in (
        "samples_per_s", "interval_samples_per_s", "seconds_to_95pct", "stalls", "crash")}
    out.update(samples_per_s=figure_run["samples_per_s"], interval_samples_per_s=figure_run["interval_samples_per_s"],
               final_allocation=winner["allocation"], final_block_rows=winner.get("block_rows"),
               figure_from=f"{what} of {_config_text(winner)}")
    return out


def _config_text(cfg: dict) -> str:
    rows = f" at {cfg['block_rows']:,} rows" if cfg.get("block_rows") else ""
    return "/".join(str(v) for v in cfg["allocation"].values()) + rows


def challengers(results: dict[str, list[dict]], oracle_figure: float, steady_s: float, initial: dict,
                skip: list[dict]) -> list[dict]:
    """The configurations to run fresh beside the oracle's pick: those every policy whose steady state
    came out above the oracle's figure held through it (only they can fail the oracle check)."""
    out: list[dict] = []
    for pol, runs in results.items():
        if pol == "oracle" or not runs or (runs[-1].get("samples_per_s") or 0.0) <= oracle_figure:
            continue
        out += [c for c in steady_configurations(runs[-1], steady_s, initial) if c and c not in out and c not in skip]
    return out


def block_rows_spec(pipe: PipelineDef, control_dir: Path) -> BlockRowsSpec | None:
    """The blocks' size as a tuner knob, where the pipeline's YAML makes them resizable."""
    if not pipe.max_rows_per_block:
        return None
    return BlockRowsSpec(initial=pipe.rows_per_block, control_file=str(control_dir / "block_rows.json"),
                         max_rows=pipe.max_rows_per_block)


def oracle_search_s(k: int, extra: int = 0, block_sizes: int = 0) -> float:
    """Seconds the oracle spends before it settles on its pick (its run is longer by this);
    ``extra``: the other policies' allocations it re-measures among its finalists; ``block_sizes``:
    the block sizes it measures first, where the blocks are resizable (then a final pass of its pick
    and the others' configurations at other sizes)."""
    blocks = 0.0
    if block_sizes > 1:
        blocks = (block_sizes * (ORACLE_SETTLE_S + ORACLE_MEASURE_S + 1.0)
                  + (1 + extra) * (ORACLE_SETTLE_S + ORACLE_FINAL_MEASURE_S + 1.0))
    return (ORACLE_WARMUP_S + k * (ORACLE_SETTLE_S + ORACLE_MEASURE_S + 1.0)
            + (ORACLE_FINALISTS + extra) * (ORACLE_SETTLE_S + ORACLE_FINAL_MEASURE_S + 1.0) + 10.0 + blocks)


def oracle_shortlist(pipe: PipelineDef, k: int) -> list[dict]:
    """The best ``k`` allocations under the YAML's true costs: of every maximal allocation, or, where there
    are too many to enumerate (eight operators on 32 CPUs), of the true optimum's +-2 neighbourhood."""
    sim = from_profile(pipe.ground_truth())
    # the allocations that are best at the best block size (the only one where blocks are fixed)
    sim.block_rows = sim.optimum_over_block_rows(block_row_sizes(pipe))[1]
    specs = sim.specs()
    every = enumerate_allocations(specs, sim.budget, limit=500_000)
    if every is None:
        every = neighbourhood(specs, sim.optimum()[0], sim.budget)
    every.sort(key=lambda a: (-sim.throughput(a), sum(a.values())))
    return every[:k]


_RUN_IDS = itertools.count()


def run_tuner_id(tag: str, policy: str) -> str:
    """A tuner id no other run of this process has used. A tuner id's controller lives for the process
    (kept across epochs) and keeps the spec it was made with, so a run that reused one was steered by an
    earlier run's controller: the oracle's fresh runs of one round shared a tag, and every one after the
    first ran the first one's configuration (run 14: 13,140 and 12,960 for four different configurations,
    where one of them measured 16,200 alone)."""
    return f"{tag}-{policy}-{next(_RUN_IDS)}"


def run_one(pipe: PipelineDef, policy: str, run_s: float, *, shift_at: float | None, plot_dir: Path | None,
            oracle_k: int, tag: str, steady_s: float | None = None, cost_scale: float | None = None,
            policy_path: str | None = None, must_beat: list[dict] | None = None) -> dict:
    """One policy, one run. Steady state = the last ``steady_s`` seconds (default: the last 40%).
    ``cost_scale`` multiplies every operator's cost (0: the operators cost nothing). ``must_beat``
    (oracle): allocations it re-measures among its finalists (the other policies' final ones)."""
    import ray
    from ray.data import DataContext

    budget = float(pipe.cluster.data_cpus)
    specs = pipe.op_specs()
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    cfg = TunerConfig(policy=policy, interval_s=1.0, policy_path=policy_path)
    options = dict(RL_OPTIONS) if policy == "rl" else {}
    if policy == "oracle":
        if ORACLE_SHORTLIST == "truth":
            options["oracle_candidates"] = oracle_shortlist(pipe, oracle_k)
        options["oracle_max_measured"] = oracle_k  # else: every allocation scored by the measured model
        options["oracle_settle_s"], options["oracle_measure_s"] = ORACLE_SETTLE_S, ORACLE_MEASURE_S
        options["oracle_warmup_s"] = ORACLE_WARMUP_S
        options["oracle_finalists"], options["oracle_final_measure_s"] = ORACLE_FINALISTS, ORACLE_FINAL_MEASURE_S
        options["oracle_extra_candidates"] = list(must_beat or [])
    strategies = tuner_api.compute_strategies(cfg, None, budget, operators=specs)
    _, opt_rate = expected_optimum(pipe)
    headroom = 1.5 if cost_scale is None or cost_scale > 0 else 4.0  # free operators run faster than the model
    blocks = int(math.ceil(run_s * opt_rate * headroom / pipe.rows_per_block)) + 20
    control = Path(tempfile.mkdtemp(prefix="tuner-bench-")) / "costs.json"
    set_cost_multipliers(control, {} if cost_scale is None else {o.name: cost_scale for o in pipe.operators})
    block_rows = block_rows_spec(pipe, control.parent)
    ds = build_dataset(pipe, blocks, strategies, control_file=control,
                       block_rows_file=block_rows.control_file if block_rows else None)
    ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(cpu=budget)
    handle = tuner_api.attach(cfg, None, ds.context, budget, operators=specs, options=options,
                              tuner_id=run_tuner_id(tag, policy), block_rows=block_rows)
    t0 = time.time()
    stamps: list[float] = []
    counts: list[int] = []
    crash = None
    shifted = False
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=4):
            now = time.time() - t0
            stamps.append(now)
            counts.append(len(batch["id"]))
            if shift_at is not None and not shifted and now >= shift_at:
                set_cost_multipliers(control, {pipe.shift.operator: pipe.shift.factor})
                shifted = True
            if now >= run_s:
                break
    except Exception as err:  # noqa: BLE001 - a crash is a result
        crash = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    elapsed = time.time() - t0
    time.sleep(1.5)
    ticks = handle.ticks()
    summary = handle.summary()
    if plot_dir is not None:
        handle.plot(plot_dir / f"{tag}_{policy}.png", title=f"{tag}: {policy}")
    handle.close()
    del ds
    stop_storage()
    shutil.rmtree(control.parent, ignore_errors=True)  # the run's control files (a late reader sees defaults)
    ts = np.array(stamps)
    rows = np.array(counts, dtype=float)
    end = min(elapsed, run_s)
    res = {
        "policy": policy,
        "elapsed_s": elapsed,
        "rows": float(rows.sum()),
        "crash": crash,
        "stalls": count_stalls(ts, end) if crash is None else 1,
        "peak_object_store_bytes": max((t["mem_used"] for t in ticks), default=0.0),
        "final_allocation": summary.get("final_allocation"),
        "final_block_rows": ticks[-1].get("block_rows") if ticks else None,
        "block_rows_steps": [[round(t.get("elapsed", 0.0), 1), t.get("block_rows"),
                              (t.get("explanation") or {}).get("text")]
                             for t in ticks if (t.get("decision") or {}).get("block_rows")],
        "decisions": summary.get("decisions"),
        # each move and the policy's own account of it (bottleneck, expected gain, measured scaling)
        "moves": [{"elapsed_s": t.get("elapsed"), "change": t["decision"], "why": t.get("policy_state")}
                  for t in ticks if t.get("decision")],
        "tuner_ticks": len(ticks),
        "first_row_s": float(ts[0]) if len(ts) else None,
        "trace": [[round(float(g), 1), round(float(v), 1)] for g, v in zip(*moving_average(ts, rows, 5.0))],
        "allocations": [[round(t["elapsed"], 1), t["allocation"]] for t in ticks if t.get("decision")],
        # what Ray actually ran: mean tasks per operator over the steady-state part (ray_default
        # sets its own concurrency; the others follow the tuner's caps)
        "observed_tasks_running": _mean_running(ticks, 0.6),
        # what the policy saw each interval, to tell afterwards why it moved (or did not)
        "timeline": _timeline(ticks),
        "rows_per_occupied_slot_s": _occupied_slot_rates(ticks, 0.6),
    }
    if shift_at is None:
        start = end - steady_s if steady_s else 0.6 * end
        sps = steady(ts, rows, start, end)
        res["samples_per_s"] = sps
        res["interval_samples_per_s"] = interval_rates(ts, rows, start, end)
        res["seconds_to_95pct"] = seconds_to(ts, rows, 0.95 * sps)
    else:
        pre = steady(ts, rows, max(shift_at - 20, 0.5 * shift_at), shift_at)
        steady_from = shift_at + 0.6 * (end - shift_at)
        post = steady(ts, rows, steady_from, end)
        res.update({
            "pre_shift_samples_per_s": pre,
            "post_shift_samples_per_s": post,
            "recovery_s": recovery_seconds(ts, rows, shift_at, post, steady_from),
            # any dip below 95% of the level and its span's lowest window counts (run 55's figure)
            "recovery_strict_s": recovery_seconds(ts, rows, shift_at, post, steady_from, noise_k=0.0,
                                                  fall_within_s=None, sustain_s=None),
            # a single window counts: a dip below the level's noise, a fall at any time (runs 56-66's figure)
            "recovery_single_window_s": recovery_seconds(ts, rows, shift_at, post, steady_from,
                                                         fall_within_s=None, sustain_s=None),
            "last_move_s": last_move_seconds(res["allocations"], shift_at),
            "shift_at_s": shift_at,
        })
    # free the cluster before the next policy
    deadline = time.time() + 30
    while time.time() < deadline:
        avail = ray.available_resources().get("CPU", 0.0)
        if avail >= ray.cluster_resources().get("CPU", 0.0) - 1:
            break
        time.sleep(1.0)
    return res


def _timeline(ticks: list[dict]) -> list[dict]:
    """Per interval: the allocation, the bottleneck, and each operator's measured capacity
    (samples/s), mean tasks running and slot utilisation, as the policy saw them, and the slots
    its tasks held under output backpressure (not counted as running)."""
    def r(x, nd=0):
        return None if x is None else round(float(x), nd)

    return [{"t": r(t.get("elapsed"), 1), "throughput": r(t.get("throughput")), "bottleneck": t.get("bottleneck"),
             "allocation": t.get("allocation"), "block_rows": t.get("block_rows"),
             "policy_state": t.get("policy_state"), "cost_shifts": t.get("cost_shifts"),
             "mem": [r(t.get("mem_used")), r(t.get("mem_limit"))],
             "ops": {n: {"capacity": r(o.get("capacity")), "running": r(o.get("running"), 2),
                         "util": r(o.get("util"), 2), "throttled": r(o.get("throttled"), 2),
                         "rows_out_total": r(o.get("rows_out_total")), "busy_s_total": r(o.get("busy_s_total"), 3),
                         "slot_s_total": r(o.get("slot_s_total"), 3)}
                     for n, o in (t.get("per_op") or {}).items()}}
            for t in ticks if t.get("per_op")]


def _mean_running(ticks: list[dict], after_frac: float) -> dict:
    if not ticks:
        return {}
    tail = ticks[int(after_frac * len(ticks)):]
    names = list(tail[0]["per_op"]) if tail else []
    return {n: round(float(np.mean([t["per_op"][n]["running"] for t in tail])), 2) for n in names}


def _occupied_slot_rates(ticks: list[dict], after_frac: float) -> dict:
    """Each operator's own output rows per occupied slot-second over the steady-state part:
    its real per-slot speed, which the YAML's costs (no per-task overheads) leave out."""
    rates = OccupiedSlotRates()
    for t in ticks[int(after_frac * len(ticks)):]:
        for n, op in t["per_op"].items():
            rates.add(n, op["out_rate"], op["running"])
    return rates.rates()


def effective_optimum(pipe: PipelineDef, runs: dict[str, list[dict]]) -> dict | None:
    """The best whole-slot allocation and its samples/s when every operator runs at the best
    occupied-slot rate any policy's run measured for it: the YAML's cost model with this
    machine's per-task overheads put back, and the most favourable reading of each."""
    best: dict[str, float] = {}
    for res in (r for rs in runs.values() for r in rs):
        for n, v in (res.get("rows_per_occupied_slot_s") or {}).items():
            best[n] = max(best.get(n, 0.0), v)
    if set(best) != {o.name for o in pipe.operators} or pipe.max_rows_per_block:
        return None  # resizable blocks: the runs' rates were measured at different sizes
    truth = pipe.ground_truth()
    for op in truth["ops"]:
        op["rate_per_slot"] = best[op["name"]]
    alloc, sps = from_profile(truth).optimum()
    return {"allocation": alloc, "samples_per_s": sps, "rows_per_occupied_slot_s": best,
            "note": "YAML costs with measured per-task overheads (best rate seen per operator)"}


def warm_up(n: int) -> None:
    """Start the worker processes once, so no policy pays their start-up."""
    import ray

    @ray.remote(num_cpus=1)
    def nap():
        time.sleep(2.0)
        return os.getpid()

    ray.get([nap.remote() for _ in range(n)])


def start_cluster(pipe: PipelineDef, kind: str):
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if kind == "local":
        ray.init(address="local", num_cpus=pipe.cluster.num_cpus, object_store_memory=pipe.cluster.object_store_mb * 1024**2,
                 include_dashboard=False, log_to_driver=False)
        return None
    from ray.cluster_utils import Cluster

    nodes = pipe.cluster.nodes
    per_node_store = max(100, pipe.cluster.object_store_mb // len(nodes)) * 1024**2
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": nodes[0],
                                                             "object_store_memory": per_node_store,
                                                             "include_dashboard": False})
    for n in nodes[1:]:
        cluster.add_node(num_cpus=n, object_store_memory=per_node_store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def oracle_fresh_runs(pipe: PipelineDef, kind: str, r: int, search: dict | None, results: dict[str, list[dict]],
                      initial: dict, args, pick: dict | None = None) -> dict:
    """The oracle's pick (its search run's, or ``pick``: an earlier round's winner, ``--oracle-search-rounds``),
    then every challenger's configuration (``challengers``), each held static in a fresh run of ``--run-s``;
    where challengers ran, the winner once more (``needs_confirmation``); ``adopt_fresh_runs`` makes the result."""
    def fresh_run(cfg: dict, what: str) -> dict:
        print(f"  [{kind} round {r + 1}] oracle, {what} fresh ({_config_text(cfg)}): {args.run_s:.0f} s ...",
              flush=True)
        run = run_one(pick_pipeline(pipe, cfg), "static", args.run_s, shift_at=None, plot_dir=None,
                      oracle_k=args.oracle_k, tag=f"{pipe.name}-{kind}{r}-fresh", steady_s=0.4 * args.run_s)
        print(f"     {run['samples_per_s']:,.0f} samples/s", flush=True)
        return run

    pick = pick or final_configuration(search)
    fresh = [(pick, fresh_run(pick, "its pick"))]
    threshold = oracle_winner(None, fresh)[1]  # the pick's fresh reading (a crash: every policy challenges it)
    for cfg in challengers(results, threshold, 0.4 * args.run_s, initial, skip=[pick]):
        fresh.append((cfg, fresh_run(cfg, "a configuration a policy measured above it")))
    confirm = None
    if needs_confirmation(fresh):
        winner = oracle_winner(search, fresh)[0]
        confirm = fresh_run(winner, "its winner again (its figure: a run that did not pick it)")
    out = adopt_fresh_runs(search, fresh, confirm)
    searched = "" if search is None else f"; its search run: {search['samples_per_s']:,.0f}"
    print(f"     the oracle's figure: {out['samples_per_s']:,.0f} samples/s from the {out['figure_from']}"
          f" (selected by the {out['selection']['from']}, {out['selection']['samples_per_s']:,.0f}{searched})",
          flush=True)
    return out


def reuses_oracle_pick(r: int, args, results: dict[str, list[dict]]) -> bool:
    """Round ``r`` (from 0) measures the oracle's earlier winner fresh instead of searching again: past the
    first ``--oracle-search-rounds`` rounds (0: every round searches), or from the first round where
    ``--oracle-pick`` names the winner of an earlier run. The search establishes which configuration is
    best; what the ratio to it needs after that is its figure measured in the same sitting as the policies'
    rounds, often enough to average the drift between runs out (a search round takes 3-4 times as long as a
    policy's run)."""
    if getattr(args, "oracle_pick", None) is not None:
        return True
    searched = getattr(args, "oracle_search_rounds", 0) or 0
    return 0 < searched <= r and bool(results.get("oracle")) and final_configuration(results["oracle"][-1]) is not None


def parse_oracle_pick(text: str, pipe: PipelineDef) -> dict:
    """``--oracle-pick`` as a configuration: slots per operator in the pipeline's order, ``/``-separated,
    and where the blocks are resizable ``@ROWS`` (``4/6/7/5/2``, ``3/4/9/5/3@8000``), as the benchmark
    prints configurations."""
    slots, _, rows = text.partition("@")
    names = [o.name for o in pipe.operators]
    try:
        counts = [int(x) for x in slots.split("/")]
        block_rows = int(rows) if rows else None
    except ValueError:
        raise ValueError(f"--oracle-pick {text!r}: expected slots per operator like "
                         f"{'/'.join(str(o.concurrency) for o in pipe.operators)} (and @ROWS)") from None
    if len(counts) != len(names) or min(counts) < 1:
        raise ValueError(f"--oracle-pick {text!r}: {len(names)} slot counts of 1 or more expected, one per operator"
                         f" ({', '.join(names)})")
    if block_rows is not None and not pipe.max_rows_per_block:
        raise ValueError(f"--oracle-pick {text!r}: {pipe.name}'s blocks are not resizable; drop @{rows}")
    return {"allocation": dict(zip(names, counts)), "block_rows": block_rows}


def run_suite(pipe: PipelineDef, kind: str, policies: list[str], args) -> dict:
    import ray

    data_cpus = pipe.cluster.data_cpus
    if kind == "multinode":
        total = sum(pipe.cluster.nodes)
        if total < data_cpus + 1:
            raise SystemExit(f"cluster.nodes give {total} CPUs, fewer than data_cpus={data_cpus} + 1")
    cluster = start_cluster(pipe, kind)
    try:
        print(f"\n== {kind}: {ray.cluster_resources().get('CPU'):g} logical CPUs"
              f" ({len(pipe.cluster.nodes) if kind == 'multinode' else 1} node(s)), pipeline budget {data_cpus:g}")
        warm_up(int(data_cpus))
        results: dict[str, list[dict]] = {p: [] for p in policies}
        initial = {"allocation": {op.name: op.concurrency for op in pipe.operators},
                   "block_rows": pipe.rows_per_block if pipe.max_rows_per_block else None}
        ceiling: list[dict] = []
        shift_results: dict[str, list[dict]] = {p: [] for p in policies}
        for r in range(args.rounds):
            order = policies if r % 2 == 0 else list(reversed(policies))
            # the oracle runs last: it re-measures every other policy's final allocation among its finalists
            order = [p for p in order if p != "oracle"] + (["oracle"] if "oracle" in order else [])
            for pol in order:
                if pol == "oracle" and reuses_oracle_pick(r, args, results):
                    # no search this round: the last round's winner, fresh, beside this round's challengers
                    if results["oracle"]:
                        pick, why = final_configuration(results["oracle"][-1]), "the last round's winner"
                    else:
                        pick, why = args.oracle_pick, "--oracle-pick"
                    print(f"  [{kind} round {r + 1}] oracle: no search; {why} {_config_text(pick)} fresh", flush=True)
                    results[pol].append(oracle_fresh_runs(pipe, kind, r, None, results, initial, args, pick=pick))
                    continue
                must_beat = [c for p in order if p != pol and results[p]
                             for c in steady_configurations(results[p][-1], 0.4 * args.run_s, initial)]
                must_beat = [a for i, a in enumerate(must_beat) if a and a not in must_beat[:i]]
                search_s = oracle_search_s(args.oracle_k, len(must_beat), len(block_row_sizes(pipe)))
                run_s = args.run_s + (search_s if pol == "oracle" else 0.0)
                print(f"  [{kind} round {r + 1}] {pol}: {run_s:.0f} s ...", flush=True)
                # every policy's steady state is the same last 40% of args.run_s (after the oracle's search)
                res = run_one(pipe, pol, run_s, shift_at=None, plot_dir=args.plot_dir, oracle_k=args.oracle_k,
                              tag=f"{pipe.name}-{kind}{r}", steady_s=0.4 * args.run_s,
                              must_beat=must_beat if pol == "oracle" else None)
                rows = f", blocks of {res['final_block_rows']:,} rows" if res.get("final_block_rows") else ""
                # the pipeline's own start (Ray's workers) is inside the 95% figure: shown beside it
                first = f" (first row at {res['first_row_s']:.1f} s)" if res.get("first_row_s") is not None else ""
                print(f"     {res['samples_per_s']:,.0f} samples/s, 95% after {res['seconds_to_95pct']} s{first},"
                      f" stalls {res['stalls']}, crash {res['crash']}, final {res['final_allocation']}{rows}", flush=True)
                if pol == "oracle" and args.oracle_fresh_pick and final_configuration(res):
                    res = oracle_fresh_runs(pipe, kind, r, res, results, initial, args)
                results[pol].append(res)
            if r == 0 and args.ceiling:
                print(f"  [{kind}] overhead ceiling: the same pipeline, operators that cost nothing,"
                      f" {args.run_s:.0f} s ...", flush=True)
                res = run_one(pipe, "static", args.run_s, shift_at=None, plot_dir=None, oracle_k=args.oracle_k,
                              tag=f"{pipe.name}-{kind}-ceiling", steady_s=0.4 * args.run_s, cost_scale=0.0)
                print(f"     {res['samples_per_s']:,.0f} samples/s", flush=True)
                ceiling.append(res)
            if pipe.shift is not None and not args.no_shift:
                for pol in order:
                    if pol == "oracle":
                        continue  # its search is a one-off; it does not re-adapt by design
                    run_s = args.shift_run_s
                    print(f"  [{kind} round {r + 1}] shift scenario, {pol}: {run_s:.0f} s ...", flush=True)
                    res = run_one(pipe, pol, run_s, shift_at=pipe.shift.at_s, plot_dir=args.plot_dir,
                                  oracle_k=args.oracle_k, tag=f"{pipe.name}-{kind}{r}-shift")
                    print(f"     pre {res['pre_shift_samples_per_s']:,.0f} -> post {res['post_shift_samples_per_s']:,.0f}"
                          f" samples/s, recovery {res['recovery_s']} s (one window: {res['recovery_single_window_s']} s,"
                          f" strict {res['recovery_strict_s']} s),"
                          f" last move {res['last_move_s']} s after the shift, stalls {res['stalls']}",
                          flush=True)
                    shift_results[pol].append(res)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return {"runs": results, "shift_runs": shift_results, "ceiling_runs": ceiling}


def suite_run_noise(runs: dict[str, list[dict]]) -> dict:
    """The run-to-run spread (:func:`run_noise`) of one pipeline's runs: every policy's rounds, the oracle's
    included (its figure each round). The 5 s intervals within a run are far narrower than the drift
    between runs on a shared machine (per_task_overhead: rl's configuration held static measured
    14,220-16,920 samples/s in six fresh runs, each with a half-width near 1,500), so the oracle check
    compares figures over runs once anything was repeated (``--rounds`` 2 or more). Runs that stalled or
    crashed are failures, counted as such, not spread."""
    return run_noise({p: [r["samples_per_s"] for r in rs
                          if not r.get("crash") and not r.get("stalls") and r.get("samples_per_s") is not None]
                      for p, rs in runs.items()})


def paired_ratios(runs: dict[str, list[dict]], policy: str = "rl", base: str = "oracle") -> dict | None:
    """``policy``'s samples/s over ``base``'s round by round (each round runs both in one sitting, so a ratio
    cancels the drift between rounds that the two means carry): the ratios, their mean and its 95%
    half-width over rounds (Student t; infinite with one round). None where either did not run."""
    pairs = [(a["samples_per_s"], b["samples_per_s"]) for a, b in zip(runs.get(policy, []), runs.get(base, []))
             if a.get("samples_per_s") is not None and b.get("samples_per_s")]
    if not pairs:
        return None
    ratios = [a / b for a, b in pairs]
    return {"ratios": ratios, **mean_ci(ratios)}


def summarise(pipe: PipelineDef, suite: dict, policies: list[str]) -> dict:
    runs, shifts = suite["runs"], suite["shift_runs"]
    thr = {p: float(np.mean([r["samples_per_s"] for r in runs[p]])) for p in policies if runs[p]}
    t95 = {p: [r["seconds_to_95pct"] for r in runs[p]] for p in policies if runs[p]}
    out = {
        "throughput": thr,
        "throughput_per_round": {p: [r["samples_per_s"] for r in runs[p]] for p in policies if runs[p]},
        "seconds_to_95pct": {p: (float(np.mean([x for x in v if x is not None])) if any(x is not None for x in v)
                                 else None) for p, v in t95.items()},
        "peak_object_store_bytes": {p: max(r["peak_object_store_bytes"] for r in runs[p]) for p in policies if runs[p]},
        "final_allocation": {p: runs[p][-1]["final_allocation"] for p in policies if runs[p]},
        "final_block_rows": {p: runs[p][-1].get("final_block_rows") for p in policies if runs[p]},
        "observed_tasks_running": {p: runs[p][-1].get("observed_tasks_running") for p in policies if runs[p]},
        "stalls_per_policy": {p: sum(r["stalls"] for r in runs[p]) + sum(r["stalls"] for r in shifts.get(p, []))
                              for p in policies},
        "crashes": {p: [r["crash"] for r in runs[p] + shifts.get(p, []) if r["crash"]] for p in policies},
        "shift": {
            p: {
                "pre_shift_samples_per_s": float(np.mean([r["pre_shift_samples_per_s"] for r in shifts[p]])),
                "recovered_samples_per_s": float(np.mean([r["post_shift_samples_per_s"] for r in shifts[p]])),
                "recovery_s": [r["recovery_s"] for r in shifts[p]],
                "recovery_strict_s": [r.get("recovery_strict_s") for r in shifts[p]],
                "recovery_single_window_s": [r.get("recovery_single_window_s") for r in shifts[p]],
                "last_move_s": [r.get("last_move_s") for r in shifts[p]],
            }
            for p in policies if shifts.get(p)
        },
    }
    out["stalls"] = int(sum(out["stalls_per_policy"].values()))
    out["oracle_runs"] = [{"search_run_samples_per_s": (r["search_run"] or {}).get("samples_per_s"),
                           "fresh_runs": [(_config_text(f["configuration"]), f["samples_per_s"]) for f in r["fresh_runs"]],
                           "confirmation_samples_per_s": (r.get("confirmation_run") or {}).get("samples_per_s"),
                           "samples_per_s": r["samples_per_s"], "figure_from": r["figure_from"],
                           "selected_by": r.get("selection", {}).get("from")}
                          for r in runs.get("oracle", []) if "fresh_runs" in r]
    paired = paired_ratios(runs)
    if paired is not None:
        out["rl_vs_oracle_per_round"] = paired
    # every policy's steady state as per-interval samples (pooled over rounds): mean and 95% CI
    out["steady_ci"] = {p: mean_ci([x for r in runs[p] for x in r.get("interval_samples_per_s", [])])
                        for p in policies if runs[p]}
    out["run_noise"] = suite_run_noise(runs)
    out["run_ci"] = {p: run_figure([r["samples_per_s"] for r in runs[p]], out["run_noise"], out["steady_ci"][p]["ci95"])
                     for p in policies if runs[p]}
    out["oracle_check"] = oracle_check(out["run_ci"])
    out["oracle_check"]["noise"] = next(iter(out["run_ci"].values()))["noise"] if out["run_ci"] else None
    if suite.get("ceiling_runs"):
        # Ray Data's own per-block work on this machine, with operators that cost nothing: no
        # allocation of slots to costly operators can deliver more than this
        ceil_sps = float(np.mean([r["samples_per_s"] for r in suite["ceiling_runs"]]))
        out["overhead_ceiling_samples_per_s"] = ceil_sps
        if thr.get("ray_default"):
            out["ceiling_vs_ray_default"] = ceil_sps / thr["ray_default"]
    rl = thr.get("rl")
    for base in ("oracle", "ray_default", "plumber", "hill_climb", "static"):
        if rl is not None and thr.get(base):
            out[f"rl_vs_{base}"] = rl / thr[base]
    out["rl_seconds_to_95pct"] = out["seconds_to_95pct"].get("rl")
    opt_alloc, opt = expected_optimum(pipe)
    out["model_optimum"] = {"allocation": opt_alloc, "samples_per_s": opt,
                            "note": "true cost model, no Ray overheads: an upper bound"}
    if out["shift"] and pipe.shift is not None:
        # a recovery is timed to the level a policy reached after the shift: one that never recovers reaches
        # its low level at once, so each level is also put against the model's optimum before and after
        post_alloc, post_opt = expected_optimum(pipe.shifted())
        out["shift_model_optimum"] = {"allocation": post_alloc, "samples_per_s": post_opt}
        for v in out["shift"].values():
            v["pre_share_of_model_optimum"] = v["pre_shift_samples_per_s"] / opt if opt > 0 else None
            v["recovered_share_of_model_optimum"] = (v["recovered_samples_per_s"] / post_opt if post_opt > 0
                                                     else None)
    eff = effective_optimum(pipe, runs)
    if eff is not None:
        out["effective_optimum"] = eff
        for base in ("ray_default", "plumber"):
            if thr.get(base):
                out[f"effective_optimum_vs_{base}"] = eff["samples_per_s"] / thr[base]
    return out


def print_table(kind: str, s: dict, policies: list[str]) -> None:
    print(f"\n== {kind} results")
    print(f"{'policy':<12}{'samples/s':>11}{'vs rl':>8}{'t95 (s)':>9}{'peak obj store':>16}{'stalls':>8}  final allocation")
    rl = s["throughput"].get("rl")
    for p in policies:
        if p not in s["throughput"]:
            continue
        v = s["throughput"][p]
        t95 = s["seconds_to_95pct"].get(p)
        rows = (s.get("final_block_rows") or {}).get(p)
        print(f"{p:<12}{v:>11,.0f}{(rl / v if rl and v else float('nan')):>8.2f}"
              f"{(f'{t95:.0f}' if t95 is not None else 'n/a'):>9}"
              f"{s['peak_object_store_bytes'][p] / 2**20:>13,.0f} MB{s['stalls_per_policy'][p]:>8}"
              f"  {s['final_allocation'][p]}" + (f", blocks of {rows:,} rows" if rows else ""))
    for k in ("rl_vs_oracle", "rl_vs_ray_default", "rl_vs_plumber", "rl_vs_hill_climb", "rl_vs_static"):
        if k in s:
            print(f"{k}: {s[k]:.3f}")
    print(f"model optimum (no overheads): {s['model_optimum']['samples_per_s']:,.0f} samples/s at"
          f" {s['model_optimum']['allocation']}")
    if "effective_optimum" in s:
        e = s["effective_optimum"]
        print(f"effective optimum (YAML costs + measured per-task overheads): {e['samples_per_s']:,.0f} samples/s"
              f" at {e['allocation']}"
              + "".join(f"; {v:.2f}x {b}" for b in ("ray_default", "plumber")
                        if (v := s.get(f"effective_optimum_vs_{b}")) is not None))
    if "overhead_ceiling_samples_per_s" in s:
        print(f"overhead ceiling (operators cost nothing): {s['overhead_ceiling_samples_per_s']:,.0f} samples/s"
              + (f" = {s['ceiling_vs_ray_default']:.2f}x ray_default (what Ray Data itself can move here)"
                 if "ceiling_vs_ray_default" in s else ""))
    if s["shift"]:
        print("shift scenario: recovery to 95% of the post-shift steady state"
              + (f" (model optimum after the shift {m['samples_per_s']:,.0f} samples/s at {m['allocation']})"
                 if (m := s.get("shift_model_optimum")) else ""))
        for p, v in s["shift"].items():
            share = ("" if v.get("recovered_share_of_model_optimum") is None else
                     f" ({v['pre_share_of_model_optimum']:.2f} / {v['recovered_share_of_model_optimum']:.2f} of the"
                     " model optimum before / after)")
            print(f"  {p:<12} pre {v['pre_shift_samples_per_s']:>8,.0f}  recovered {v['recovered_samples_per_s']:>8,.0f}"
                  f" samples/s{share}  recovery {v['recovery_s']} s"
                  + (f" (one window: {v['recovery_single_window_s']} s)" if v.get("recovery_single_window_s") else "")
                  + (f" (strict: {v['recovery_strict_s']} s)" if v.get("recovery_strict_s") else "")
                  + (f"; last move {v['last_move_s']} s after the shift" if v.get("last_move_s") else ""))
    for o in s.get("oracle_runs", []):
        searched = ("no search (an earlier round's pick)" if o["search_run_samples_per_s"] is None
                    else f"{o['search_run_samples_per_s']:,.0f} samples/s at the end of its search run")
        confirmed = ("" if o.get("confirmation_samples_per_s") is None
                     else f"; confirmation {o['confirmation_samples_per_s']:,.0f}")
        print(f"oracle: {searched}; fresh: " + ", ".join(f"{c} {v:,.0f}" for c, v in o["fresh_runs"]) + confirmed
              + f"; its figure {o['samples_per_s']:,.0f} from the {o['figure_from']}"
              + (f" (selected by the {o['selected_by']})" if o.get("selected_by") else ""))
    if (pr := s.get("rl_vs_oracle_per_round")) is not None:
        half = "" if not math.isfinite(pr["ci95"]) else f" +- {pr['ci95']:.3f} (95% CI over {pr['n']} rounds)"
        print("rl / oracle, round by round: " + ", ".join(f"{v:.3f}" for v in pr["ratios"])
              + f"; mean {pr['mean']:.3f}{half}")
    print(f"stalls: {s['stalls']}, crashes: { {p: c for p, c in s['crashes'].items() if c} }")
    print("steady state, 95% CI over " f"{ORACLE_BIN_S:g} s intervals: "
          + ", ".join(f"{p} {v['mean']:,.0f} +- {v['ci95']:,.0f}" for p, v in s.get("steady_ci", {}).items()))
    if s.get("run_ci"):
        noise = s.get("run_noise") or {}
        how = (f"pooled run-to-run spread {noise['rel_sd']:.1%} of the mean over {noise['df']} degrees of freedom"
               if noise.get("df") else "nothing repeated (--rounds 1): the intervals stand in, too narrow")
        print(f"over runs, 95% CI ({how}): "
              + ", ".join(f"{p} {v['mean']:,.0f} +- {v['ci95']:,.0f}" for p, v in s["run_ci"].items()))
    check = s.get("oracle_check") or {}
    if check.get("checked"):
        print("oracle check: " + ("ok, no policy beats the oracle by more than the noise" if check["ok"]
                                  else "FAILED: " + "; ".join(v["message"] for v in check["violations"])))


def simulated_suite(pipe: PipelineDef, policies: list[str], args) -> dict:
    """The same comparison in the pipeline simulator calibrated with the YAML's true costs
    (block-granular, noisy counters): the policies' logic without this machine's noise."""
    out: dict = {"throughput": {}, "seconds_to_95pct": {}, "shift": {}}
    steps = int(args.run_s)
    with tempfile.TemporaryDirectory(prefix="tuner-sim-") as tmp:
        for pol in policies:
            _simulate_policy(pipe, pol, args, steps, Path(tmp), out)
    # the simulator knows the true optimum (its oracle measures noisy windows, and may pick below it)
    out["optimum_samples_per_s"] = expected_optimum(pipe)[1]
    rl = out["throughput"].get("rl")
    for base in ("oracle", "plumber", "hill_climb", "static"):
        if rl and out["throughput"].get(base):
            out[f"rl_vs_{base}"] = rl / out["throughput"][base]
    return out


def _simulate_policy(pipe: PipelineDef, pol: str, args, steps: int, tmp: Path, out: dict) -> None:
    """One policy's simulated runs (3 seeds; then 3 with the cost shift) into ``out``."""
    if pol == "ray_default":
        return  # Ray's own autoscaler is not simulated
    opts = dict(RL_OPTIONS) if pol == "rl" else {}
    extra = 0
    if pol == "oracle":
        opts = {"oracle_candidates": oracle_shortlist(pipe, args.oracle_k), "oracle_measure_s": 5.0}
        extra = int(args.oracle_k * 5 + 10)
        if pipe.max_rows_per_block:
            extra += int(len(block_row_sizes(pipe)) * 13 + 30)
    vals, t95s = [], []
    for seed in range(3):
        thr, _ = _sim_trace(pipe, pol, opts, args, tmp, seed, steps + extra)
        final = float(thr[int(0.6 * len(thr)):].mean())
        vals.append(final)
        t95s.append(_seconds_to(thr, 0.95 * final))
    out["throughput"][pol] = float(np.mean(vals))
    out["seconds_to_95pct"][pol] = float(np.mean([t for t in t95s if t is not None])) if any(t95s) else None
    if pipe.shift is not None and pol != "oracle":
        at = int(pipe.shift.at_s)
        recs, posts = [], []
        for seed in range(3):
            thr, t_opt = _sim_trace(pipe, pol, opts, args, tmp, seed, int(args.shift_run_s), shift_at=at)
            post = float(thr[at + int(0.6 * (len(thr) - at)):].mean())
            recs.append(_seconds_to(thr[at:], 0.95 * post))
            posts.append(post)
        out["shift"][pol] = {"recovered_samples_per_s": float(np.mean(posts)), "recovery_s": recs,
                             "post_shift_optimum": t_opt}


def _sim_trace(pipe: PipelineDef, pol: str, opts: dict, args, tmp: Path, seed: int, steps: int,
               shift_at: int | None = None) -> tuple[np.ndarray, float]:
    """One simulated run of ``pol``: its samples/s per step and the (post-shift) optimum at the end; the
    control files in a directory of its own under ``tmp``; the YAML's cost shift at ``shift_at``."""
    from dlrm_platform.tuner.simulator import run_controller_in_sim
    from dlrm_platform.tuner.spec import TunerSpec

    sim = from_profile(pipe.ground_truth())
    spec = TunerSpec(f"{'sims' if shift_at is not None else 'sim'}-{pol}", pol, sim.budget, pipe.op_specs(),
                     options=dict(opts), policy_path=args.rl_policy if pol == "rl" else None,
                     block_rows=block_rows_spec(pipe, Path(tempfile.mkdtemp(dir=tmp))))
    shift = (pipe.shift.operator, pipe.shift.factor) if shift_at is not None else None
    tr = run_controller_in_sim(sim, spec, steps=steps, seed=seed, shift_at=shift_at, shift=shift)
    return np.array([x["throughput"] for x in tr]), tr[-1]["t_opt"]


def _seconds_to(thr: np.ndarray, level: float) -> float | None:
    """Steps (one per second) until a simulated run first reached ``level`` (None: never)."""
    hit = np.flatnonzero(thr >= level)
    return float(hit[0] + 1) if len(hit) else None


ABLATION_RUNNERS = ("net", "no_net", "random_net")


def ablation_sim(seeds: list[int], n_pipelines: int, mix: str = DEFAULT_MIX, policy_path: str | None = None) -> dict:
    """The learned net against no net and a random net (all behind the same gate and shield)
    and plumber, on held-out random simulated pipelines: ``n_pipelines`` per seed from the
    pipeline mix ``mix`` (``simulator.PIPELINE_MIXES``), pooled. ``policy_path``: the net to
    test (a ``tuner train --out`` directory); the shipped one when None."""
    from dlrm_platform.tuner.rl import RLPolicyRunner
    from dlrm_platform.tuner.rl_train import ablation_runners, evaluate_policies, paired_difference

    net = RLPolicyRunner.load(policy_path).net if policy_path else None
    pooled: dict[str, dict] = {}
    per_seed = []
    for seed in seeds:
        res = evaluate_policies(ablation_runners(net), baselines=("plumber",), n_pipelines=n_pipelines, seed=seed,
                                mix=mix, rl_options=RL_OPTIONS)
        per_seed.append({"seed": seed, **{p: {k: v for k, v in row.items() if k != "per_pipeline"}
                                          for p, row in res["policies"].items()}})
        for pol, row in res["policies"].items():
            acc = pooled.setdefault(pol, {"per_pipeline": [], "steady": [], "shifted": [],
                                          "gate_hold_share": [], "veto_share_of_wanted_moves": []})
            acc["per_pipeline"] += row["per_pipeline"]
            n = len(row["per_pipeline"])
            acc["steady"] += [x for i, x in enumerate(row["per_pipeline"]) if i % 2 == 0]
            acc["shifted"] += [x for i, x in enumerate(row["per_pipeline"]) if i % 2 == 1]
            for k in ("gate_hold_share", "veto_share_of_wanted_moves"):
                if k in row:
                    acc[k].append(row[k] * n)
    total = len(seeds) * n_pipelines
    out: dict = {"seeds": seeds, "pipelines": total, "mix": mix, "policy": policy_path or "shipped",
                 "share_of_optimum": {}, "per_seed": per_seed}
    for pol, acc in pooled.items():
        row = {"mean": float(np.mean(acc["per_pipeline"])), "steady": float(np.mean(acc["steady"])),
               "shifted": float(np.mean(acc["shifted"]))}
        for k in ("gate_hold_share", "veto_share_of_wanted_moves"):
            if acc[k]:
                row[k] = float(sum(acc[k]) / total)
        out["share_of_optimum"][pol] = row
    pp = {pol: acc["per_pipeline"] for pol, acc in pooled.items()}
    out["paired"] = {f"net_vs_{b}": paired_difference(pp["net"], pp[b]) for b in ("no_net", "random_net", "plumber")}
    out["paired"]["no_net_vs_plumber"] = paired_difference(pp["no_net"], pp["plumber"])
    d = out["paired"]["net_vs_no_net"]
    out["net_beats_no_net"] = bool(d["mean"] > 2 * d["se"])
    return out


def print_ablation_sim(a: dict) -> None:
    print(f"\n== ablation, simulated: {a['pipelines']} held-out random pipelines (mix {a['mix']}, seeds"
          f" {a['seeds']}; net: {a['policy']}), share of the optimum over the last 20 of 90 steps")
    print(f"  {'policy':<12}{'all':>8}{'steady':>8}{'shifted':>9}{'gate held':>11}{'net vetoed':>12}")
    for pol, row in a["share_of_optimum"].items():
        gate = row.get("gate_hold_share")
        veto = row.get("veto_share_of_wanted_moves") if pol != "no_net" else None
        print(f"  {pol:<12}{row['mean']:>8.3f}{row['steady']:>8.3f}{row['shifted']:>9.3f}"
              f"{(f'{gate:.0%}' if gate is not None else '-'):>11}{(f'{veto:.0%}' if veto is not None else '-'):>12}")
    for k, d in a["paired"].items():
        print(f"  {k:<20} mean difference {d['mean']:+.4f} (se {d['se']:.4f}), wins/losses/ties"
              f" {d['wins']}/{d['losses']}/{d['ties']}")
    print("  the learned net " + ("beats" if a["net_beats_no_net"] else "does NOT clearly beat")
          + " the no-net rule (mean paired difference > 2 standard errors)")


def ablation_live(pipe: PipelineDef, kind: str, args) -> dict:
    """The ablation's four, live on the benchmark pipeline (``args.run_s`` each, one after another)."""
    import ray

    from dlrm_platform.tuner.rl_train import ablation_runners

    runners = ablation_runners()
    keys = {name: r.register(f"<ablation {name}>") for name, r in runners.items()}
    cluster = start_cluster(pipe, kind)
    out: dict = {"samples_per_s": {}, "final_allocation": {}, "decisions": {}}
    try:
        warm_up(int(pipe.cluster.data_cpus))
        for name in (*ABLATION_RUNNERS, "plumber"):
            pol = "plumber" if name == "plumber" else "rl"
            print(f"  [{kind} ablation] {name}: {args.run_s:.0f} s ...", flush=True)
            res = run_one(pipe, pol, args.run_s, shift_at=None, plot_dir=args.plot_dir, oracle_k=args.oracle_k,
                          tag=f"{pipe.name}-{kind}-ablation-{name}", steady_s=0.4 * args.run_s, policy_path=keys.get(name))
            out["samples_per_s"][name] = res["samples_per_s"]
            out["final_allocation"][name] = res["final_allocation"]
            out["decisions"][name] = res["decisions"]
            print(f"     {res['samples_per_s']:,.0f} samples/s, final {res['final_allocation']},"
                  f" {res['decisions']} decisions", flush=True)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    base = out["samples_per_s"].get("no_net")
    out["vs_no_net"] = {k: v / base for k, v in out["samples_per_s"].items()} if base else {}
    return out


def compare(pipe: PipelineDef, policies: list[str], args, kinds: list[str]) -> dict:
    """Every policy on one pipeline: in the simulator, then live on each cluster kind of ``kinds``."""
    report: dict = {"pipeline": pipe.name}
    sim = simulated_suite(pipe, policies, args)
    print(f"\n== {pipe.name}, simulated (true cost model, block-granular noisy counters; no Ray)")
    for p, v in sim["throughput"].items():
        print(f"  {p:<12}{v:>10,.0f} samples/s   95% after {sim['seconds_to_95pct'][p]} s"
              + (f"   shift: recovers to {sim['shift'][p]['recovered_samples_per_s']:,.0f} in"
                 f" {sim['shift'][p]['recovery_s']} s" if p in sim["shift"] else ""))
    for k in ("rl_vs_oracle", "rl_vs_plumber", "rl_vs_hill_climb", "rl_vs_static"):
        if k in sim:
            print(f"  {k}: {sim[k]:.3f}")
    report["simulated"] = sim
    for kind in kinds:
        suite = run_suite(pipe, kind, policies, args)
        s = summarise(pipe, suite, policies)
        print_table(kind, s, policies)
        report[kind] = {**s, "raw": suite}
    return report


# --------------------------------------------------------------------------- the real job pipelines

JOB_PIPELINES = ("demo", "criteo_shaped")


def _tuner_job():
    """``benchmarks/tuner_job.py`` as a module (by path, as it loads this one)."""
    import importlib.util

    name = "_bench_tuner_job"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "tuner_job.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def job_pipeline_report(dataset: str, policies: list[str], args) -> dict:
    """Every policy on a real job pipeline (``dataset``: the demo's sessions, or Criteo-shaped ones), its
    operators as ``dlrm-platform run`` builds them under each policy (fused under ``static`` and ``auto``,
    split under the policies that steer operators one by one): the train pipeline alone for
    ``--job-pipeline-s`` against the pipeline oracle (static configurations and every policy's final task
    counts, the best re-measured with every policy over ``--job-pipeline-rounds`` interleaved rounds:
    ``tuner_job.pipeline_comparison``), then the policy's 2-epoch jobs for
    the data-wait fraction (``local`` in the report: one machine, real Ray)."""
    tj = _tuner_job()
    job_policies = tuple(p for p in tj.JOB_POLICIES if p in policies or p == "auto")
    job_args = argparse.Namespace(samples=args.job_samples, pipeline_s=args.job_pipeline_s,
                                  policy_reps=args.job_policy_reps,
                                  job_pipeline_rounds=getattr(args, "job_pipeline_rounds", 1))
    workdir = Path(args.job_workdir or tempfile.mkdtemp(prefix="dlrm-tuner-suite-")) / dataset
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"\n== job:{dataset}: policies {', '.join(job_policies)} on the job's own pipeline", flush=True)
    rep = tj.suite_entry(dataset, job_policies, job_args, workdir)
    tj.print_suite_entry(f"job:{dataset}", rep)
    return {"pipeline": f"job:{dataset}",
            "local": {"throughput": rep["throughput"], "data_wait": rep["data_wait"],
                      "job_samples_per_s": rep["job_samples_per_s"], "oracle_check": rep["oracle_check"],
                      "raw": rep}}


# The targets over the suite: rl against the oracle on every pipeline, and its geometric mean
# over the pipelines against plumber's and Ray Data's own autoscaling.
SUITE_TARGETS = {"rl_vs_oracle_min": 0.95, "rl_vs_plumber_geomean": 1.05, "rl_vs_ray_default_geomean": 1.3}
SUITE_BASELINES = ("optimum", "oracle", "plumber", "ray_default", "hill_climb", "static")


def suite_summary(reports: dict[str, dict]) -> dict:
    """Per source (``simulated``, ``local``, ``multinode``): rl's ratio to each baseline on every
    pipeline, their geometric means over the pipelines, and which targets they meet."""
    out: dict = {}
    for source in ("simulated", "local", "multinode"):
        per, best_over = {}, {}
        for name, rep in reports.items():
            thr = dict(rep.get(source, {}).get("throughput", {}))
            if rep.get(source, {}).get("optimum_samples_per_s"):  # simulated: the exact optimum
                thr["optimum"] = rep[source]["optimum_samples_per_s"]
            if thr.get("rl"):
                per[name] = {f"rl_vs_{b}": thr["rl"] / thr[b] for b in SUITE_BASELINES if thr.get(b)}
                best = thr.get("optimum") or thr.get("oracle")
                if best:
                    best_over[name] = {f"rl_vs_{b}": best / thr[b] for b in SUITE_BASELINES if thr.get(b)}
        if not per:
            continue
        keys = sorted({k for v in per.values() for k in v})
        geo = {k: float(np.exp(np.mean([np.log(v[k]) for v in per.values() if k in v]))) for k in keys}
        # The same geometric means for the best configuration the run found (the exact optimum where
        # simulated, else the oracle), over the pipelines each mean covers: what a policy that matched
        # it everywhere would show. A target above its headroom is out of reach in this run.
        headroom = {k: float(np.exp(np.mean([np.log(best_over[n][k]) for n, v in per.items() if k in v])))
                    for k in keys if all(k in best_over.get(n, {}) for n, v in per.items() if k in v)}
        vs_oracle = [v["rl_vs_oracle"] for v in per.values() if "rl_vs_oracle" in v]
        figures = {"rl_vs_oracle_min": min(vs_oracle) if vs_oracle else None,
                   "rl_vs_plumber_geomean": geo.get("rl_vs_plumber"),
                   "rl_vs_ray_default_geomean": geo.get("rl_vs_ray_default")}
        out[source] = {"per_pipeline": per, "geomean": geo, "headroom": headroom, "targets": {
            k: {"target": t, "measured": figures[k], "met": figures[k] is not None and figures[k] >= t,
                "headroom": headroom.get(k.removesuffix("_geomean")) if k.endswith("_geomean") else None}
            for k, t in SUITE_TARGETS.items()}}
    return out


def print_suite(summary: dict) -> None:
    for source, s in summary.items():
        keys = [f"rl_vs_{b}" for b in SUITE_BASELINES if any(f"rl_vs_{b}" in v for v in s["per_pipeline"].values())]
        print(f"\n== suite, {source}: rl's samples/s over each baseline's")
        print(f"{'pipeline':<22}" + "".join(f"{k[6:]:>13}" for k in keys))
        for name, v in s["per_pipeline"].items():
            print(f"{name:<22}" + "".join(f"{v[k]:>13.3f}" if k in v else f"{'-':>13}" for k in keys))
        print(f"{'geometric mean':<22}" + "".join(f"{s['geomean'][k]:>13.3f}" for k in keys))
        print(f"{'  the best found':<22}" + "".join(
            f"{s['headroom'][k]:>13.3f}" if k in s["headroom"] else f"{'-':>13}" for k in keys))
        for k, t in s["targets"].items():
            m, h = t["measured"], t.get("headroom")
            reach = "" if h is None else (f"; the best configuration found: {h:.3f}"
                                          + (", so no policy could meet it in this run" if h < t["target"] else ""))
            print(f"  {k} >= {t['target']}: " + ("not measured" if m is None else
                                                  f"{m:.3f} ({'met' if t['met'] else 'NOT met'}{reach})"))


def parse_rl_options(items: list[str]) -> dict:
    """``--rl-option KEY=VALUE`` items as rl policy options (each value parsed as YAML)."""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--rl-option {item!r}: expected KEY=VALUE, e.g. rl_judge_warmup_s=10")
        out[key.strip()] = yaml.safe_load(value)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", default=str(ROOT / "benchmarks/pipelines/dlrm_preprocessing.yaml"))
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--run-s", type=float, default=100.0)
    ap.add_argument("--shift-run-s", type=float, default=130.0)
    ap.add_argument("--no-shift", action="store_true")
    ap.add_argument("--cluster", choices=["local", "multinode", "both"], default="local")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--oracle-k", type=int, default=8)
    ap.add_argument("--oracle-shortlist", choices=["measured", "truth"], default="measured",
                    help="oracle: score every allocation by the live-measured model (default) or by the"
                    " YAML's overhead-free true costs, then measure the best --oracle-k live")
    ap.add_argument("--no-oracle-fresh-pick", dest="oracle_fresh_pick", action="store_false",
                    help="skip the oracle's fresh runs (its pick, and every configuration a policy measured above it,"
                         " held static in a fresh run of --run-s each; the best of those and its search run's steady"
                         " state is its winner, whose figure is a run that did not select it)")
    ap.add_argument("--oracle-search-rounds", type=int, default=0, metavar="N",
                    help="the oracle searches in the first N rounds only; later rounds measure its last winner fresh"
                         " (and every configuration a policy measured above it) beside the policies' rounds"
                         " (0, the default: every round searches)")
    ap.add_argument("--oracle-pick", metavar="SLOTS",
                    help="no oracle search: this configuration (an earlier run's winner, as printed: 4/6/7/5/2, with"
                         " @ROWS where the blocks are resizable) measured fresh in every round, with every configuration"
                         " a policy measured above it")
    ap.add_argument("--plot-dir", type=Path, default=ROOT / "runs" / "bench" / "tuner")
    ap.add_argument("--sim-only", action="store_true", help="only the simulated comparison (seconds, no Ray)")
    ap.add_argument("--ablation", action="store_true",
                    help="instead of the comparison: the rl policy with its net, with no net, with a random net,"
                    " and plumber (simulated on held-out pipelines; then live unless --sim-only)")
    ap.add_argument("--ablation-seeds", default="123,7", help="seeds of the held-out simulated pipelines")
    ap.add_argument("--ablation-pipelines", type=int, default=48, help="simulated pipelines per seed")
    ap.add_argument("--ablation-mix", default=DEFAULT_MIX, choices=sorted(PIPELINE_MIXES),
                    help="the simulated pipelines' distribution (simulator.PIPELINE_MIXES; v1: the first one)")
    ap.add_argument("--rl-policy", metavar="PATH",
                    help="the RL net to test, simulated (--sim-only suite and ablation; a `dlrm-platform tuner train"
                         " --out` directory); default: the shipped one")
    ap.add_argument("--rl-judge-moves", action="store_true",
                    help="rl judges its moves by the throughput they delivered (policy option rl_judge_moves; "
                         "off by default: see tuner/README.md, End-to-end judgement)")
    ap.add_argument("--rl-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a policy option for rl (repeatable; the value parsed as YAML), e.g. rl_judge_warmup_s=10")
    ap.add_argument("--suite", action="store_true",
                    help="every pipeline under benchmarks/pipelines/ (instead of --pipeline), then rl's ratios to"
                    " each baseline per pipeline and their geometric means, against the targets")
    ap.add_argument("--jobs", default=",".join(JOB_PIPELINES),
                    help="--suite: the real job pipelines to include (comma-separated, of "
                         f"{','.join(JOB_PIPELINES)}; empty: none); live only")
    ap.add_argument("--no-synthetic", dest="synthetic", action="store_false",
                    help="--suite: only the real job pipelines (--jobs)")
    ap.add_argument("--job-samples", type=int, default=160_000, help="samples per real job dataset (demo: 160k)")
    ap.add_argument("--job-policy-reps", type=int, default=2, help="jobs per policy on each real pipeline")
    ap.add_argument("--job-pipeline-s", type=float, default=30.0,
                    help="seconds each policy and oracle candidate runs a real job's pipeline alone")
    ap.add_argument("--job-pipeline-rounds", type=int, default=1,
                    help="rounds re-measuring each real pipeline's oracle finalists and every policy, interleaved:"
                         " the oracle is the finalists' re-measurements, the noise their pooled run-to-run spread")
    ap.add_argument("--job-workdir", type=Path, help="the real jobs' data and runs (default: a temporary directory)")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="skip the overhead-ceiling run (the pipeline with operators that cost nothing)")
    args = ap.parse_args(argv)
    if args.oracle_search_rounds < 0:
        ap.error(f"--oracle-search-rounds {args.oracle_search_rounds}: expected 0 (every round) or more")
    if args.oracle_search_rounds and not args.oracle_fresh_pick:
        ap.error("--oracle-search-rounds re-measures the oracle's pick fresh; it cannot go with --no-oracle-fresh-pick")
    args.plot_dir.mkdir(parents=True, exist_ok=True)
    global ORACLE_SHORTLIST
    ORACLE_SHORTLIST = args.oracle_shortlist
    if args.rl_judge_moves:
        RL_OPTIONS["rl_judge_moves"] = True
    try:
        RL_OPTIONS.update(parse_rl_options(args.rl_option))
    except ValueError as e:
        ap.error(str(e))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    pipe = load_pipeline(args.pipeline)
    if args.oracle_pick is not None:
        if args.suite or "oracle" not in policies or not args.oracle_fresh_pick:
            ap.error("--oracle-pick names one pipeline's winner: it needs --pipeline (not --suite), the oracle among"
                     " --policies, and its fresh runs")
        try:
            args.oracle_pick = parse_oracle_pick(args.oracle_pick, pipe)
        except ValueError as e:
            ap.error(str(e))
    kinds = ["local", "multinode"] if args.cluster == "both" else [args.cluster]
    report: dict = {"pipeline": pipe.name, "load_average_at_start": os.getloadavg()}
    if args.ablation:
        abl = ablation_sim([int(x) for x in args.ablation_seeds.split(",") if x.strip()], args.ablation_pipelines,
                           args.ablation_mix, args.rl_policy)
        print_ablation_sim(abl)
        report["ablation"] = {"simulated": abl}
        if not args.sim_only:
            for kind in kinds:
                live = ablation_live(pipe, kind, args)
                print(f"\n== ablation, {kind}: " + ", ".join(f"{k} {v:,.0f}" for k, v in live["samples_per_s"].items())
                      + " samples/s; vs no_net: " + ", ".join(f"{k} {v:.3f}" for k, v in live["vs_no_net"].items()))
                report["ablation"][kind] = live
        report["load_average_at_end"] = os.getloadavg()
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(report, indent=1, default=str))
            print(f"\nwrote {args.json_path}")
        return 0
    if args.sim_only:
        kinds = []
    if args.suite:
        reports = {}
        for path in sorted((ROOT / "benchmarks" / "pipelines").glob("*.yaml")) if args.synthetic else []:
            pipe = load_pipeline(path)
            pipe_args = argparse.Namespace(**{**vars(args), "plot_dir": args.plot_dir / pipe.name})
            pipe_args.plot_dir.mkdir(parents=True, exist_ok=True)
            reports[pipe.name] = compare(pipe, policies, pipe_args, kinds)
        jobs = [] if args.sim_only else [d.strip() for d in args.jobs.split(",") if d.strip()]
        for dataset in jobs:  # not simulated: their operators are the platform's own
            reports[f"job:{dataset}"] = job_pipeline_report(dataset, policies, args)
        out = {"suite": suite_summary(reports), "pipelines": reports,
               "load_average_at_start": report["load_average_at_start"]}
        print_suite(out["suite"])
    else:
        report.update(compare(pipe, policies, args, kinds))
        reports = {pipe.name: report}
        top = report[kinds[0]] if kinds else report["simulated"]
        out = {k: top[k] for k in ("throughput", "rl_vs_oracle", "rl_vs_ray_default", "rl_vs_plumber",
                                   "rl_vs_hill_climb", "rl_seconds_to_95pct", "stalls") if k in top}
        out.update({k: v for k, v in report.items() if k not in out})
    out["load_average_at_end"] = os.getloadavg()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=1, default=str))
        print(f"\nwrote {args.json_path}")
    failed = [(f"{name}, {kind}", v["message"]) for name, r in reports.items() for kind in kinds
              for v in r.get(kind, {}).get("oracle_check", {}).get("violations", [])]
    if failed:
        print("\nFAILED RUN: the oracle is not an upper bound on this run:", file=sys.stderr)
        for where, message in failed:
            print(f"  [{where}] {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
