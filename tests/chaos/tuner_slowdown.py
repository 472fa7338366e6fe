"""Chaos scenario for the tuner: one operator of a live Ray Data pipeline suddenly costs ten times as much.

A 3-operator sleep pipeline (``tuner.sleep_pipelines``: operators that wait, so a
12-logical-CPU local cluster models a larger machine, see ARCHITECTURE.md) streams
under the plumber policy. At a time its :class:`~faults.FaultSchedule` draws, the
test flips the pipeline's control file from outside (``set_cost_multipliers``):
the middle operator's per-block cost jumps 10x. :func:`tuner_slowdown` records
when every block arrived, the object store's use (sampled from Ray's resources)
and the tuner's allocations, and returns an :class:`~scenarios.Outcome` whose
``details`` the test asserts on. The caller provides the cluster
(:data:`CLUSTER`: ``ray.init(**CLUSTER)``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from faults import FaultSchedule
from scenarios import Outcome

BUDGET = 8.0  # the data CPUs the tuner may hand out
STORE_BYTES = 400 * 1024**2
CLUSTER = {"num_cpus": 12, "object_store_memory": STORE_BYTES, "log_to_driver": False}
BLOCKS, ROWS = 60, 1000
SLOWED, FACTOR = "heavy", 10.0
# After the slowdown the slowed operator takes 0.6 s of one slot per block, with 2 slots at least: a block
# every 0.3 s once it is saturated. 10 s between two blocks is a stall, not a slow operator.
MAX_GAP_S = 10.0


def _pipeline():
    from dlrm_platform.tuner.sleep_pipelines import PipelineDef

    return PipelineDef.model_validate({
        "name": "slowdown",
        "rows_per_block": ROWS,
        "row_bytes": 64,
        "cluster": {"num_cpus": 12, "data_cpus": BUDGET},
        "operators": [  # balanced at first; the middle one turns 10x as expensive mid-run
            {"name": "light_a", "ms_per_1k_rows": 60, "concurrency": 2},
            {"name": SLOWED, "ms_per_1k_rows": 60, "concurrency": 2},
            {"name": "light_c", "ms_per_1k_rows": 60, "concurrency": 2},
        ],
    })


def _store_used() -> float:
    import ray

    total = ray.cluster_resources().get("object_store_memory", 0.0)
    return total - ray.available_resources().get("object_store_memory", total)


def _oom_kills() -> int:
    """Workers Ray's memory monitor killed in this session (its raylet log names each)."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"  # noqa: SLF001
    n = 0
    for f in logs.glob("raylet*.out"):
        text = f.read_text(errors="replace")
        n += text.count("low on memory") + text.count("OutOfMemoryError")
    return n


def tuner_slowdown(root: Path, seed: int) -> Outcome:
    from dlrm_platform import tuner
    from dlrm_platform.config import TunerConfig
    from dlrm_platform.tuner.sleep_pipelines import build_dataset, set_cost_multipliers

    sched = FaultSchedule(seed)
    out = Outcome("tuner_slowdown")
    pipe = _pipeline()
    control = root / "costs.json"
    set_cost_multipliers(control, {})
    cfg = TunerConfig(policy="plumber", interval_s=1.0)
    specs = pipe.op_specs()
    ds = build_dataset(pipe, BLOCKS, tuner.compute_strategies(cfg, None, BUDGET, operators=specs),
                       control_file=control)
    ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(cpu=BUDGET)
    flip_after = sched.pick(BLOCKS // 6, BLOCKS // 3)  # blocks delivered before the slowdown
    handle = tuner.attach(cfg, None, ds.context, BUDGET, operators=specs, tuner_id=f"slowdown-{seed}",
                          options={"plumber_warmup_s": 3.0, "plumber_replan_s": 4.0})
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _store_used())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    arrivals: list[float] = []
    rows = 0
    flipped_at = flipped_wall = None
    started = time.monotonic()
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            rows += len(batch["id"])
            arrivals.append(time.monotonic() - started)
            if flipped_at is None and len(arrivals) >= flip_after:
                set_cost_multipliers(control, {SLOWED: FACTOR})  # from outside the pipeline: a file it polls
                flipped_at, flipped_wall = arrivals[-1], time.time()  # the tuner's records are in wall time
                sched.record("slow_operator", op=SLOWED, factor=FACTOR, after_blocks=len(arrivals))
        out.completed = True
        hist = _history(handle)
    except Exception as err:  # noqa: BLE001 - reported in the outcome
        out.crashed, out.error = True, f"{type(err).__name__}: {err}"
        hist = []
    finally:
        done.set()
        sampler.join()
        handle.close()
    ticks = [r for r in hist if r["type"] == "tick"]
    at_flip = [t["allocation"][SLOWED] for t in ticks if flipped_wall is not None and t["t"] <= flipped_wall]
    after = [t["allocation"][SLOWED] for t in ticks if flipped_wall is not None and t["t"] > flipped_wall]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]  # between blocks: the first one waits for startup
    out.faults_injected = len(sched.injected)
    out.samples_lost = max(0, BLOCKS * ROWS - rows)
    out.samples_duplicated = max(0, rows - BLOCKS * ROWS)
    out.details.update(
        schedule=sched.injected, rows=rows, blocks=len(arrivals), flipped_at_s=flipped_at,
        first_block_s=arrivals[0] if arrivals else None,
        wall_s=arrivals[-1] if arrivals else None, max_gap_s=max(gaps, default=None),
        max_gap_after_flip_s=max((g for g, t in zip(gaps, arrivals[1:]) if flipped_at is not None and t > flipped_at),
                                 default=None),
        store_peak_bytes=peak[0], store_bytes=STORE_BYTES, oom_kills=_oom_kills(),
        slowed_slots_at_flip=at_flip[-1] if at_flip else None, slowed_slots_max_after=max(after, default=None),
        over_budget_ticks=sum(sum(t["allocation"].values()) > BUDGET for t in ticks),
    )
    return out


def _history(handle: Any, timeout_s: float = 60.0) -> list[dict]:
    """The recorder's records once the epoch's end reached it (sent fire-and-forget)."""
    deadline = time.monotonic() + timeout_s
    while True:
        hist = handle.history()
        if any(r["type"] == "epoch_end" for r in hist) or time.monotonic() > deadline:
            return hist
        time.sleep(0.05)
