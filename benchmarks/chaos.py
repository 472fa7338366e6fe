"""Chaos benchmark: faults injected from outside into real jobs, bad input fuzzed; counts of what survived.

    .venv/bin/python benchmarks/chaos.py [--quick] [--seeds 7,11] [--json PATH]

Scenarios (``tests/chaos/scenarios.py``), each on the platform's real training
path (feed service, Ray Train workers, checkpoints) on one local Ray cluster,
each fault at a point drawn from its seed:

* ``train_worker_kill``  SIGKILL a Ray Train worker after a mid-epoch checkpoint;
* ``data_worker_kill``   SIGKILL the process running a Ray Data task mid-epoch;
* ``feed_service_kill``  SIGKILL the job's feed service actor (the one that runs the passes) mid-epoch;
* ``mlflow_outage``      SIGKILL the MLflow server mid-run, start it again seconds later;
* ``node_removal``       remove the second node of a two-node ``ray.cluster_utils.Cluster`` mid-run
                         (simulated: both "nodes" share this machine; on real nodes the removed
                         node's data in the object store is lost too, which Ray rebuilds by lineage);
* ``tuner_slowdown``     one operator of a live Ray Data pipeline under the tuner (plumber) turns 10x as
                         expensive mid-run (``tests/chaos/tuner_slowdown.py``): no stall, no OOM kill,
                         every row once, slots moved to it (on its own 12-logical-CPU cluster).

Samples lost and trained twice are counted per epoch from the epoch-end
checkpoints (every batch each epoch trained, by content digest), so a replayed
or skipped batch shows. Bad input: the fuzz tests of the Criteo reader, the
Parquet reader and job configs run under Hypothesis' ``chaos`` profile (600
inputs per test; ``--quick``: 40), and their examples are counted.

Prints, and with ``--json`` writes, ``{"faults_injected", "jobs_completed",
"samples_lost", "samples_duplicated", "bad_inputs_tried", "crashes"}`` plus
the per-scenario details. Target: every fault survived, 0 lost, 0 duplicated,
0 crashes, at least 500 fuzzed inputs per reader.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT / "tests" / "chaos"), str(ROOT / "tests")]

FUZZ_TESTS = ["tests/ingest/test_fuzz_criteo.py", "tests/ingest/test_fuzz_parquet.py", "tests/test_config_fuzz.py"]
SCENARIOS = ["train_worker_kill", "data_worker_kill", "feed_service_kill", "mlflow_outage"]


def cpu_report() -> dict[str, Any]:
    flags: set[str] = set()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"model": model, "cpus": os.cpu_count(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def run_scenarios(seeds: list[int], workdir: Path) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster
    from ray.data import DataContext

    import scenarios

    rows: list[dict[str, Any]] = []
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    DataContext.get_current().enable_progress_bars = False
    try:
        for seed in seeds:
            for name in SCENARIOS:
                rows.append(_scenario(name, seed, workdir, lambda root, s, n=name: getattr(scenarios, n)(root, s)))
    finally:
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        for seed in seeds:
            cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            if not ray.is_initialized():
                ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
                DataContext.get_current().enable_progress_bars = False
            rows.append(_scenario("node_removal", seed, workdir,
                                  lambda root, s: scenarios.node_removal(cluster, root, s)))
    finally:
        ray.shutdown()
        cluster.shutdown()
    rows.extend(run_tuner_slowdown(seeds, workdir))
    return rows


def run_tuner_slowdown(seeds: list[int], workdir: Path) -> list[dict[str, Any]]:
    import ray
    from ray.data import DataContext

    import tuner_slowdown as ts

    rows = []
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", **ts.CLUSTER)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars, ctx.print_on_execution_start = False, False
    try:
        for seed in seeds:
            rows.append(_scenario("tuner_slowdown", seed, workdir, ts.tuner_slowdown))
    finally:
        ray.shutdown()
    return rows


def _scenario(name: str, seed: int, workdir: Path, run: Any) -> dict[str, Any]:
    started = time.time()
    out = run(Path(tempfile.mkdtemp(prefix=f"{name}-{seed}-", dir=workdir)), seed)
    row = {"scenario": name, "seed": seed, "faults_injected": out.faults_injected,
           "completed": out.completed, "crashed": out.crashed, "samples_lost": out.samples_lost,
           "samples_duplicated": out.samples_duplicated, "survived": out.survived and out.faults_injected > 0,
           "error": out.error, "wall_s": round(time.time() - started, 1), "details": out.details}
    if name == "mlflow_outage" and not out.details.get("metrics_complete", False):
        row["survived"] = False
    if name == "tuner_slowdown" and not tuner_slowdown_ok(out.details):
        row["survived"] = False
    print(f"  {name:<18} seed {seed:>3}: {'survived' if row['survived'] else 'FAILED':<8} "
          f"faults {out.faults_injected}, lost {out.samples_lost}, twice {out.samples_duplicated}"
          f"{', ' + out.error if out.error else ''} ({row['wall_s']} s)", flush=True)
    return row


def tuner_slowdown_ok(d: dict[str, Any]) -> bool:
    """The same bounds as tests/chaos/test_tuner_slowdown.py."""
    from tuner_slowdown import MAX_GAP_S

    return (d.get("max_gap_s") is not None and d["max_gap_s"] <= MAX_GAP_S and d.get("oom_kills") == 0
            and d["store_peak_bytes"] <= 0.8 * d["store_bytes"] and d.get("over_budget_ticks") == 0
            and (d.get("slowed_slots_max_after") or 0) > (d.get("slowed_slots_at_flip") or 0))


def run_fuzz(quick: bool) -> dict[str, Any]:
    """The fuzz tests under the chaos profile; examples counted from Hypothesis' statistics."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FUZZ_TESTS,
           "--hypothesis-show-statistics", "-k", "fuzz"]
    if not quick:
        cmd.append("--hypothesis-profile=chaos")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    per_test: dict[str, int] = {}
    current = None
    for line in out.splitlines():
        m = re.match(r"^(tests/\S+::\S+):", line.strip())
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) passing(?: examples?)?, (\d+) failing", line)
        if m and current:
            per_test[current] = per_test.get(current, 0) + int(m.group(1)) + int(m.group(2))
    failed = re.search(r"(\d+) failed", out)
    return {"per_test": per_test, "bad_inputs_tried": sum(per_test.values()),
            "crashes": int(failed.group(1)) if failed else (0 if proc.returncode == 0 else 1),
            "returncode": proc.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 40 fuzzed inputs per test")
    ap.add_argument("--seeds", default=None, help="comma-separated fault seeds (default 7,11; --quick 7)")
    ap.add_argument("--no-fuzz", action="store_true", help="fault scenarios only")
    ap.add_argument("--json", type=Path, help="write the counts and details here")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in (args.seeds or ("7" if args.quick else "7,11")).split(",")]
    report: dict[str, Any] = {"cpu": cpu_report()}
    print("CPU:", json.dumps(report["cpu"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="dlrm-chaos-") as tmp:
        print(f"faults from outside (seeds {seeds}):", flush=True)
        rows = run_scenarios(seeds, Path(tmp))
    fuzz = {"bad_inputs_tried": 0, "crashes": 0, "per_test": {}} if args.no_fuzz else run_fuzz(args.quick)
    counts = {
        "faults_injected": sum(r["faults_injected"] for r in rows),
        "jobs_completed": sum(r["completed"] for r in rows),
        "samples_lost": sum(r["samples_lost"] for r in rows),
        "samples_duplicated": sum(r["samples_duplicated"] for r in rows),
        "bad_inputs_tried": fuzz["bad_inputs_tried"],
        "crashes": sum(r["crashed"] for r in rows) + fuzz["crashes"],
    }
    report.update(counts=counts, scenarios=rows, fuzz=fuzz, jobs=len(rows))
    if not args.no_fuzz:
        print("bad input (fuzzed inputs per test):", flush=True)
        for test, n in sorted(fuzz["per_test"].items()):
            print(f"  {n:>5}  {test}")
    print(json.dumps(counts))
    ok = all(r["survived"] for r in rows) and counts["crashes"] == 0
    print(f"every fault survived: {'yes' if ok else 'NO'} ({counts['jobs_completed']}/{len(rows)} jobs completed)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**counts, **report}, indent=2, default=str))
        print(f"written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
