"""Plumber-style operational analysis (Kuchnik et al., MLSys 2022).

From measured busy time and element ratios, each operator has a rate per slot
``r_i`` (its own output rows per busy slot-second) and a sink factor ``f_i``
(samples delivered per row it outputs). With ``n_i`` slots of ``c_i`` CPUs it
sustains ``n_i * r_i * f_i`` samples/s, and the pipeline delivers the minimum
over operators. The LP

    maximise t   s.t.  t <= n_i * r_i * f_i,   sum_i c_i n_i <= B,   lo_i <= n_i <= hi_i

gives the allocation that maximises the slowest operator's rate under the CPU
budget; it is rounded down to whole slots and the leftover CPUs go, one slot at
a time, to whichever operator is then the slowest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dlrm_platform.tuner.actions import fill_budget, project, used_cpus
from dlrm_platform.tuner.observe import Observation
from dlrm_platform.tuner.spec import Allocation, OpSpec


@dataclass
class LPSolution:
    allocation: Allocation
    continuous: dict[str, float]
    predicted_throughput: float       # samples/s of the continuous LP optimum
    predicted_integer_throughput: float  # samples/s of the rounded allocation


def solve_lp(
    specs: Sequence[OpSpec],
    per_slot: Mapping[str, float],
    budget: float,
) -> LPSolution:
    """``per_slot[name]`` = samples/s one slot of the operator sustains (r_i * f_i)."""
    k = len(specs)
    a = np.array([max(per_slot[s.name], 1e-12) for s in specs], dtype=float)
    c = np.array([s.num_cpus for s in specs], dtype=float)
    if k == 1:  # the fused pipeline's one operator: as many slots as fit (no solver, nor scipy's ~0.4 s import)
        n = min(float(specs[0].upper(budget)), budget / c[0])
        x = np.array([n, a[0] * n]) if n >= specs[0].min_slots else None
    else:
        x = _linprog(specs, a, c, budget)
    if x is None:  # infeasible minimums: fall back to the minimums
        cont = {s.name: float(s.min_slots) for s in specs}
        t_star = min(a[i] * s.min_slots for i, s in enumerate(specs))
    else:
        cont = {s.name: float(x[i]) for i, s in enumerate(specs)}
        t_star = float(x[-1])
    alloc = {s.name: max(s.min_slots, int(math.floor(cont[s.name] + 1e-6))) for s in specs}
    alloc = project(alloc, specs, budget)
    caps = {s.name: alloc[s.name] * a[i] for i, s in enumerate(specs)}
    alloc = fill_budget(alloc, specs, budget, caps)
    t_int = min(alloc[s.name] * a[i] for i, s in enumerate(specs))
    return LPSolution(alloc, cont, t_star, t_int)


def _linprog(specs: Sequence[OpSpec], a: np.ndarray, c: np.ndarray, budget: float) -> np.ndarray | None:
    """``[n_1..n_k, t]`` maximising t s.t. t <= a_i n_i, sum c_i n_i <= budget, n_i within the operators'
    bounds (scipy's HiGHS); None when the minimums do not fit."""
    from scipy.optimize import linprog

    k = len(specs)
    # variables x = [n_1..n_k, t]; minimise -t
    obj = np.zeros(k + 1)
    obj[-1] = -1.0
    a_ub = np.zeros((k + 1, k + 1))
    b_ub = np.zeros(k + 1)
    for i in range(k):
        a_ub[i, i] = -a[i]
        a_ub[i, -1] = 1.0
    a_ub[k, :k] = c
    b_ub[k] = budget
    bounds = [(s.min_slots, s.upper(budget)) for s in specs] + [(0, None)]
    res = linprog(obj, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    return res.x if res.status == 0 else None


def per_slot_samples(obs: Observation, fallback: Mapping[str, float] | None = None) -> dict[str, float]:
    """Samples/s per slot for each operator; unmeasured ones take ``fallback`` or the median."""
    factors = obs.extra.get("sink_factors") or [1.0] * len(obs.ops)
    out: dict[str, float] = {}
    for o, f in zip(obs.ops, factors):
        if o.rate_per_slot is not None:
            out[o.name] = o.rate_per_slot * f
        elif fallback and o.name in fallback:
            out[o.name] = fallback[o.name]
    if len(out) < len(obs.ops):
        med = float(np.median(list(out.values()))) if out else 1.0
        for o in obs.ops:
            out.setdefault(o.name, med)
    return out


# --------------------------------------------------------------------------- report


@dataclass
class OperatorReport:
    name: str
    slots: int
    cpus_per_slot: float
    cpu_share: float                # share of the pipeline's CPUs it holds now
    rate_per_core: float | None     # samples/s per CPU
    rate_per_slot: float | None     # own output rows per busy slot-second
    element_ratio: float
    capacity: float | None          # samples/s at its current allocation
    utilisation: float
    queue_blocks: float
    recommended_slots: int


@dataclass
class PlumberReport:
    observed_throughput: float
    window_s: float
    cpu_budget: float
    bottleneck: str | None
    bottleneck_reason: str
    predicted_max_throughput: float
    predicted_allocation_throughput: float
    current_allocation: Allocation
    recommended_allocation: Allocation
    operators: list[OperatorReport]

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"Plumber-style analysis over {self.window_s:.1f} s, CPU budget {self.cpu_budget:g}",
            f"observed throughput: {self.observed_throughput:,.0f} samples/s",
            "",
            f"{'operator':<20}{'slots':>6}{'cpu/slot':>9}{'cpu share':>10}{'rate/core':>12}"
            f"{'capacity':>12}{'util':>7}{'queue':>7}{'ratio':>7}{'recommend':>10}",
        ]
        for o in self.operators:
            rpc = f"{o.rate_per_core:,.0f}" if o.rate_per_core is not None else "n/a"
            cap = f"{o.capacity:,.0f}" if o.capacity is not None else "n/a"
            lines.append(
                f"{o.name:<20}{o.slots:>6}{o.cpus_per_slot:>9g}{o.cpu_share:>10.0%}{rpc:>12}"
                f"{cap:>12}{o.utilisation:>7.0%}{o.queue_blocks:>7.0f}{o.element_ratio:>7.2f}"
                f"{o.recommended_slots:>10}"
            )
        lines += [
            "",
            f"bottleneck: {self.bottleneck or 'unknown'} - {self.bottleneck_reason}",
            f"predicted maximum throughput (LP): {self.predicted_max_throughput:,.0f} samples/s",
            f"recommended allocation: {self.recommended_allocation}"
            f" (predicted {self.predicted_allocation_throughput:,.0f} samples/s)",
        ]
        return "\n".join(lines)


def analyse(obs: Observation, specs: Sequence[OpSpec], budget: float) -> PlumberReport:
    per_slot = per_slot_samples(obs)
    sol = solve_lp(specs, per_slot, budget)
    used = max(used_cpus({o.name: o.slots for o in obs.ops}, specs), 1e-9)
    ops = []
    for o, s in zip(obs.ops, specs):
        ops.append(
            OperatorReport(
                name=o.name,
                slots=o.slots,
                cpus_per_slot=s.num_cpus,
                cpu_share=o.slots * s.num_cpus / used,
                rate_per_core=(per_slot[o.name] / s.num_cpus) if o.rate_per_slot is not None else None,
                rate_per_slot=o.rate_per_slot,
                element_ratio=o.element_ratio,
                capacity=o.capacity,
                utilisation=o.util,
                queue_blocks=o.queue_blocks,
                recommended_slots=sol.allocation[o.name],
            )
        )
    bn = obs.bottleneck()
    if bn is None:
        reason = "no operator ran long enough to be measured; run longer"
    else:
        b = obs.op(bn)
        others = sorted((o.capacity for o in obs.ops if o.name != bn and o.capacity is not None))
        nxt = f", next lowest {others[0]:,.0f}" if others else ""
        reason = (
            f"lowest capacity, {b.capacity:,.0f} samples/s with {b.slots} slot(s){nxt};"
            f" its slots are {b.util:.0%} busy and its input queue holds {b.queue_blocks:.0f} block(s)"
        )
    return PlumberReport(
        observed_throughput=obs.throughput,
        window_s=obs.window_s,
        cpu_budget=budget,
        bottleneck=bn,
        bottleneck_reason=reason,
        predicted_max_throughput=sol.predicted_throughput,
        predicted_allocation_throughput=sol.predicted_integer_throughput,
        current_allocation={o.name: o.slots for o in obs.ops},
        recommended_allocation=sol.allocation,
        operators=ops,
    )
