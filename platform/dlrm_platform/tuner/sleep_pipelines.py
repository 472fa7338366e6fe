"""Benchmark pipelines described in YAML (``benchmarks/pipelines/*.yaml``).

Each operator waits (``time.sleep``, GIL-free) for its cost per row instead of
spinning: on a 2-core machine, giving Ray many logical CPUs and letting
operators wait models a large machine faithfully, so that *allocation* decides
throughput (ARCHITECTURE.md, "Modelling a large machine on 2 cores"). An operator may sit behind a storage service with a
fixed number of channels (``storage_channels``): past that many concurrent
tasks, more slots only wait longer - the sublinear scaling of real I/O that a
linear per-core model does not predict - or behind a shared resource whose
callers slow each other down (``contention``, a table behind one lock): past a
peak, more slots deliver less. Costs can be changed while the
pipeline runs (the "user history doubles" scenario) through a small control
file that tasks re-read when it changes.

Example::

    name: dlrm_preprocessing
    rows_per_block: 2000
    row_bytes: 256
    cluster: {num_cpus: 32, data_cpus: 24, nodes: [8, 8, 8, 8]}
    operators:
      - {name: read, ms_per_1k_rows: 120, concurrency: 4, storage_channels: 8}
      - {name: parse, ms_per_1k_rows: 300, concurrency: 4}
    shift: {at_s: 60, operator: parse, factor: 2.0}
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dlrm_platform.errors import UserError
from dlrm_platform.tuner.block_size import doubled_sizes
from dlrm_platform.tuner.control_file import read_control, write_control
from dlrm_platform.tuner.spec import OpSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SyntheticOperator(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    ms_per_1k_rows: float = Field(gt=0, description="busy time of one slot per 1000 input rows")
    ms_per_task: float = Field(0.0, ge=0, description=(
        "fixed busy time of each task whatever its rows: a storage request's latency, a per-call setup"))
    num_cpus: float = Field(1.0, gt=0)
    concurrency: int = Field(1, ge=1, description="the static config's number of tasks")
    element_ratio: float = Field(1.0, gt=0, le=1.0, description="output rows per input row")
    storage_channels: int | None = Field(None, ge=1, description="concurrent I/O channels behind this operator")
    contention: float = Field(0.0, ge=0, le=1, description=(
        "coherency cost per pair of concurrent tasks (USL kappa): n concurrent tasks do the work of"
        " n / (1 + contention * n * (n - 1)), so past a peak more tasks deliver less"))
    what: str = ""


    @model_validator(mode="after")
    def _one_service(self) -> SyntheticOperator:
        if self.storage_channels and self.contention:
            raise ValueError(f"operator {self.name}: storage_channels and contention model two different "
                             "services; give it one of them")
        return self


class ClusterSpec(_Strict):
    num_cpus: int = Field(32, ge=2, description="logical CPUs of the local cluster")
    data_cpus: float = Field(24, gt=0, description="CPU budget of the pipeline")
    nodes: list[int] = Field(default_factory=lambda: [8, 8, 8, 8], description="CPUs per simulated node")
    object_store_mb: int = Field(1500, ge=100)


class ShiftSpec(_Strict):
    at_s: float = Field(60.0, gt=0)
    operator: str
    factor: float = Field(2.0, gt=0)
    what: str = ""


class PipelineDef(_Strict):
    name: str
    description: str = ""
    rows_per_block: int = Field(2000, ge=1)
    max_rows_per_block: int | None = Field(None, ge=1, description=(
        "set: a tuner may resize the blocks while the pipeline runs, up to this many rows (the read"
        " takes the size from a control file as each task starts); unset: every block has rows_per_block"))
    row_bytes: int = Field(256, ge=8)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    operators: list[SyntheticOperator] = Field(min_length=1)
    shift: ShiftSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> PipelineDef:
        names = [o.name for o in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"operator names must be unique: {names}")
        if self.shift is not None and self.shift.operator not in names:
            raise ValueError(f"shift.operator {self.shift.operator!r} is not one of {names}")
        if self.max_rows_per_block is not None and self.max_rows_per_block < self.rows_per_block:
            raise ValueError(f"max_rows_per_block {self.max_rows_per_block} < rows_per_block {self.rows_per_block}")
        need = sum(o.num_cpus for o in self.operators)
        if need > self.cluster.data_cpus:
            raise ValueError(f"one task of every operator needs {need:g} CPUs > cluster.data_cpus")
        return self

    # -- derived
    def shifted(self) -> PipelineDef:
        """The pipeline after its cost shift (the shifted operator's cost per row times ``shift.factor``, as
        ``set_cost_multipliers`` applies it live); itself where it has none."""
        if self.shift is None:
            return self
        ops = [o.model_copy(update={"ms_per_1k_rows": o.ms_per_1k_rows * self.shift.factor})
               if o.name == self.shift.operator else o for o in self.operators]
        return self.model_copy(update={"operators": ops, "shift": None})

    def op_specs(self, initial: str = "config") -> list[OpSpec]:
        return [OpSpec(o.name, o.num_cpus, initial=o.concurrency if initial == "config" else 1)
                for o in self.operators]

    def ground_truth(self) -> dict[str, Any]:
        """The true cost model (benchmark-only: a tuner never sees it)."""
        return {
            "cpu_budget": self.cluster.data_cpus,
            "block_rows": self.rows_per_block,
            "row_bytes": self.row_bytes,
            "ops": [
                {
                    "name": o.name,
                    "num_cpus": o.num_cpus,
                    "element_ratio": o.element_ratio,
                    # own output rows per busy slot-second
                    "rate_per_slot": 1e6 * o.element_ratio / o.ms_per_1k_rows,
                    "sat": o.storage_channels,
                    "contention": o.contention,
                    "task_s": o.ms_per_task / 1000.0,
                }
                for o in self.operators
            ],
            # resizable blocks: the tasks' blocks count against the object store (the tuner's share)
            **({"inflight_memory": True, "mem_limit": self.cluster.object_store_mb * 2**20 * 0.8}
               if self.max_rows_per_block else {}),
        }


def load_pipeline(path: str | Path) -> PipelineDef:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such pipeline file") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {err}") from None
    try:
        return PipelineDef.model_validate(raw)
    except ValidationError as err:
        from dlrm_platform.config import format_validation_error

        raise UserError(format_validation_error(err, str(path)).replace("invalid job config", "invalid pipeline"))


# --------------------------------------------------------------------------- runtime pieces

STORAGE_NAMESPACE = "dlrm_platform_bench"


def _multiplier(control_file: str | None, op: str) -> float:
    return float(read_control(control_file).get(op, 1.0))


def set_cost_multipliers(control_file: str | Path, multipliers: dict[str, float]) -> None:
    """Change operator costs of a running pipeline (atomically replaces the control file)."""
    write_control(control_file, multipliers)


class _Storage:
    """A storage service with a fixed number of channels (threaded actor)."""

    def io(self, seconds: float) -> None:
        time.sleep(seconds)


class _ContendedService:
    """A shared resource whose callers slow each other down (a table behind one lock): a call of
    ``seconds`` of work progresses at 1 / (1 + kappa * n * (n - 1)) while n calls are in (USL)."""

    def __init__(self, kappa: float):
        import threading

        self.kappa = kappa
        self.active = 0
        self.lock = threading.Lock()

    def io(self, seconds: float) -> None:
        with self.lock:
            self.active += 1
        try:
            done = 0.0
            while done < seconds:
                with self.lock:
                    n = self.active
                time.sleep(0.005)
                done += 0.005 / (1.0 + self.kappa * n * (n - 1))
        finally:
            with self.lock:
                self.active -= 1


_STORAGE_HANDLES: dict[str, Any] = {}  # named actors live while their handle does


def start_storage(name: str, channels: int):
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=channels)(_Storage)
    handle = cls.options(name=name, namespace=STORAGE_NAMESPACE, get_if_exists=True).remote()
    _STORAGE_HANDLES[name] = handle
    return handle


def start_contended(name: str, kappa: float):
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=256)(_ContendedService)
    handle = cls.options(name=name, namespace=STORAGE_NAMESPACE, get_if_exists=True).remote(kappa)
    _STORAGE_HANDLES[name] = handle
    return handle


def stop_storage() -> None:
    import ray

    for h in _STORAGE_HANDLES.values():
        try:
            ray.kill(h)
        except Exception:  # noqa: BLE001
            pass
    _STORAGE_HANDLES.clear()


def _make_op_fn(op: SyntheticOperator, rows_per_block: int, row_floats: int, control_file: str | None,
                storage_name: str | None, first: bool, block_rows_file: str | None = None):
    name = op.name
    sec_per_row = op.ms_per_1k_rows / 1000.0 / 1000.0
    sec_per_task = op.ms_per_task / 1000.0
    ratio = op.element_ratio

    def fn(batch):
        import numpy as np

        if first:  # reads a block: as many rows as the block-size control says when the task starts
            ids = np.asarray(batch["id"])
            rows = int(read_control(block_rows_file).get("block_rows", rows_per_block))
            n = int(len(ids) * rows)
            base = int(ids[0]) * rows if len(ids) else 0
            batch = {"id": np.arange(base, base + n, dtype=np.int64),
                     "x": np.zeros((n, row_floats), dtype=np.float32)}
        n = len(batch["id"])
        wait = sec_per_task + sec_per_row * n * _multiplier(control_file, name)
        if storage_name:
            import ray

            ray.get(ray.get_actor(storage_name, namespace=STORAGE_NAMESPACE).io.remote(wait))
        else:
            time.sleep(wait)
        if ratio < 1.0:
            keep = max(1, int(round(n * ratio)))
            batch = {k: v[:keep] for k, v in batch.items()}
        return batch

    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def _as_callable_class(fn):
    """Actor pools need a callable class; name it after the operator (``MapBatches(<name>)``)."""

    def __call__(self, batch):
        return fn(batch)

    return type(fn.__name__, (), {"__call__": __call__, "__module__": __name__})


def build_dataset(
    pipe: PipelineDef,
    num_blocks: int,
    strategies: dict[str, Any],
    *,
    control_file: str | Path | None = None,
    storage_prefix: str = "dlrm-bench-storage",
    block_rows_file: str | Path | None = None,
):
    """The Ray Data pipeline of ``pipe`` over ``num_blocks`` blocks (``strategies`` from
    ``tuner.compute_strategies``). Storage services are started as named actors.
    ``block_rows_file``: the first operator reads each block's rows from it when the task starts
    (``spec.BlockRowsSpec``, written by the tuner's controller); otherwise every block has ``pipe.rows_per_block``."""
    import ray
    from ray.data import ActorPoolStrategy

    row_floats = max(1, pipe.row_bytes // 4 - 2)
    # Block ids as in-memory input: no read tasks of their own, so the first *tuned*
    # operator (read) is the only one that takes CPUs for reading.
    ds = ray.data.from_items([{"id": i} for i in range(num_blocks)], override_num_blocks=num_blocks)
    for i, op in enumerate(pipe.operators):
        storage = None
        if op.storage_channels:
            storage = f"{storage_prefix}-{op.name}"
            start_storage(storage, op.storage_channels)
        elif op.contention:
            storage = f"{storage_prefix}-{op.name}"
            start_contended(storage, op.contention)
        fn = _make_op_fn(op, pipe.rows_per_block, row_floats, str(control_file) if control_file else None,
                         storage, first=(i == 0), block_rows_file=str(block_rows_file) if block_rows_file else None)
        if isinstance(strategies[op.name], ActorPoolStrategy):
            fn = _as_callable_class(fn)
        ds = ds.map_batches(
            fn,
            batch_size=None,
            batch_format="numpy",
            zero_copy_batch=True,
            compute=strategies[op.name],
            num_cpus=op.num_cpus,
        )
    return ds


def block_row_sizes(pipe: PipelineDef) -> list[int]:
    """The block sizes a tuner can reach: ``rows_per_block`` doubled up to ``max_rows_per_block``."""
    return doubled_sizes(pipe.rows_per_block, pipe.max_rows_per_block or pipe.rows_per_block)


def expected_optimum(pipe: PipelineDef) -> tuple[dict[str, int], float]:
    """Best whole-slot allocation and its rows/s under the true cost model (simulator), at the
    best block size a tuner can reach where the blocks are resizable."""
    from dlrm_platform.tuner.simulator import from_profile

    sim = from_profile(pipe.ground_truth())
    alloc, _, rate = sim.optimum_over_block_rows(block_row_sizes(pipe))
    return alloc, rate


def rows_per_s_upper_bound(pipe: PipelineDef) -> float:
    _, t = expected_optimum(pipe)
    return t if math.isfinite(t) else 0.0
