"""What the tuner controls: typed, plain-data descriptions.

A :class:`TunerSpec` travels inside the Ray Data ``DataContext`` (as this object,
in its key-value config) to wherever the pipeline executes: the driver for a plain
iterator, the job's feed service actor under a training job. The callback that
reads it there re-validates it (``config.revalidate``, see
``ray_hooks.spec_from_context``), as every typed object crossing a Ray boundary
is. It holds only plain data, never Ray handles or config objects. Pydantic
dataclasses (not models) so that tests and simulators keep building them
positionally.
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from dlrm_platform.config import TUNER_POLICIES

POLICIES = TUNER_POLICIES  # named once, in the config (TunerConfig.policy)
# Policies whose decisions the tuner applies. `ray_default` only observes.
CONTROLLING_POLICIES = tuple(p for p in POLICIES if p != "ray_default")

Allocation = dict[str, int]
_STRICT = ConfigDict(extra="forbid")


@dataclass(config=_STRICT)
class OpSpec:
    """One tuned operator: its name, CPUs per task (slot) and slot bounds."""

    name: str
    num_cpus: float
    initial: int = 1
    min_slots: int = 1
    max_slots: int | None = None

    def upper(self, budget: float) -> int:
        """Most slots this operator could ever get under ``budget``."""
        cap = max(self.min_slots, int(math.floor(budget / self.num_cpus + 1e-9)))
        return cap if self.max_slots is None else min(cap, self.max_slots)


@dataclass(config=_STRICT)
class BlockRowsSpec:
    """Rows per block, steerable while the pipeline runs: the pipeline's read tasks take the
    number from ``control_file`` (JSON ``{"block_rows": n}``) as each one starts, so a change
    reaches the blocks read after it. Fewer, larger blocks pay each task's fixed cost (dispatch,
    the object store, a storage request) over more rows; they also hold more object-store memory."""

    initial: int
    control_file: str
    min_rows: int = 1
    max_rows: int | None = None

    def __post_init__(self) -> None:
        if self.initial < self.min_rows or (self.max_rows is not None and self.initial > self.max_rows):
            raise ValueError(f"block_rows.initial {self.initial} is outside [{self.min_rows}, {self.max_rows}]")


@dataclass(config=_STRICT)
class TunerSpec:
    """Everything the in-executor controller needs, as plain data."""

    tuner_id: str
    policy: str
    cpu_budget: float
    ops: list[OpSpec]
    interval_s: float = 1.0
    object_store_limit_bytes: float | None = None
    object_store_limit_fraction: float = 0.8
    policy_path: str | None = None
    recorder_name: str | None = None
    recorder_namespace: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: rows per block as a second knob (None: fixed when the pipeline is built)
    block_rows: BlockRowsSpec | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown tuner policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.cpu_budget <= 0:
            raise ValueError(f"cpu_budget must be positive, got {self.cpu_budget}")
        if not self.ops:
            raise ValueError("a tuner needs at least one operator")
        names = [o.name for o in self.ops]
        if len(set(names)) != len(names):
            raise ValueError(f"operator names must be unique: {names}")
        need = sum(o.min_slots * o.num_cpus for o in self.ops)
        if need > self.cpu_budget + 1e-9:
            raise ValueError(
                f"the operators' minimum allocation needs {need:g} CPUs but the budget is {self.cpu_budget:g}"
            )

    @property
    def controls(self) -> bool:
        return self.policy in CONTROLLING_POLICIES

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.ops]

    def op(self, name: str) -> OpSpec:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    def initial_allocation(self) -> Allocation:
        return {o.name: max(o.min_slots, o.initial) for o in self.ops}
