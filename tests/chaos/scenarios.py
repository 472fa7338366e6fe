"""Chaos scenarios: a real training job on a local Ray cluster, a fault from outside, an exact count after.

Each scenario trains the platform's DLRM through ``run_training`` (feed service,
Ray Train workers, checkpoints) on packed batches built here, injects one fault
with :mod:`faults` at a point its seeded :class:`~faults.FaultSchedule` picks,
and returns an :class:`Outcome`: whether the job completed, and, from the
epoch-end checkpoints (which list every batch each epoch trained, see
``train.checkpoint.TrainProgress``), how many samples of each epoch were never
trained or trained twice. ``tests/chaos`` asserts on them; ``benchmarks/chaos.py``
counts them. The caller provides the Ray cluster (``ray.init``).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dlrm_platform.config import JobConfig
from dlrm_platform.ingest.batching import pack_table, packed_digest
from dlrm_platform.train.checkpoint import read_progress

from faults import FaultSchedule, kill, processes
from testkit import wait_for

HASH_SIZE = 200
BATCH = 64
COLUMNS = {
    "label": "label",
    "user": {"dense": ["ud0", "ud1"], "categorical": ["uc"], "multi_hot": ["hist"]},
    "item": {"dense": ["id0"], "categorical": ["ic"]},
}
PACE_S = 0.04  # per batch in the data stage: a job of a few seconds, so that faults land mid-epoch


@dataclass
class Outcome:
    """What one scenario saw (the keys of ``benchmarks/chaos.py``'s report)."""

    name: str
    faults_injected: int = 0
    completed: bool = False
    samples_lost: int = 0
    samples_duplicated: int = 0
    crashed: bool = False
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def survived(self) -> bool:
        return self.completed and not self.crashed and self.samples_lost == 0 and self.samples_duplicated == 0


def packed_batches(n: int, seed: int) -> list[pa.Table]:
    """``n`` packed batches of ``BATCH`` samples, labels learnable from the item id; distinct contents."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ic = rng.integers(0, HASH_SIZE, BATCH)
        p = 1 / (1 + np.exp(-(np.where(ic % 2 == 0, 2.0, -2.0))))
        table = pa.table({
            "label": (rng.random(BATCH) < p).astype(np.float32),
            "ud0": rng.random(BATCH).astype(np.float32), "ud1": rng.random(BATCH).astype(np.float32),
            "id0": rng.random(BATCH).astype(np.float32), "uc": rng.integers(0, HASH_SIZE, BATCH),
            "hist": pa.array([rng.integers(0, HASH_SIZE, rng.integers(0, 6)).tolist() for _ in range(BATCH)],
                             pa.list_(pa.int64())),
            "ic": ic,
        })
        out.append(pack_table(table, ["ud0", "ud1", "id0"], ["uc", "hist", "ic"], ["hist"], "label"))
    return out


def _paced(batch: pa.Table) -> pa.Table:
    time.sleep(PACE_S * batch.num_rows)  # one packed batch per row: the data stage's work, simulated
    return batch


def datasets(train: list[pa.Table], eval_: list[pa.Table]) -> dict[str, Any]:
    """Train and eval datasets: one block per batch, through one Ray Data task stage (``MapBatches(_paced)``)."""
    import ray.cloudpickle
    import ray.data

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray Data workers cannot import tests/
    return {"train": ray.data.from_arrow(train).map_batches(_paced, batch_size=None, batch_format="pyarrow"),
            "eval": ray.data.from_arrow(eval_)}


def job(root: Path, **train: Any) -> JobConfig:
    return JobConfig.model_validate({
        "name": "chaos",
        "data": {"path": str(root), "columns": COLUMNS},
        "ingest": {"batch_size": BATCH, "hash_size": HASH_SIZE, "prefetch_batches": 1,
                   "cache": {"mode": "off"}},  # every epoch runs the data stage, so every epoch can lose a task
        "train": {"num_workers": 2, "cpus_per_worker": 0.5, "epochs": 2, "embedding_dim": 8,
                  "bottom_mlp": [16, 8], "top_mlp": [16, 1], "log_every_steps": 3,
                  "checkpoint_every_steps": 3, "keep_checkpoints": 100, "max_failures": 2, **train},
    })


def exactly_once(storage: Path, batches: list[pa.Table], epochs: int) -> tuple[int, int, list[int]]:
    """(samples lost, samples trained twice, epochs checked) from every epoch's end checkpoint under ``storage``."""
    size = {packed_digest(b): int(b.column("num_samples")[0].as_py()) for b in batches}
    want = Counter(size.keys())
    lost = dup = 0
    checked = []
    for epoch in range(epochs):
        ends = sorted(storage.glob(f"*/checkpoint_e{epoch:03d}_s*_end"))
        if not ends:
            lost += sum(size.values())  # the epoch never finished
            continue
        got = Counter(read_progress(ends[-1]).trained_in_epoch)
        lost += sum(size[d] for d in want - got)
        dup += sum(size.get(d, BATCH) * n for d, n in (got - want).items())
        checked.append(epoch)
    return lost, dup, checked


def _latest_step(storage: Path) -> int:
    steps = [int(p.name.split("_s")[1].split("_")[0]) for p in storage.glob("*/checkpoint_e*_s*")]
    return max(steps, default=0)


def _train_in_background(job_cfg: JobConfig, data: dict[str, Any], storage: Path,
                         **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    from dlrm_platform.train.trainer import run_training

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = run_training(job_cfg, data, storage_path=str(storage), **{
                "mlflow_run_id": None, "tracking_uri": None, **kw})
        except BaseException as err:  # noqa: BLE001 - reported in the outcome
            box["error"] = err

    thread = threading.Thread(target=run, name="chaos-train", daemon=True)
    thread.start()
    return thread, box


def _finish(out: Outcome, thread: threading.Thread, box: dict[str, Any], storage: Path,
            batches: list[pa.Table], epochs: int, timeout_s: float = 600) -> Outcome:
    thread.join(timeout_s)
    if thread.is_alive():
        out.error = f"the job did not finish within {timeout_s:.0f} s"
        return out
    if "error" in box:
        out.crashed, out.error = True, f"{type(box['error']).__name__}: {box['error']}"
        return out
    out.completed = True
    out.samples_lost, out.samples_duplicated, checked = exactly_once(storage, batches, epochs)
    result = box["result"]
    out.details.update(epochs_checked=checked, samples=result.samples, start_epoch=result.start_epoch,
                       checkpoint_path=result.checkpoint_path)
    return out


# --------------------------------------------------------------------------- scenarios


def _fault_after_checkpoint(name: str, root: Path, seed: int, target_range: Callable[[JobConfig, int], tuple[int, int]],
                            inject: Callable[[FaultSchedule, Callable[[], bool]], None],
                            batches: int = 40) -> Outcome:
    """The shape every process-kill scenario shares: train ``batches`` packed batches for two epochs in the
    background, wait for a checkpoint at a global step drawn from ``target_range(cfg, steps)`` (inclusive,
    ``steps`` the job's total), call ``inject(sched, alive)`` (it injects the fault and records it in
    ``sched``; ``alive()`` tells whether the job still runs), and count what each epoch trained."""
    sched = FaultSchedule(seed)
    train, eval_ = packed_batches(batches, seed), packed_batches(4, seed + 1)
    storage = root / "ray"
    cfg = job(root)
    steps = cfg.train.epochs * batches // cfg.train.num_workers
    target = sched.pick(*target_range(cfg, steps))
    thread, box = _train_in_background(cfg, datasets(train, eval_), storage)
    out = Outcome(name)
    try:
        wait_for(f"a checkpoint at global step >= {target}",
                 lambda: _latest_step(storage) >= target or not thread.is_alive(), 300)
        if thread.is_alive():
            inject(sched, thread.is_alive)
    finally:
        out = _finish(out, thread, box, storage, train, cfg.train.epochs)
    out.faults_injected = len(sched.injected)
    out.details.update(schedule=sched.injected, target_step=target, checkpoints=str(storage))
    return out


def _mid_job(cfg: JobConfig, steps: int) -> tuple[int, int]:
    """After the first checkpoint, at least two checkpoints before the end."""
    every = cfg.train.checkpoint_every_steps
    return every + 1, steps - 2 * every


def _kill_one(title_prefix: str, kind: str, step: Callable[[], int]) -> Callable[[FaultSchedule, Callable[[], bool]], None]:
    """An ``inject`` that SIGKILLs one process (seeded choice) whose title starts with ``title_prefix``."""
    def inject(sched: FaultSchedule, alive: Callable[[], bool]) -> None:
        pids = wait_for(f"a process {title_prefix}", lambda: processes(title_prefix) or not alive(), 60, 0.01)
        if alive() and isinstance(pids, list):
            pid = sched.choice(pids)
            if kill(pid):
                sched.record(kind, pid=pid, after_checkpoint_step=step())
    return inject


def train_worker_kill(root: Path, seed: int, batches: int = 40) -> Outcome:
    """SIGKILL one Ray Train worker after a checkpoint at a seeded step: the group resumes from the checkpoint
    with the data position, and every epoch still trains every batch exactly once."""
    step = lambda: _latest_step(root / "ray")  # noqa: E731
    return _fault_after_checkpoint("train_worker_kill", root, seed, _mid_job,
                                   _kill_one("ray::RayTrainWorker", "kill_train_worker", step), batches)


def model_params(checkpoint: str | Path) -> dict[str, Any]:
    """The model's tensors in a DCP checkpoint, whole (table-wise shards joined), as float64, read without a
    process group (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``)."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="chaos-params-") as tmp:
        dcp_to_torch_save(str(checkpoint), f"{tmp}/state.pt")
        state = torch.load(f"{tmp}/state.pt", weights_only=False)
    return {k: v.detach().double() for k, v in state["model"].items() if torch.is_tensor(v)}


def _distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a)) ** 0.5


def train_worker_kill_vs_unfailed(root: Path, seed: int, batches: int = 40) -> Outcome:
    """:func:`train_worker_kill`, then the same job without the fault from the checkpoint the killed run
    resumed from (``train.resume_from``: same model, optimizer state, step and data position); compares the
    two final models. The feed service hands batches to whichever worker asks first, so the two runs train
    the same remaining batches in a different order and split: not bit-identical, but close.
    ``details``: ``model_diff`` (L2 distance of the final models), ``model_moved`` (how far the unfailed run
    moved the model from the checkpoint), ``model_rel_diff`` (their ratio)."""
    from dlrm_platform.train.trainer import run_training

    out = train_worker_kill(root / "faulted", seed, batches)
    if not (out.completed and out.faults_injected):
        return out
    step = out.details["schedule"][0]["after_checkpoint_step"]
    start = sorted((root / "faulted" / "ray").glob(f"*/checkpoint_e*_s{step:08d}*"))[-1]
    cfg = job(root / "unfailed", resume_from=str(start))
    result = run_training(cfg, datasets(packed_batches(batches, seed), packed_batches(4, seed + 1)),
                          storage_path=str(root / "unfailed" / "ray"), mlflow_run_id=None, tracking_uri=None)
    at_start = model_params(start)
    faulted, unfailed = model_params(out.details["checkpoint_path"]), model_params(result.checkpoint_path)
    diff, moved = _distance(faulted, unfailed), _distance(unfailed, at_start)
    out.details.update(resumed_from=str(start), unfailed_samples=result.samples, model_diff=diff,
                       model_moved=moved, model_rel_diff=diff / moved if moved else float("inf"),
                       faulted_moved=_distance(faulted, at_start))
    return out


def data_worker_kill(root: Path, seed: int, batches: int = 40) -> Outcome:
    """SIGKILL the process running a Ray Data task mid-epoch: the pass still hands every batch to exactly
    one trainer (Ray retries the task, or the trainers resume from their checkpoint)."""
    step = lambda: _latest_step(root / "ray")  # noqa: E731
    # Early in the job: later, the passes may all be produced ahead and no data task left to kill.
    return _fault_after_checkpoint("data_worker_kill", root, seed, lambda cfg, steps: (2, steps // 4),
                                   _kill_one("ray::MapBatches(_paced)", "kill_data_worker", step), batches)


def feed_service_kill(root: Path, seed: int, batches: int = 40) -> Outcome:
    """SIGKILL the job's feed service actor mid-epoch: Ray restarts it, the trainers restart from their last
    checkpoint (``train.max_failures``), and every batch is still trained once per epoch."""
    step = lambda: _latest_step(root / "ray")  # noqa: E731
    return _fault_after_checkpoint("feed_service_kill", root, seed, _mid_job,
                                   _kill_one("ray::FeedService", "kill_feed_service", step), batches)


def node_removal(cluster: Any, root: Path, seed: int, batches: int = 40) -> Outcome:
    """Remove the non-head node of a multi-node ``ray.cluster_utils.Cluster`` mid-run (its raylet and every
    process on it die, as when a machine goes): the job completes on the nodes left, every batch once per epoch.

    ``cluster``: connected (``ray.init(address=cluster.address)``), with at least one node besides the head.
    """
    victims = list(cluster.worker_nodes)

    def inject(sched: FaultSchedule, alive: Callable[[], bool]) -> None:
        if victims:
            node = sched.choice(victims)
            cluster.remove_node(node, allow_graceful=False)
            sched.record("remove_node", node=getattr(node, "unique_id", "?"),
                         after_checkpoint_step=_latest_step(root / "ray"))

    return _fault_after_checkpoint("node_removal", root, seed, _mid_job, inject, batches)


def mlflow_outage(root: Path, seed: int, batches: int = 60, outage_s: float = 4.0) -> Outcome:
    """Stop the MLflow server (SIGKILL, its whole process group) mid-run and start it again ``outage_s`` later:
    training goes on meanwhile, and every step's metrics reach the run exactly once."""
    import os

    from mlflow.tracking import MlflowClient

    from dlrm_platform.api.devstack import free_port, stop_process
    from dlrm_platform.api.mlflow_links import start_server

    sched = FaultSchedule(seed)
    train, eval_ = packed_batches(batches, seed), packed_batches(4, seed + 1)
    storage = root / "ray"
    port = free_port()
    server = start_server(root / "mlflow", port=port)
    uri = f"http://127.0.0.1:{port}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("chaos")).info.run_id
    cfg = job(root, num_workers=1, cpus_per_worker=1.0, epochs=1)
    target = sched.pick(3, batches // 3)
    thread, box = _train_in_background(cfg, datasets(train, eval_), storage, mlflow_run_id=run_id, tracking_uri=uri)
    out = Outcome("mlflow_outage")
    down_at = up_at = 0.0
    try:
        def steps_logged() -> int:
            try:
                return int(client.get_run(run_id).data.metrics.get("steps_done", 0))
            except Exception:  # noqa: BLE001
                return 0

        wait_for(f"step {target} in MLflow", lambda: steps_logged() >= target or not thread.is_alive(), 300)
        if thread.is_alive():
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            down_at = time.time()
            sched.record("stop_mlflow_server", pid=server.pid, at_step=target)
            time.sleep(outage_s)
            server = start_server(root / "mlflow", port=port)
            up_at = time.time()
    finally:
        out = _finish(out, thread, box, storage, train, cfg.train.epochs)
        try:
            if out.completed:
                history = client.get_metric_history(run_id, "loss")
                steps = Counter(m.step for m in history)
                expected = set(range(1, box["result"].steps + 1))
                missing = expected - set(steps)
                out.details.update(loss_points=len(history), missing_steps=sorted(missing)[:20],
                                   duplicated_steps=sorted(s for s, n in steps.items() if n > 1)[:20],
                                   # steps the worker logged while the server was down: training went on
                                   steps_during_outage=sum(1 for m in history if down_at * 1000 <= m.timestamp
                                                           <= up_at * 1000))
                out.details["metrics_complete"] = not missing and not out.details["duplicated_steps"]
        finally:
            stop_process(server)
    out.faults_injected = len(sched.injected)
    out.details.update(schedule=sched.injected, target_step=target)
    return out
