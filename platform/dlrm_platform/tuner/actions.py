"""Actions and their masks: per-operator concurrency within the CPU budget.

An allocation gives each operator a number of *slots* (concurrent tasks or
actors), each reserving ``num_cpus``. It is feasible when every operator has at
least its minimum (so nothing is starved) and the slots fit the CPU budget:
scaling past the free CPUs stalls Ray Data silently, so no action may ever get
there. Growing anything is also masked while object-store memory is at its
limit.

The RL policy acts in a small discrete space shared with the simulator:
``0`` = hold, ``1..K_MAX`` = one more slot for operator k, ``K_MAX+1..2*K_MAX``
= one fewer slot for operator k. "One more" takes a free slot if the budget has
one, otherwise one from the operator with the most spare capacity (the donor).
While object-store memory is at its limit (``memory_bound``) "one more" never
takes a free slot: only a slot of an operator upstream of the one it grows. The
bytes in the store wait in the queues between operators, so moving a slot
downstream drains them; masking every "+1" instead held a pipeline whose fast
read had filled the store at its starting allocation for good (simulated: 0.65 of
the optimum for a whole run, where plumber's transfers reached 0.98).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from dlrm_platform.tuner.spec import Allocation, OpSpec

K_MAX = 8
N_ACTIONS = 1 + 2 * K_MAX
EPS = 1e-9


def used_cpus(alloc: Mapping[str, int], specs: Sequence[OpSpec]) -> float:
    return sum(alloc[s.name] * s.num_cpus for s in specs)


def free_cpus(alloc: Mapping[str, int], specs: Sequence[OpSpec], budget: float) -> float:
    return budget - used_cpus(alloc, specs)


def is_feasible(alloc: Mapping[str, int], specs: Sequence[OpSpec], budget: float) -> bool:
    for s in specs:
        n = alloc.get(s.name, 0)
        if n < s.min_slots or n > s.upper(budget):
            return False
    return used_cpus(alloc, specs) <= budget + EPS


def scaled_capacity(capacity: float, slots: int, after: int, limit: int | None = None) -> float:
    """``capacity``, measured at ``slots``, at ``after`` slots: linear in slots, except that an operator
    past its measured ``limit`` (more slots there were measured not to pay) runs no faster than at the
    limit, so its slots down to the limit cost nothing."""
    if limit is not None and 0 < limit < slots:
        return capacity * min(after, limit) / limit
    return capacity * after / slots


def _slack_key(name: str, alloc: Mapping[str, int], capacities: Mapping[str, float | None] | None,
               limits: Mapping[str, int] | None = None):
    """Higher = a better donor: the capacity it keeps after giving up one slot."""
    cap = (capacities or {}).get(name)
    n = alloc[name]
    left = scaled_capacity(cap, n, n - 1, (limits or {}).get(name)) if cap is not None and n > 0 else math.inf
    return (left, n)


def keep_slots(specs: Sequence[OpSpec], alloc: Mapping[str, int], kept: Mapping[str, int]) -> list[OpSpec]:
    """``specs`` with each operator of ``kept`` held to at least its slots there (at most ``alloc``'s): no
    donor, no "-1" below them."""
    if not kept:
        return list(specs)
    return [dataclasses.replace(s, min_slots=max(s.min_slots, min(kept[s.name], alloc[s.name])))
            if s.name in kept else s for s in specs]


def pick_donor(
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    exclude: str | None,
    capacities: Mapping[str, float | None] | None = None,
    upstream_only: bool = False,
    limits: Mapping[str, int] | None = None,
) -> str | None:
    """The operator above its minimum that keeps the most capacity after giving up a slot
    (unknown capacity counts as the most; ``limits``: see ``scaled_capacity``); ``upstream_only``:
    among those before ``exclude``."""
    names = [s.name for s in specs]
    end = names.index(exclude) if upstream_only and exclude in names else len(specs)
    cands = [s.name for s in specs[:end] if s.name != exclude and alloc[s.name] > s.min_slots]
    if not cands:
        return None
    return max(cands, key=lambda n: _slack_key(n, alloc, capacities, limits))


def project(
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None] | None = None,
) -> Allocation:
    """The nearest feasible allocation: clip to bounds, then take slots from the
    operators with the most spare capacity until the budget holds."""
    out = {s.name: int(min(max(int(alloc.get(s.name, s.min_slots)), s.min_slots), s.upper(budget))) for s in specs}
    while used_cpus(out, specs) > budget + EPS:
        donor = pick_donor(out, specs, None, capacities)
        if donor is None:  # only possible when the minimums exceed the budget (rejected by TunerSpec)
            break
        out[donor] -= 1
    return out


def _grown(
    name: str,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None] | None,
    memory_bound: bool,
    limits: Mapping[str, int] | None = None,
) -> Allocation | None:
    """``alloc`` with one more slot for ``name`` (None when it cannot grow): a free slot, else
    donors' slots; at the memory limit only upstream donors' slots, never a free one."""
    spec = next(s for s in specs if s.name == name)
    if alloc[name] + 1 > spec.upper(budget):
        return None
    trial = dict(alloc)
    trial[name] += 1
    limit = used_cpus(alloc, specs) if memory_bound else budget
    while used_cpus(trial, specs) > limit + EPS:
        donor = pick_donor(trial, specs, name, capacities, upstream_only=memory_bound, limits=limits)
        if donor is None:
            return None
        trial[donor] -= 1
    return trial


def can_grow(
    name: str,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None] | None = None,
    memory_bound: bool = False,
) -> bool:
    return _grown(name, alloc, specs, budget, capacities, memory_bound) is not None


def action_mask(
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    *,
    mem_fraction: float = 0.0,
    capacities: Mapping[str, float | None] | None = None,
    completed: Mapping[str, bool] | None = None,
) -> np.ndarray:
    """Valid actions as a bool vector of length N_ACTIONS (hold is always valid)."""
    mask = np.zeros(N_ACTIONS, dtype=bool)
    mask[0] = True
    memory_bound = mem_fraction >= 1.0
    for k, s in enumerate(specs[:K_MAX]):
        if (completed or {}).get(s.name):
            continue
        if can_grow(s.name, alloc, specs, budget, capacities, memory_bound):
            mask[1 + k] = True
        if alloc[s.name] > s.min_slots:
            mask[1 + K_MAX + k] = True
    return mask


def predicted_bottleneck(alloc: Mapping[str, int], capacities: Mapping[str, float | None],
                         after: Mapping[str, int], limits: Mapping[str, int] | None = None) -> float:
    """The slowest operator's capacity at ``after``, scaling each measured capacity linearly
    with its slots, flat past a measured limit in ``limits`` (``scaled_capacity``; operators without
    a measurement do not bound it)."""
    limits = limits or {}
    caps = [scaled_capacity(c, alloc[n], after[n], limits.get(n)) for n, c in capacities.items()
            if c is not None and n in alloc and alloc[n] > 0]
    return min(caps, default=math.inf)


def vetoed_actions(
    mask: np.ndarray,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None],
    min_gain: float = 0.02,
    memory_bound: bool = False,
    limits: Mapping[str, int] | None = None,
) -> np.ndarray:
    """A shield for a learned policy, from the measured per-slot rates (linear in slots, flat past a
    measured limit in ``limits``):
    the allowed actions that would lower the slowest operator's capacity, and the moves of
    a slot (``+1`` for one operator) that would not raise it by at least ``min_gain``.
    Without it a policy trained on clean counters reads measurement noise at a balanced
    allocation as a reason to move, and wanders off it."""
    bad = np.zeros_like(mask)
    now = predicted_bottleneck(alloc, capacities, alloc, limits)
    if not math.isfinite(now):
        return bad
    for a in np.flatnonzero(mask):
        if a == 0:
            continue
        after = predicted_bottleneck(alloc, capacities,
                                     apply_action(int(a), alloc, specs, budget, capacities, memory_bound, limits),
                                     limits)
        need = now * (1.0 + min_gain) if a <= K_MAX else now * (1.0 - EPS)
        if after < need:
            bad[a] = True
    return bad


def describe_action(a: int, names: Sequence[str]) -> str:
    if a == 0:
        return "hold"
    if 1 <= a <= K_MAX:
        return f"+1 {names[a - 1]}" if a - 1 < len(names) else f"+1 <pad{a - 1}>"
    k = a - 1 - K_MAX
    return f"-1 {names[k]}" if k < len(names) else f"-1 <pad{k}>"


def apply_action(
    a: int,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None] | None = None,
    memory_bound: bool = False,
    limits: Mapping[str, int] | None = None,
) -> Allocation:
    """The allocation after action ``a``; an invalid action holds."""
    out = dict(alloc)
    if a <= 0 or a >= N_ACTIONS:
        return out
    if a <= K_MAX:
        k = a - 1
        grown = _grown(specs[k].name, out, specs, budget, capacities, memory_bound, limits) if k < len(specs) else None
        return grown if grown is not None else out
    k = a - 1 - K_MAX
    if k >= len(specs) or out[specs[k].name] <= specs[k].min_slots:
        return out
    out[specs[k].name] -= 1
    return out


def fill_budget(
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None],
) -> Allocation:
    """Give the leftover CPUs, one slot at a time, to the operator with the lowest capacity."""
    out = dict(alloc)
    while True:
        cands = [s for s in specs if out[s.name] + 1 <= s.upper(budget)
                 and used_cpus(out, specs) + s.num_cpus <= budget + EPS]
        if not cands:
            return out
        # capacity per slot grows linearly: pick the op whose capacity is lowest now
        def cap_now(s: OpSpec) -> float:
            c = capacities.get(s.name)
            return c if c is not None else math.inf
        best = min(cands, key=cap_now)
        if not math.isfinite(cap_now(best)):
            best = min(cands, key=lambda s: out[s.name] * s.num_cpus)
        per_slot = (capacities.get(best.name) or 0.0) / max(out[best.name], 1)
        out[best.name] += 1
        if capacities.get(best.name) is not None:
            capacities = dict(capacities)
            capacities[best.name] = per_slot * out[best.name]


def scaled_capacities(capacities: Mapping[str, float | None], alloc: Mapping[str, int],
            after: Mapping[str, int], limits: Mapping[str, int] | None = None) -> dict[str, float | None]:
    """Each measured capacity at ``after``'s slots, linear in slots from ``alloc``'s (``scaled_capacity``)."""
    limits = limits or {}
    return {n: (scaled_capacity(c, alloc[n], after[n], limits.get(n)) if c is not None and alloc.get(n) else c)
            for n, c in capacities.items()}


def grow_tied_pair(
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None],
    growable: set[str],
    *,
    min_gain: float = 0.02,
    memory_bound: bool = False,
    limits: Mapping[str, int] | None = None,
) -> tuple[Allocation, str, str] | None:
    """``(allocation, first, second)``: one more slot for each of the two slowest operators where their
    capacities tie (the second within ``min_gain`` of the first), so that no single "+1" passes the
    shield (:func:`vetoed_actions`: the other one binds), and both together raise the predicted
    bottleneck by ``min_gain``. None otherwise, or where either is not in ``growable``. Slots come
    from free CPUs or donors, as for a "+1"."""
    # the operators that bound the pipeline, slowest first (``predicted_bottleneck``'s)
    known = sorted((c, n) for n, c in capacities.items() if c is not None and alloc.get(n, 0) > 0)
    if len(known) < 2:
        return None
    (now, first), (c2, second) = known[0], known[1]
    if c2 > now * (1.0 + min_gain) or not {first, second} <= growable:
        return None
    one = _grown(first, alloc, specs, budget, capacities, memory_bound, limits)
    if one is None:
        return None
    both = _grown(second, one, specs, budget, scaled_capacities(capacities, alloc, one, limits), memory_bound, limits)
    if both is None or predicted_bottleneck(alloc, capacities, both, limits) < now * (1.0 + min_gain):
        return None
    return both, first, second


def grow_while_it_pays(
    a: int,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None],
    *,
    max_slots: int,
    min_gain: float = 0.02,
    memory_bound: bool = False,
    limits: Mapping[str, int] | None = None,
) -> Allocation:
    """The allocation after a "+1" move ``a`` that goes as far as the measured rates say it pays.

    The first slot is ``apply_action``'s; each further one must pass :func:`vetoed_actions` at the
    allocation the earlier ones reached (the capacities scaled linearly with slots), and the
    operator grows by at most ``max_slots`` and at most doubles. One slot per move converged too
    slowly where the optimum is many slots away or a task outlasts several intervals (the policy
    waits for evidence after each move). The next measurement corrects what the linear model
    over-predicted (saturating I/O). Any other action: ``apply_action``.
    """
    new = apply_action(a, alloc, specs, budget, capacities, memory_bound, limits)
    if not 1 <= a <= K_MAX or new == alloc:
        return new
    name = specs[a - 1].name
    most = min(alloc[name] + max_slots, 2 * alloc[name])
    while new[name] < most:
        # capacities at ``new`` (donor choice); the gain is the shield's test (vetoed_actions)
        scaled = scaled_capacities(capacities, alloc, new, limits)
        trial = _grown(name, new, specs, budget, scaled, memory_bound, limits)
        if trial is None:
            break
        now = predicted_bottleneck(alloc, capacities, new, limits)
        if math.isfinite(now) and predicted_bottleneck(alloc, capacities, trial, limits) < now * (1.0 + min_gain):
            break
        new = trial
    return new


def grow_next_bottlenecks(
    alloc: Mapping[str, int],
    grown: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    capacities: Mapping[str, float | None],
    most: Mapping[str, int],
    *,
    max_slots: int,
    min_gain: float = 0.02,
    memory_bound: bool = False,
    limits: Mapping[str, int] | None = None,
) -> tuple[Allocation, list[str]]:
    """``grown`` (a "+1" move's allocation from ``alloc``) carried on to the operators that bound the
    pipeline after it. One slot at a time goes to whichever operator the measured rates (linear in slots
    from ``alloc``) predict slowest, while that one may grow (``most``: operator -> the most slots it may
    have after the move; an operator not in it may not) and the slot does not lower the predicted
    bottleneck (a donor that would bind ends it), ``max_slots`` at most in all; the result is the longest
    such chain whose every kept stretch raised the predicted bottleneck by ``min_gain`` (slowest operators
    that tie rise together). Returns the allocation and the operators grown on the way, in order. Slots
    come from free CPUs or donors, as for a "+1".

    A "+1" relieves one operator, and where the next slowest is close behind, the pipeline's gain
    stops there: the next move waits for the evidence of this one, so a pipeline whose optimum is
    many operators away from its start (eight operators, costs 50x apart) took a dozen moves."""
    new = dict(grown)
    chain: list[str] = []
    best, best_chain = dict(grown), []
    best_rate = predicted_bottleneck(alloc, capacities, grown, limits)
    while len(chain) < max_slots and math.isfinite(best_rate):
        scaled = scaled_capacities(capacities, alloc, new, limits)
        known = [(c, n) for n, c in scaled.items() if c is not None and new.get(n, 0) > 0]
        if not known:
            break
        now, slowest = min(known)
        if new[slowest] >= most.get(slowest, 0):
            break
        trial = _grown(slowest, new, specs, budget, scaled, memory_bound, limits)
        if trial is None:
            break
        after = predicted_bottleneck(alloc, capacities, trial, limits)
        if after < now * (1.0 - EPS):
            break  # a donor would bind: the slot costs more than it gives
        new = trial
        chain.append(slowest)
        if after >= best_rate * (1.0 + min_gain):
            best, best_chain, best_rate = dict(new), list(chain), after
    return best, best_chain
