"""Tuning policies. Each sees an ``Observation`` and proposes an allocation.

* ``static``      - the config's numbers, held (the tuner still masks and guards memory).
* ``ray_default`` - nothing: Ray Data's own autoscaling and reservation, untouched; observe only.
* ``plumber``     - operational analysis: per-slot rates from measured busy time and element
                    ratios, the LP that maximises the slowest operator (``plumber.solve_lp``);
                    re-planned from fresh measurements every ``plumber_replan_s``.
* ``hill_climb``  - tf.data AUTOTUNE-style: start at one slot each; step by step, add one
                    slot where the (live-measured) latency model says it helps most, until
                    nothing helps or the budget is spent; re-optimise periodically.
* ``oracle``      - exhaustive search over whole allocations within the budget, each measured
                    live; when there are too many, the model's best ``oracle_max_measured``
                    (or the benchmark's ground-truth shortlist) are measured. Benchmarking only.
* ``rl``          - the pretrained PPO policy (``rl.RLPolicyRunner``) acting on normalised
                    features, one move per interval.
* ``auto``        - the default: per execution, what works on the pipeline it finds: the
                    config's numbers held when there is one operator (the fused read..batch
                    task: nothing to move CPUs between), ``plumber`` when there are several
                    (why plumber and not ``rl``: the tuner README, "The default policy").

Every move is explained (``Policy.explain``): the bottleneck operator it relieves and the
gain the measured per-slot rates predict; the controller records it with the decision.

A policy returns ``None`` to hold. The controller projects whatever it returns
onto the feasible set (budget, minimums), so no policy can oversubscribe CPUs.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
from collections.abc import Sequence

from dlrm_platform.tuner.actions import can_grow, used_cpus
from dlrm_platform.tuner.block_size import BlockSizer, Drain, doubled_sizes
from dlrm_platform.tuner.features import BUSY_UTIL
from dlrm_platform.tuner.observe import Observation, OccupiedSlotRates
from dlrm_platform.tuner.plumber import per_slot_samples, solve_lp
from dlrm_platform.tuner.scaling import ScalingMemory
from dlrm_platform.tuner.spec import Allocation, OpSpec, TunerSpec

log = logging.getLogger(__name__)


class Policy:
    name = "base"
    #: seconds after a pass's first delivered rows before its operators' rates count as measured
    #: (``observe.WindowedObserver.warmup_s``)
    measure_after_delivery_s = 0.0

    def __init__(self, spec: TunerSpec):
        self.spec = spec
        self.opts = spec.options
        self.notes: list[dict] = []  # what the policy chose or held back, recorded by the controller as notes
        #: steers rows per block where the pipeline lets it (``TunerSpec.block_rows``); None: fixed
        self.block_sizer: BlockSizer | None = None

    def _steer_block_rows(self) -> None:
        """Give this policy the block-size knob, where the pipeline has one (``tuner/block_size.py``)."""
        if self.spec.block_rows is not None and self.opts.get("steer_block_rows", True):
            self.block_sizer = BlockSizer(self.spec.block_rows, self.opts)

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def start_execution(self, epoch: int, specs: Sequence[OpSpec] | None = None) -> None:
        """A new execution (each epoch's pass) over the operators ``specs`` tunes: a block-size step in
        flight is void, then the policy's own reset."""
        if self.block_sizer is not None:
            self.block_sizer.forget()
        self.on_epoch_start(epoch)
        if specs is not None:
            self.on_execution_operators(specs)

    def on_execution_operators(self, specs: Sequence[OpSpec]) -> None:
        """The operators this execution tunes, known before its first observation."""

    def _with_blocks(self, text: str) -> str:
        """``describe``'s text, with the block sizer's state where it steers one."""
        return f"{text}; {self.block_sizer.describe()}" if self.block_sizer is not None else text

    def decide_block_rows(self, obs: Observation, alloc: Allocation) -> tuple[int, dict] | None:
        """``(rows per block, explanation)`` to change to, or None; asked each interval the allocation
        did not change, on a pipeline whose blocks can be resized while it runs."""
        return self.block_sizer.decide(obs, alloc) if self.block_sizer is not None else None

    def holds_allocation(self) -> bool:
        """True while a block-size step is measured: a move of slots now would confound it."""
        return self.block_sizer is not None and self.block_sizer.judging

    def on_block_rows_change(self) -> None:
        """Rows per block changed: what was measured per slot count at the old size is stale."""

    def pop_notes(self) -> list[dict]:
        """The notes recorded since the last call."""
        out, self.notes = self.notes, []
        return out

    def decide(self, obs: Observation, alloc: Allocation, specs: Sequence[OpSpec], budget: float) -> Allocation | None:
        return None

    def describe(self) -> str:
        return self.name

    def explain(self, obs: Observation, alloc: Allocation, new: Allocation, specs: Sequence[OpSpec],
                budget: float) -> dict:
        """Why ``alloc`` -> ``new``: the bottleneck operator now and the gain the measured
        per-slot rates predict (the slowest operator's capacity before and after)."""
        return explain_move(obs, alloc, new, specs, per_slot_samples(obs))


def explain_move(obs: Observation, alloc: Allocation, new: Allocation, specs: Sequence[OpSpec],
                 per_slot: dict[str, float]) -> dict:
    """``{"bottleneck", "predicted_before", "predicted_after", "expected_gain", "text"}`` for a move."""
    names = [s.name for s in specs if s.name in per_slot]
    if not names:
        return {"bottleneck": obs.bottleneck(), "expected_gain": None,
                "text": "no operator measured yet"}
    before = {n: alloc.get(n, 0) * per_slot[n] for n in names}
    after = {n: new.get(n, alloc.get(n, 0)) * per_slot[n] for n in names}
    bottleneck = min(before, key=before.get)
    t0, t1 = min(before.values()), min(after.values())
    gain = t1 / t0 - 1.0 if t0 > 0 else None
    g = f"{gain:+.0%}" if gain is not None else "n/a"
    return {
        "bottleneck": bottleneck,
        "predicted_before": t0,
        "predicted_after": t1,
        "expected_gain": gain,
        "text": f"bottleneck {bottleneck} ({t0:,.0f} samples/s); expected {t1:,.0f} samples/s ({g})",
    }


class StaticPolicy(Policy):
    name = "static"


class RayDefaultPolicy(Policy):
    name = "ray_default"


class _RateMemory:
    """Per-operator samples/s per slot, smoothed across measurements, and how noisy each is.

    ``noise[name]`` is the smoothed relative change between successive measurements
    of one operator at an unchanged allocation (mean |v - mean| / mean): what a
    window's measurement moves by when nothing changed.
    """

    def __init__(self, alpha: float = 0.5):
        self.alpha = alpha
        self.rates: dict[str, float] = {}
        self.noise: dict[str, float] = {}

    def update(self, obs: Observation, min_since_change: float) -> None:
        if obs.since_change_s < min_since_change:
            return
        factors = obs.extra.get("sink_factors") or [1.0] * len(obs.ops)
        for o, f in zip(obs.ops, factors):
            if o.rate_per_slot is None or o.completed:
                continue
            v = o.rate_per_slot * f
            old = self.rates.get(o.name)
            if old is None:
                self.rates[o.name] = v
                continue
            if old > 0:
                dev = abs(v - old) / old
                prev = self.noise.get(o.name)
                self.noise[o.name] = dev if prev is None else (1 - self.alpha) * prev + self.alpha * dev
            self.rates[o.name] = (1 - self.alpha) * old + self.alpha * v

    def complete(self, names: Sequence[str]) -> bool:
        return all(n in self.rates for n in names)

    def rescale(self, name: str, cost_ratio: float) -> None:
        """``name`` costs ``cost_ratio`` times what it did per row (``Observation.extra["cost_shifts"]``)."""
        if name in self.rates:
            self.rates[name] /= cost_ratio


class PlumberPolicy(Policy):
    """Plumber's LP on measured per-slot rates, with a hysteresis sized by the measured noise.

    A plan moves only when its predicted gain clears ``plumber_min_gain`` and
    ``plumber_noise_k`` times the noise of the ratio it rests on (the current
    and the planned bottleneck's rate estimates; at most
    ``plumber_max_required_gain``), and never back to an allocation measured in
    the last ``plumber_memory_s`` seconds unless that allocation's *measured*
    throughput beat the current one's by the same margin. Without it,
    a 2-core machine's noise (10-30% between windows) made the LP swap between
    near-equal allocations at every re-plan, each swap costing a pool resize.
    """

    name = "plumber"

    def __init__(self, spec: TunerSpec):
        super().__init__(spec)
        self.warmup_s = float(self.opts.get("plumber_warmup_s", 4.0))
        self.replan_s = float(self.opts.get("plumber_replan_s", 10.0))
        self.min_gain = float(self.opts.get("plumber_min_gain", 0.03))
        self.noise_k = float(self.opts.get("plumber_noise_k", 2.0))
        self.memory_s = float(self.opts.get("plumber_memory_s", 60.0))
        # so that very noisy windows slow the policy down rather than freeze it
        self.max_required_gain = float(self.opts.get("plumber_max_required_gain", 0.25))
        self.settle_s = float(self.opts.get("settle_s", 1.0)) + 1.0
        self.mem = _RateMemory()
        self.plans = 0
        self.held = 0  # plans the hysteresis held back
        self.last_prediction: float | None = None
        self.last_rates: dict[str, float] = {}
        self.last_required_gain = self.min_gain
        # allocation -> (smoothed measured samples/s, time of its last measurement)
        self.measured: dict[tuple[tuple[str, int], ...], tuple[float, float]] = {}
        self._last_hold: tuple[Allocation, str] | None = None
        # Off for the `plumber` baseline (Plumber's model is linear); `auto` turns it on: the LP then
        # keeps each operator within the slots measured to pay (tuner/scaling.py) and plans with the
        # capacity measured there, so an operator that slows down past a peak is not given more.
        self.scaling = (ScalingMemory(spec.names, horizon=120, share_of_linear_gain=0.0)
                        if self.opts.get("plumber_measured_scaling") else None)
        self._unchanged: dict[str, int] = {}  # operator -> ticks since its slots last changed
        self._prev_alloc: Allocation | None = None

    @staticmethod
    def _key(alloc: Allocation) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(alloc.items()))

    def on_block_rows_change(self) -> None:
        self.mem = _RateMemory()
        self.measured.clear()
        if self.scaling is not None:
            self.scaling = ScalingMemory(self.spec.names, horizon=120, share_of_linear_gain=0.0)

    def _record_throughput(self, obs: Observation, alloc: Allocation) -> None:
        if obs.since_change_s < self.settle_s or obs.throughput <= 0:
            return
        key = self._key(alloc)
        old = self.measured.get(key)
        v = obs.throughput if old is None else (1 - self.mem.alpha) * old[0] + self.mem.alpha * obs.throughput
        self.measured[key] = (v, obs.t)

    def required_gain(self, alloc: Allocation, new: Allocation, per_slot: dict[str, float]) -> float:
        """The predicted gain a move must clear: the noise of the two bottleneck estimates it compares."""
        def bottleneck(a: Allocation) -> str:
            return min(per_slot, key=lambda n: a.get(n, 0) * per_slot[n])

        noise = [self.mem.noise.get(bottleneck(a), 0.0) for a in (alloc, new)]
        # a smoothed estimate's error is ~0.58x one window's (alpha 0.5), the ratio's ~sqrt(2) that
        by_noise = self.noise_k * 0.58 * math.sqrt(noise[0] ** 2 + noise[1] ** 2)
        return max(self.min_gain, min(by_noise, self.max_required_gain))

    def _measured_worse(self, obs: Observation, alloc: Allocation, new: Allocation, required: float) -> bool:
        """``new`` was measured lately and did not beat ``alloc``'s measured throughput by ``required``."""
        then = self.measured.get(self._key(new))
        now = self.measured.get(self._key(alloc))
        if then is None or now is None or obs.t - then[1] > self.memory_s:
            return False
        return then[0] < now[0] * (1 + required)

    def _hold(self, new: Allocation, gain: float, required: float, reason: str) -> None:
        self.held += 1
        # A held plan is re-planned every tick until something moves: note it when it changes, not each time.
        if (dict(new), reason) != self._last_hold:
            self._last_hold = (dict(new), reason)
            self.notes.append({"held": dict(new), "predicted_gain": gain, "required_gain": required,
                               "reason": reason})

    def _record_scaling(self, obs: Observation, alloc: Allocation) -> None:
        for name, k in alloc.items():
            same = self._prev_alloc is not None and self._prev_alloc.get(name) == k
            self._unchanged[name] = self._unchanged.get(name, 0) + 1 if same else 0
        self._prev_alloc = dict(alloc)
        self.scaling.record(alloc, {o.name: o.capacity for o in obs.ops
                                    if o.measured and self._unchanged.get(o.name, 0) >= 3})

    def _within_measured_scaling(self, specs: Sequence[OpSpec], alloc: Allocation,
                                 per_slot: dict[str, float]) -> tuple[list[OpSpec], dict[str, float]]:
        """Each operator capped at the slots past which more were measured not to pay (its per-slot
        rate the capacity measured there over those slots), and otherwise at twice the most slots it
        was measured at (or 4 more): one plan's jump from 3 slots to 18 measured only the two ends,
        and the peak between them was never found."""
        capped, rates = [], dict(per_slot)
        for s in specs:
            limit = self.scaling.limit(s.name)
            if limit is not None and limit >= s.min_slots:
                curve = self.scaling.settled(s.name)
                rates[s.name] = curve[limit] / limit
                # the peak may lie between the last count that paid and the next one measured: halve
                above = min(k for k in curve if k > limit)
                limit = (limit + above) // 2
            else:
                most = max([alloc[s.name], *self.scaling.settled(s.name)])
                limit = max(2 * most, most + 4)
            capped.append(dataclasses.replace(s, max_slots=min(s.max_slots or limit, limit)))
        return capped, rates

    def _note_cost_shifts(self, obs: Observation) -> None:
        """An operator's cost per row changed: its rate is rescaled, what it measured at other slots is
        forgotten, and so is what every allocation delivered (each did so at the old cost)."""
        for name, ratio in (obs.extra.get("cost_shifts") or {}).items():
            self.mem.rescale(name, ratio)
            self.measured.clear()
            if self.scaling is not None:
                self.scaling.forget(name)
                self._unchanged[name] = 0

    def decide(self, obs, alloc, specs, budget):
        self._note_cost_shifts(obs)
        self.mem.update(obs, min_since_change=self.settle_s)
        self._record_throughput(obs, alloc)
        if self.scaling is not None:
            self._record_scaling(obs, alloc)
        wait = self.warmup_s if self.plans == 0 else self.replan_s
        if obs.since_change_s < wait:
            return None
        names = [s.name for s in specs]
        if not self.mem.complete(names) and obs.since_change_s < 3 * wait:
            return None
        per_slot = per_slot_samples(obs, self.mem.rates)
        per_slot.update({n: v for n, v in self.mem.rates.items() if n in per_slot})
        current = min(alloc[s.name] * per_slot[s.name] for s in specs)  # as measured at ``alloc``
        if self.scaling is not None:
            specs, per_slot = self._within_measured_scaling(specs, alloc, per_slot)
        sol = solve_lp(specs, per_slot, budget)
        self.last_rates = dict(per_slot)
        self.last_prediction = sol.predicted_integer_throughput
        if sol.allocation != alloc:
            required = self.required_gain(alloc, sol.allocation, per_slot)
            self.last_required_gain = required
            gain = sol.predicted_integer_throughput / current - 1.0 if current > 0 else math.inf
            if gain < required:
                self._hold(sol.allocation, gain, required, "predicted gain within the measured noise")
            elif self._measured_worse(obs, alloc, sol.allocation, required):
                self._hold(sol.allocation, gain, required, "measured no better when it last ran")
            else:
                self.plans += 1
                self._last_hold = None
                return sol.allocation
        if self.plans == 0:
            self.plans = 1  # the first plan kept the allocation; from now on, re-plan periodically
        return None

    def describe(self) -> str:
        p = f", predicts {self.last_prediction:,.0f}/s" if self.last_prediction else ""
        h = f", {self.held} held (gain under {self.last_required_gain:.0%})" if self.held else ""
        return f"plumber: {self.plans} plan(s){p}{h}"

    def explain(self, obs, alloc, new, specs, budget):
        # the very rates the LP planned with
        return explain_move(obs, alloc, new, specs, self.last_rates or per_slot_samples(obs))


class HillClimbPolicy(Policy):
    """tf.data AUTOTUNE-style hill climbing.

    AUTOTUNE models the pipeline's output latency as the sum over operators of
    their per-element time divided by their parallelism, and greedily adds one
    unit of parallelism where the modelled latency drops most, until the budget
    is spent or nothing helps (the gain falls under ``hill_min_gain``). Here the
    per-element times are measured live (worker busy time per output sample), the
    climb starts at one slot per operator and takes one step per ``hill_measure_s``
    so each step is measured before the next; every ``hill_reprobe_s`` it re-runs
    the greedy from scratch on fresh measurements (as AUTOTUNE re-optimises
    periodically) and moves there if the modelled latency drops.
    """

    name = "hill_climb"

    def __init__(self, spec: TunerSpec):
        super().__init__(spec)
        self.measure_s = float(self.opts.get("hill_measure_s", 3.0))
        self.eps = float(self.opts.get("hill_min_gain", 0.01))
        self.reprobe_s = float(self.opts.get("hill_reprobe_s", 20.0))
        self.phase = "start"
        self.mem = _RateMemory()
        self.steps = 0

    @staticmethod
    def _latency(alloc, per_slot) -> float:
        return sum(1.0 / (alloc[n] * per_slot[n]) for n in alloc)

    def _best_step(self, alloc, specs, budget, per_slot) -> tuple[str | None, float]:
        best, gain = None, 0.0
        for s in specs:
            if used_cpus(alloc, specs) + s.num_cpus > budget + 1e-9 or alloc[s.name] + 1 > s.upper(budget):
                continue
            n, r = alloc[s.name], per_slot[s.name]
            g = (1.0 / (n * r) - 1.0 / ((n + 1) * r)) / s.num_cpus  # latency saved per CPU
            if g > gain:
                best, gain = s.name, g
        return best, gain

    def _greedy(self, specs, budget, per_slot) -> Allocation:
        alloc = {s.name: s.min_slots for s in specs}
        while True:
            name, gain = self._best_step(alloc, specs, budget, per_slot)
            if name is None or gain * self._cpu_scale(specs) < self.eps * self._latency(alloc, per_slot):
                return alloc
            alloc[name] += 1

    @staticmethod
    def _cpu_scale(specs) -> float:
        return min(s.num_cpus for s in specs)

    def decide(self, obs, alloc, specs, budget):
        self.mem.update(obs, 1.0)
        if self.phase == "start":
            self.phase = "climb"
            if self.opts.get("hill_start", "min") == "min":
                return {s.name: s.min_slots for s in specs}
            return None
        if obs.since_change_s < self.measure_s:
            return None
        per_slot = per_slot_samples(obs, self.mem.rates)
        per_slot.update({n: v for n, v in self.mem.rates.items() if n in per_slot})
        if self.phase == "climb":
            name, gain = self._best_step(alloc, specs, budget, per_slot)
            if name is None or gain * self._cpu_scale(specs) < self.eps * self._latency(alloc, per_slot):
                self.phase = "done"
                return None
            self.steps += 1
            new = dict(alloc)
            new[name] += 1
            return new
        if self.phase == "done" and obs.since_change_s >= self.reprobe_s:
            target = self._greedy(specs, budget, per_slot)
            if target != alloc and self._latency(target, per_slot) < (1 - self.eps) * self._latency(alloc, per_slot):
                self.steps += 1
                return target
        return None

    def describe(self) -> str:
        return f"hill_climb: {self.phase}, {self.steps} step(s) taken"


def enumerate_allocations(specs: Sequence[OpSpec], budget: float, limit: int = 200_000) -> list[Allocation] | None:
    """Every maximal whole-slot allocation within ``budget`` (no slot can be added);
    ``None`` when there are more than ``limit``."""
    names = [s.name for s in specs]
    out: list[Allocation] = []
    min_cpu = min(s.num_cpus for s in specs)

    def rec(i: int, left: float, cur: list[int]) -> bool:
        if len(out) > limit:
            return False
        if i == len(specs) - 1:
            s = specs[i]
            n = min(int(math.floor(left / s.num_cpus + 1e-9)), s.upper(budget))
            if n < s.min_slots:
                return True
            full = cur + [n]
            rest = left - n * s.num_cpus
            if rest + 1e-9 < min_cpu or all(full[j] >= specs[j].upper(budget) or specs[j].num_cpus > rest + 1e-9
                                              for j in range(len(specs))):
                out.append(dict(zip(names, full)))
            return True
        s = specs[i]
        tail_min = sum(t.min_slots * t.num_cpus for t in specs[i + 1:])
        hi = min(s.upper(budget), int(math.floor((left - tail_min) / s.num_cpus + 1e-9)))
        for n in range(s.min_slots, hi + 1):
            if not rec(i + 1, left - n * s.num_cpus, cur + [n]):
                return False
        return True

    ok = rec(0, budget, [])
    return out if ok and len(out) <= limit else None


def neighbourhood(specs: Sequence[OpSpec], center: Allocation, budget: float, radius: int = 2) -> list[Allocation]:
    """Every allocation within ``radius`` slots of ``center`` per operator that fits ``budget``: the
    search space where there are too many allocations to enumerate."""
    names = [s.name for s in specs]
    ranges = [range(max(s.min_slots, center[s.name] - radius), min(s.upper(budget), center[s.name] + radius) + 1)
              for s in specs]
    return [a for a in (dict(zip(names, v)) for v in itertools.product(*ranges))
            if used_cpus(a, specs) <= budget + 1e-9]


class OraclePolicy(Policy):
    """Exhaustive search, measured live: the candidates one after another, then the best
    ``oracle_finalists`` (and every ``oracle_extra_candidates`` allocation: the benchmark's other
    policies' final allocations) again for ``oracle_final_measure_s`` each. Picking the maximum of
    short noisy windows keeps the luckiest window (the winner's curse); re-measuring the
    finalists for longer picks by a measurement that was not used to select them.

    When there are too many allocations to measure, the shortlist is the best
    ``oracle_max_measured`` under a model measured over ``oracle_warmup_s`` at the initial
    allocation: each operator's samples/s per *occupied* slot, so that per-task overheads
    count (a busy-time model calls cheap operators cheaper than they are and starves them)."""

    name = "oracle"

    def __init__(self, spec: TunerSpec):
        super().__init__(spec)
        # Each candidate: let the pipeline settle after the switch (in-flight tasks of the old allocation
        # finish), then average the delivered rate over the measurement window; one ~1 s tick is too
        # coarse (a block of thousands of rows lands in one tick or the next).
        self.settle_s = float(self.opts.get("oracle_settle_s", 2.0))
        self.measure_s = float(self.opts.get("oracle_measure_s", 4.0))
        # how long the initial allocation is measured before a model shortlist is drawn from it
        self.warmup_s = float(self.opts.get("oracle_warmup_s", 0.0))
        self.n_finalists = int(self.opts.get("oracle_finalists", 0))
        self.final_measure_s = float(self.opts.get("oracle_final_measure_s", 2 * self.measure_s))
        self._rows = self._secs = 0.0
        self.max_measured = int(self.opts.get("oracle_max_measured", 12))
        given = self.opts.get("oracle_candidates")
        self.candidates: list[Allocation] | None = [dict(c) for c in given] if given else None
        self.source = "benchmark shortlist" if given else None
        # allocations the oracle must beat (the benchmark passes every other policy's final one): each is
        # a finalist, measured as long as the oracle's own best, so the pick is at least as good by construction
        names = [o.name for o in spec.ops]
        # an extra is an allocation, or {"allocation": ..., "block_rows": n} where blocks are resizable
        extras = [c if "allocation" in c else {"allocation": c, "block_rows": None}
                  for c in self.opts.get("oracle_extra_candidates") or []]
        self.rows0 = spec.block_rows.initial if spec.block_rows is not None else None
        self.extra_pairs: list[tuple[Allocation, int | None]] = [
            (dict(c["allocation"]), c.get("block_rows") or self.rows0) for c in extras
            if sorted(c["allocation"]) == sorted(names)]
        self.extra: list[Allocation] = [a for a, _ in self.extra_pairs]
        # rows per block (where the pipeline can resize its blocks): first every size at the initial
        # allocation, then the allocation search at the best size, then a final pass
        self.want_rows = self.rows0
        self.block_queue: list[tuple[Allocation, int]] = []
        self.block_results: list[tuple[float, Allocation, int]] = []
        self.block_stage: str | None = None  # None | "first" | "allocations" | "final" | "done"
        self.block_settle_s = max(self.settle_s, float(self.opts.get("oracle_block_settle_s", 4.0)))
        self.drain = Drain(self.block_settle_s)  # the old blocks come out before a size is measured
        self.delivering_t: float | None = None
        self.results: list[tuple[float, Allocation]] = []
        self.finals: list[tuple[float, Allocation]] = []
        self.finalists: list[Allocation] = []
        self.idx = -1
        self.best: Allocation | None = None
        self.mem = _RateMemory()
        self._proposed_t = 0.0  # when the allocation being measured was proposed
        self.occupied = OccupiedSlotRates()  # samples/s per occupied slot over the warm-up

    def _propose(self, obs, alloc: Allocation) -> Allocation:
        # own clock: a candidate equal to the allocation in force changes nothing, so the
        # controller's time-since-change would not restart for it
        self._proposed_t = obs.t
        self._rows = self._secs = 0.0
        return alloc

    def _plan(self, obs, alloc, specs, budget) -> bool:
        every = enumerate_allocations(specs, budget, limit=50_000)
        if every == []:  # the minimums do not fit the budget in force: nothing to search yet
            return False
        if every is not None and len(every) <= self.max_measured:
            self.candidates, self.source = every, f"all {len(every)} allocations"
            return True
        # too many to measure: wait for a model, then measure its best
        if obs.since_change_s > self.settle_s:
            factors = obs.extra.get("sink_factors") or [1.0] * len(obs.ops)
            for o, f in zip(obs.ops, factors):
                self.occupied.add(o.name, o.out_rate * f, o.running)
        if obs.since_change_s < self.warmup_s:
            return False
        if not self.mem.complete([s.name for s in specs]) and obs.since_change_s < max(12.0, self.warmup_s):
            return False
        occupied = self.occupied.rates()
        if self.warmup_s > 0 and all(occupied.get(s.name, 0.0) > 0 for s in specs):
            per_slot, model = occupied, "occupied-slot"
        else:
            per_slot, model = per_slot_samples(obs, self.mem.rates), "busy-time"
            per_slot.update(self.mem.rates)
        if every is None:  # neighbourhood of the LP optimum
            every = neighbourhood(specs, solve_lp(specs, per_slot, budget).allocation, budget)
            total = "the LP optimum's +-2 neighbourhood"
        else:
            total = f"{len(every)} allocations"
        # the slowest operator's capacity first, then the next slowest (many allocations tie on the first)
        scored = sorted(every, key=lambda a: sorted(a[s.name] * per_slot[s.name] for s in specs), reverse=True)
        self.candidates = scored[: self.max_measured]
        self.source = f"best {len(self.candidates)} of {total} by the measured {model} model"
        return True

    def _measured(self, obs, window_s: float) -> float | None:
        """The mean delivered rate once the proposed allocation has settled and been measured."""
        since = obs.t - self._proposed_t  # every candidate is proposed through _propose
        if since <= self.settle_s:
            return None
        self._rows += obs.throughput * obs.window_s
        self._secs += obs.window_s
        if since < self.settle_s + window_s:
            return None
        return self._rows / max(self._secs, 1e-9)

    def decide(self, obs, alloc, specs, budget):
        self.mem.update(obs, 1.0)
        if self.delivering_t is None and obs.throughput > 0:
            self.delivering_t = obs.t
        if self.rows0 is not None and self.block_stage is None:
            # not the workers' start-up measured as the first size
            if self.delivering_t is None or obs.t - self.delivering_t < self.warmup_s:
                return None
            return self._start_blocks(obs, alloc)
        if self.block_stage in ("first", "final"):
            return self._decide_blocks(obs, alloc)
        if self.best is not None:
            return None
        if self.candidates is None:
            if not self._plan(obs, alloc, specs, budget):
                return None
            self.idx = 0
            return self._propose(obs, self.candidates[0])
        if self.idx < 0:  # a shortlist given up front: start on its first
            self.idx = 0
            return self._propose(obs, self.candidates[0])
        if self.idx < len(self.candidates):  # first pass: every candidate
            rate = self._measured(obs, self.measure_s)
            if rate is None:
                return None
            self.results.append((rate, dict(alloc)))
            self.idx += 1
            if self.idx < len(self.candidates):
                return self._propose(obs, self.candidates[self.idx])
            ranked = [a for _, a in sorted(self.results, key=lambda r: -r[0])]
            self.finalists = ranked[: self.n_finalists] if len(ranked) > 1 else []
            if self.extra:
                self.finalists = self.finalists or ranked[:1]
                self.finalists += [a for a in self.extra if a not in self.finalists]
            if not self.finalists:
                return self._done(obs, ranked[0])
            return self._propose(obs, self.finalists[0])
        rate = self._measured(obs, self.final_measure_s)  # second pass: the finalists, longer
        if rate is None:
            return None
        self.finals.append((rate, dict(alloc)))
        k = len(self.finals)
        if k < len(self.finalists):
            return self._propose(obs, self.finalists[k])
        _, best = max(self.finals, key=lambda r: r[0])
        return self._done(obs, best)

    # -- rows per block: every size at the initial allocation first (per-task costs scale every operator
    # alike), the allocation search at the best one, then the pick again beside the other policies'
    # final (allocation, size) pairs, so it is as good as theirs by construction
    def _start_blocks(self, obs, alloc: Allocation) -> Allocation:
        sizes = doubled_sizes(self.rows0, self.spec.block_rows.max_rows or 16 * self.rows0)
        self.block_stage, self.block_queue, self.block_results = "first", [(dict(alloc), r) for r in sizes], []
        return self._propose_rows(obs, *self.block_queue[0])

    def _done(self, obs, best: Allocation) -> Allocation:
        self.best = best
        if self.rows0 is None or self.block_stage == "final":
            return best
        final = [(best, self.want_rows)]
        final += [(a, r) for a, r in self.extra_pairs if r != self.want_rows and (a, r) not in final]
        if len(final) == 1:
            self.block_stage = "done"
            return best
        self.block_stage, self.block_queue, self.block_results = "final", final, []
        return self._propose_rows(obs, *final[0])

    def _propose_rows(self, obs, alloc: Allocation, rows: int) -> Allocation:
        if rows != self.want_rows:
            self.drain.start(obs, self.want_rows, rows)
        else:  # the allocation alone changes: settle as for any other candidate
            self.drain = Drain(self.block_settle_s)
            self.drain.start(obs, 0)
        self.want_rows = rows
        self._proposed_t = obs.t
        self._rows = self._secs = 0.0
        return alloc

    def _measured_rows(self, obs, window_s: float) -> float | None:
        if not self.drain.update(obs):
            return None
        self._rows += obs.throughput * obs.window_s
        self._secs += obs.window_s
        if obs.t - self.drain.done_t < window_s:
            return None
        return self._rows / max(self._secs, 1e-9)

    def _decide_blocks(self, obs, alloc: Allocation) -> Allocation | None:
        window = self.measure_s if self.block_stage == "first" else self.final_measure_s
        rate = self._measured_rows(obs, window)
        if rate is None:
            return None
        _, rows = self.block_queue[len(self.block_results)]
        self.block_results.append((rate, dict(alloc), rows))
        k = len(self.block_results)
        if self.block_stage == "first" and k < len(self.block_queue):
            nxt = self.block_queue[k][1]
            fits = (not math.isfinite(obs.mem_limit) or obs.mem_used <= 0
                    or obs.mem_used * nxt / rows <= 0.8 * obs.mem_limit)
            if fits:  # larger blocks hold more of the object store: stop before the limit
                return self._propose_rows(obs, *self.block_queue[k])
        elif k < len(self.block_queue):
            return self._propose_rows(obs, *self.block_queue[k])
        best_rate, best_alloc, best_rows = max(self.block_results, key=lambda x: x[0])
        if self.block_stage == "first":  # the allocation search at the best size
            self.block_stage = "allocations"
            self.want_rows = best_rows
            self._proposed_t = obs.t
            self.extra = [a for a, r in self.extra_pairs if r == best_rows]
            return dict(alloc)
        self.best, self.want_rows, self.block_stage = best_alloc, best_rows, "done"
        return self.best

    def decide_block_rows(self, obs, alloc):
        if self.want_rows is None:
            return None
        what = "the pick" if self.block_stage == "done" else f"measuring ({self.block_stage} pass)"
        return self.want_rows, {"bottleneck": obs.bottleneck(), "expected_gain": None,
                                "text": f"oracle: blocks of {self.want_rows:,} rows, {what}"}

    def describe(self) -> str:
        n = len(self.candidates) if self.candidates else 0
        if self.block_stage in ("first", "final"):
            state = (f"blocks of {self.want_rows:,} rows, {self.block_stage} pass "
                     f"{len(self.block_results) + 1}/{len(self.block_queue)}")
        elif self.best is not None:
            state = "done" if self.want_rows is None else f"done (blocks of {self.want_rows:,} rows)"
        elif self.idx >= n and self.finalists:
            state = f"re-measuring finalist {len(self.finals) + 1}/{len(self.finalists)}"
        else:
            state = f"measuring {max(self.idx, 0) + 1}/{n}"
        return f"oracle: {state} ({self.source})"


class RLPolicy(Policy):
    name = "rl"

    def __init__(self, spec: TunerSpec):
        super().__init__(spec)
        from dlrm_platform.tuner.features import FeatureState
        from dlrm_platform.tuner.rl import RLPolicyRunner

        self.runner = RLPolicyRunner.load(spec.policy_path)
        self.measure_after_delivery_s = float(self.opts.get("rl_measure_after_delivery_s",
                                                            self.runner.measure_after_delivery_s))
        runner_options = {"rl_return_past_limit": ("return_past_limit", bool),
                          "rl_return_no_faster_past": ("return_no_faster_past",
                                                       lambda v: None if v is None else float(v)),
                          "rl_return_delivered_drop": ("return_delivered_drop",
                                                       lambda v: None if v is None else float(v)),
                          "rl_return_unmeasured_limit": ("return_unmeasured_limit",
                                                         lambda v: None if v is None else float(v)),
                          "rl_return_unmeasured_limit_slots": ("return_unmeasured_limit_slots", int),
                          "rl_flat_past_limit": ("flat_past_limit", lambda v: None if v is None else float(v)),
                          "rl_busy_max_age_s": ("busy_max_age_s", lambda v: None if v is None else float(v)),
                          "rl_noisy_max_repeat": ("noisy_max_repeat", lambda v: None if v is None else int(v)),
                          "rl_noisy_growth_noise": ("noisy_growth_noise", float),
                          "rl_slope_sized_growth": ("slope_sized_growth", bool),
                          "rl_one_slot_after_release": ("one_slot_after_release", bool),
                          "rl_one_slot_after_aged_limit": ("one_slot_after_aged_limit", bool),
                          "rl_chain_slots": ("chain_slots", int),
                          "rl_sized_shield": ("sized_shield", bool),
                          "rl_clear_bar": ("clear_bar", bool),
                          "rl_held_mean_ticks": ("held_mean_ticks", lambda v: None if v is None else int(v)),
                          "rl_held_mean_by_capacity": ("held_mean_by_capacity", bool),
                          "rl_net_move_held_mean_ticks": ("net_move_held_mean_ticks",
                                                          lambda v: None if v is None else int(v)),
                          "rl_held_mean_group_slots": ("held_mean_group_slots", int),
                          "rl_held_mean_group_own_share": ("held_mean_group_own_share",
                                                           lambda v: None if v is None else float(v)),
                          "rl_held_idle_donor_busy": ("held_idle_donor_busy",
                                                      lambda v: None if v is None else float(v)),
                          "rl_held_idle_donor_after_busy": ("held_idle_donor_after_busy", float),
                          "rl_shift_credit_s": ("shift_credit_s", lambda v: None if v is None else float(v)),
                          "rl_credit_low_bar_s": ("credit_low_bar_s", lambda v: None if v is None else float(v)),
                          "rl_credit_keeps_slots": ("credit_keeps_slots", bool),
                          "rl_credit_measures_told_count": ("credit_measures_told_count", bool),
                          "rl_grown_keeps_steps": ("grown_keeps_steps", int),
                          "rl_taken_back_s": ("taken_back_s", lambda v: None if v is None else float(v)),
                          "rl_taken_back_lift_ticks": ("taken_back_lift_ticks",
                                                       lambda v: None if v is None else int(v)),
                          "rl_donor_repair_s": ("donor_repair_s", lambda v: None if v is None else float(v)),
                          "rl_donor_tie_band": ("donor_tie_band", lambda v: None if v is None else float(v)),
                          "rl_donor_keeps_told_after_s": ("donor_keeps_told_after_s",
                                                          lambda v: None if v is None else float(v)),
                          "rl_idle_reads_busy_capacity": ("idle_reads_busy_capacity",
                                                          lambda v: None if v is None else float(v)),
                          "rl_credit_reads_rise": ("credit_reads_rise", bool),
                          "rl_rise_read_until_idle_steps": ("rise_read_until_idle_steps",
                                                            lambda v: None if v is None else int(v)),
                          "rl_shift_reads_busy_after_s": ("shift_reads_busy_after_s",
                                                          lambda v: None if v is None else float(v)),
                          "rl_shift_busy_spread": ("shift_busy_spread", float),
                          "rl_rise_floor_delivered_s": ("rise_floor_delivered_s",
                                                        lambda v: None if v is None else float(v)),
                          "rl_busy_floor_delivered_s": ("busy_floor_delivered_s",
                                                        lambda v: None if v is None else float(v)),
                          "rl_scaling_after_warmup_s": ("scaling_after_warmup_s", float),
                          "rl_waited_on_alpha": ("waited_on_alpha", lambda v: None if v is None else float(v)),
                          "rl_sized_shield_others_util": ("sized_shield_others_util",
                                                          lambda v: None if v is None else float(v))}
        if runner_options.keys() & self.opts.keys():  # this job's own copy (the loaded runner is per process)
            self.runner = copy.copy(self.runner)
            for option, (attr, kind) in runner_options.items():
                if option in self.opts:
                    setattr(self.runner, attr, kind(self.opts[option]))
        self.fs = FeatureState(spec.names)
        self.fs.scaling = self._scaling_memory()
        self.last_action = "hold"
        # operators moved by the last action whose new allocation has not been measured yet
        self.awaiting: set[str] = set()
        # A move waits settle_s + rl_min_hold_s (3 s) after the last: live, a move made on the first
        # window after the one before delivered a median 1.016x against 1.057x for the rest, and a
        # take-back on one window held a right move for 30 s (tuner/README.md, runs 67-68).
        self.min_evidence_s = float(self.opts.get("settle_s", 1.0)) + float(self.opts.get("rl_min_hold_s", 2.0))
        # Judge a move that grew an operator whose own rate is noisy (above `rl_noisy_rate`, or not
        # measured yet: live, tasks that outlast the interval) by the throughput it delivered end to end
        # (tuner/scaling.py AllocationThroughput), before the next move, and go back where a recent
        # allocation delivered clearly more. Moves of operators with quiet counters are left to them.
        # Off by default until measured live on the suite in this form (tuner/README.md, End-to-end
        # judgement).
        self.judge_moves = self._judges_moves()
        self.noisy_rate = float(self.opts.get("rl_noisy_rate", 0.3))
        self.fs.moves.settle_s = float(self.opts.get("settle_s", 1.0))
        self.fs.moves.warmup_s = float(self.opts.get("rl_judge_warmup_s", self.fs.moves.warmup_s))
        self.rates = _RateMemory()  # for the noise of each operator's measured rate
        self.rate_noise: dict[str, float] = {}  # its recent peak (the estimate swings with the noise)
        # a move (one that grew a noisy operator, or a judged move) whose delivered throughput is to be
        # compared before the next move
        self.unjudged = False
        self.shifts_seen = 0  # ScalingMemory.cross_shifts acted on
        self._steer_block_rows()

    def on_epoch_start(self, epoch: int) -> None:
        self.fs.prev = None
        self.fs.climbing = True
        self.awaiting.clear()
        self.unjudged = False
        self.fs.moves.new_execution()

    def _scaling_memory(self) -> ScalingMemory:
        # Under end-to-end judgement a noisy operator's curve is forgotten on a stray window, as before:
        # kept (rescaled), it held rl at a count the judgement then had nothing to compare with (the
        # noisy contended lookup in the simulator: 0.94 of the optimum forgetting, 0.80 rescaling).
        rescale = self.runner.shift_rescales and not self._judges_moves()
        return ScalingMemory(self.spec.names, noise_k=float(self.opts.get("rl_scaling_noise_k",
                                                                          self.runner.scaling_noise_k)),
                             shift_rescales=rescale, horizon_above=self.runner.scaling_horizon_above,
                             delivered_margin=self.runner.scaling_delivered_margin,
                             rescale_since=bool(self.opts.get("rl_rescale_since", False)),
                             limit_hysteresis=self._optional("rl_limit_hysteresis", self.runner.limit_hysteresis,
                                                             float),
                             delivered_window_s=self._optional("rl_delivered_window_s",
                                                               self.runner.scaling_delivered_window_s, float),
                             delivered_max_age=self._optional("rl_delivered_max_age",
                                                              self.runner.scaling_delivered_max_age, int),
                             # the end-to-end judgement compares allocations across moves, so it must
                             # know when a move straddled a cost shift
                             keep_expired_slope=bool(self.opts.get("rl_slope_after_expiry",
                                                                   self.runner.slope_after_expiry)),
                             superlinear_tolerance=self._optional("rl_superlinear_tolerance",
                                                                  self.runner.superlinear_tolerance, float),
                             above_min_readings=self._optional("rl_above_min_readings",
                                                               self.runner.above_min_readings, int),
                             limit_outlives_lower=self._optional("rl_limit_outlives_lower",
                                                                 self.runner.limit_outlives_lower, int),
                             shift_confirm=bool(self.opts.get("rl_shift_confirm", self.runner.shift_confirm)),
                             ended_is_unmeasured=bool(self.opts.get("rl_one_slot_after_ended_limit",
                                                                    self.runner.one_slot_after_ended_limit)),
                             held_point_judges_return=bool(self.opts.get("rl_held_point_judges_return",
                                                                         self.runner.held_point_judges_return)),
                             cross_count_shift=self._optional(
                                 "rl_cross_count_shift",
                                 self.runner.cross_count_shift if self._judges_moves() else None, float))

    def _judges_moves(self) -> bool:
        return bool(self.opts.get("rl_judge_moves", self.runner.judge_moves))

    def _optional(self, option: str, default: float | int | None, kind: type) -> float | int | None:
        """Option ``option`` (else ``default``) as ``kind``; None stays None (the option off)."""
        value = self.opts.get(option, default)
        return None if value is None else kind(value)

    def on_block_rows_change(self) -> None:
        self.fs.scaling = self._scaling_memory()
        self.shifts_seen = 0
        self.fs.moves.new_execution()
        self.fs.reset_best()
        self.fs.climbing = True
        self.fs.held_gains.clear()  # predicted from rates at the old size
        self.rates = _RateMemory()
        self.awaiting.clear()
        self.unjudged = False

    def _note_cost_shifts(self, obs: Observation) -> None:
        """An operator's cost per row changed (``tuner/cost_shift.py``): its scaling curve and any limit
        on it describe the operator before; it is measured afresh (``steady_steps`` at its slots) before its
        curve has a point again, and it may grow back on the shift's credit (``RLPolicyRunner.note_cost_shift``)."""
        if obs.extra.get("cost_shifts"):
            self.fs.taken_back.clear()  # measured at the costs before
            self.fs.cost_shift_t = obs.t  # what was delivered before floors no busy reading after
        for name, ratio in (obs.extra.get("cost_shifts") or {}).items():
            self.rates.rescale(name, ratio)
            self.fs.scaling.forget(name)
            self.fs.steps_since_change[name] = 0
            self.runner.note_cost_shift(obs, self.fs, name, ratio)  # reads the busy figure from before ...
            self.fs.forget_busy_capacity(name)  # ... which then goes: read at the cost before
            if self.judge_moves:
                self.fs.moves.forget()
                self.unjudged = False

    def decide(self, obs, alloc, specs, budget):
        self._note_cost_shifts(obs)
        self.fs.note_delivered(obs, alloc)  # every tick, held or not
        if self.runner.waited_on_alpha is not None:
            self.fs.note_util(obs, self.runner.waited_on_alpha)  # every tick, held or not
        # busy readings count from where the scaling memory's do (``scaling_after_warmup_s``): on the ramp
        # after a warm-up, workers still warming read 30-90% under their later busy figures (live runs 62-63)
        climbing = (self.fs.warming_up_t is not None
                    and obs.t - self.fs.warming_up_t < self.runner.scaling_after_warmup_s)
        busy_util = self.runner.idle_reads_busy_capacity or BUSY_UTIL
        if (self.runner.idle_reads_busy_capacity is not None or self.runner.credit_reads_rise) and not climbing:
            self.runner.stats["busy_floored"] += self.fs.note_busy_capacity(
                obs, busy_util, self.runner.steady_steps, max_age_s=self.runner.busy_max_age_s,
                floor_min_span_s=self.runner.busy_floor_delivered_s)
        if self.runner.rise_read_until_idle_steps is not None:
            self.fs.note_idle(obs, busy_util)
        if self.judge_moves and self.fs.scaling.cross_shifts != self.shifts_seen:
            self.shifts_seen = self.fs.scaling.cross_shifts
            self.fs.moves.forget()  # what was delivered before a cost shift judges nothing after it
            self.unjudged = False
        if self.judge_moves:
            self.fs.moves.record(obs.t, alloc, obs.throughput, obs.window_s, obs.since_change_s)
            self.rates.update(obs, min_since_change=self.min_evidence_s)
            for name in self.rate_noise.keys() | self.rates.noise.keys():
                self.rate_noise[name] = max(self.rates.noise.get(name, 0.0), 0.9 * self.rate_noise.get(name, 0.0))
        # Act on evidence, not on a window that still shows the previous allocation: with
        # large blocks a task outlasts several intervals, and a policy trained on quick
        # counters then reads noise as signal and wanders. Hold until every operator the
        # last move touched has finished work under its new allocation (and, where its
        # counters are too noisy to tell, until the move's delivered throughput is measured).
        if self.awaiting:
            fresh = {o.name for o in obs.ops if o.measured or o.completed}
            judged = not self.unjudged or self.fs.moves.ready(alloc)
            if obs.since_change_s < self.min_evidence_s or not self.awaiting <= fresh or not judged:
                self.fs.tick()
                self.last_action = "hold (measuring the last move)"
                return None
            self.awaiting.clear()
        if self.unjudged and self.fs.moves.ready(alloc):
            self.unjudged = False
            left = self.fs.moves.judge_trial(alloc)
            if left is not None and self._undoes_credit(obs, alloc, left):
                left = None
            if left is not None:  # measured again there, then judged again
                self.runner.stats["undone"] += 1
                return self._judged_move(alloc, left, "back from a judged move that delivered less than where it started")
            back = self.fs.moves.better_than_now(obs.t, alloc)
            if back is not None and self._undoes_credit(obs, alloc, back[0]):
                back = None
            if back is not None:
                target, gain = back
                for name in target:
                    if alloc.get(name, 0) > target[name]:  # its own counters' figures there are contradicted
                        self.fs.scaling.forget_above(name, target[name])
                self.runner.stats["undone"] += 1
                return self._judged_move(alloc, target, (
                    f"back to the allocation that delivered {gain:.0%} more (noise margin "
                    f"{self.fs.moves.margin():.0%}); the operators grown since kept at its slots"))
            probe = self.fs.moves.probe_fewer(obs.t, alloc, {s.name: s.min_slots for s in specs})
            if probe is not None:
                name, k = probe
                return self._judged_move(alloc, {**alloc, name: k}, (
                    f"{k - alloc[name]:+d} {name}: more slots delivered less end to end, trying {k}"))
        new, self.last_action = self.runner.act(obs, alloc, specs, budget, self.fs)
        if new is not None:
            self.fs.note_move(obs.t, alloc, new, self.runner.taken_back_s, self.runner.taken_back_within_s)
            self.awaiting = {n for n in new if new[n] != alloc.get(n)}
            grown = [n for n in new if new[n] > alloc.get(n, 0)]
            # judged, and held until then, only where a grown operator's own counters are too noisy to
            # trust; elsewhere they and the scaling rules judge the move (judging every move cost
            # 0.029 of the optimum on held-out cost-shifted pipelines: pre-shift figures, README)
            self.unjudged = self.judge_moves and any(  # not measured yet: as good as noisy
                self.rate_noise.get(n, math.inf) > self.noisy_rate for n in grown)
        return new

    def _undoes_credit(self, obs: Observation, alloc: Allocation, target: Allocation) -> bool:
        """``target`` has fewer slots of an operator still on a shift's credit (its cost per row measured to
        rise): what "delivered more" there is the queues built before the shift draining to the sink
        (simulated, rl went back from 2 and 4 slots of an operator whose cost rose 8x to 1, where 4 deliver
        4x what 1 does, tests/tuner/test_policies.py)."""
        return any(target.get(n, 0) < alloc.get(n, 0) and self.runner.credited(obs, self.fs, n) is not None
                   for n in list(self.fs.shift_credit))

    def _judged_move(self, alloc: Allocation, target: Allocation, why: str) -> Allocation:
        """A move of the end-to-end judgement's: measured, then judged again (before the net moves)."""
        self.awaiting = {n for n in target if target[n] != alloc.get(n)}
        self.unjudged = True
        self.fs.tick()
        self.fs.note_action(alloc, target)
        self.last_action = why
        return target

    def describe(self) -> str:
        # the slots past which more were measured not to pay: each tick's record then shows why rl did not
        # (or did) grow an operator, which its scaling memory decides and the tick did not carry
        limits = [f"{n} {k}" for n in self.spec.names if (k := self.fs.scaling.limit(n)) is not None]
        paid = f" [more slots measured not to pay past: {', '.join(limits)}]" if limits else ""
        # and why a limit ended, on the tick it did (live, a lookup's limit vanished and the net's "+1" took
        # it past its peak with nothing in the record to say why: tuner/README.md, runs 79c and 80)
        ended = "".join(f" [{n}: {why}]" for n, why in self.fs.scaling.pop_ended().items())
        return self._with_blocks(f"rl: {self.last_action}{paid}{ended}")


class AutoPolicy(Policy):
    """The default policy: decides, per execution, what steers the pipeline it finds.

    * One tuned operator (the fused read..batch task, ``ingest.fusion``): there are no CPUs to
      move between operators and the fused operator's task count is fixed when the pipeline
      is built (``ingest.pipeline.fused_operator`` sizes it to the data CPUs), so it holds
      the config's numbers, as ``static`` does, and says so.
    * Several operators (``ingest.fusion: off``): ``plumber``, with each operator kept within the
      slots measured to pay (``tuner/scaling.py``; the ``plumber`` baseline is the linear model
      alone). On held-out simulated pipelines it reaches 0.986 of the optimum against 0.969 for
      ``rl``, 0.96 where an operator slows down past a peak (plain plumber 0.47), and live it
      ties ``rl`` on the benchmark pipeline; each of its moves comes from a model (the LP)
      whose prediction is the decision's explanation.
    * An epoch the epoch cache replays runs no pipeline: there is nothing to steer, and the
      job's tuner report says so (``TunerHandle.log_to_mlflow``).

    Its choice is recorded once per execution, as it starts (``note`` records, the run's tuner history).
    """

    name = "auto"

    def __init__(self, spec: TunerSpec):
        super().__init__(spec)
        self.inner: Policy | None = None
        self.choice: str | None = None
        self.reason = ""
        self._steer_block_rows()

    def on_epoch_start(self, epoch: int) -> None:
        self.choice = None  # re-decided for the execution's operators
        if self.inner is not None:
            self.inner.on_epoch_start(epoch)

    def on_execution_operators(self, specs: Sequence[OpSpec]) -> None:
        # chosen as the execution starts, so that a pass too short to observe still records the choice
        self._choose(specs)

    def on_block_rows_change(self) -> None:
        if self.inner is not None:
            self.inner.on_block_rows_change()

    def _choose(self, specs: Sequence[OpSpec]) -> None:
        if len(specs) <= 1:
            name = specs[0].name if specs else "none"
            self.choice = "static"
            self.reason = (f"one operator ({name}: read..batch fused into one task); no CPUs to move between "
                           "operators, its task count is sized to the data CPUs when the pipeline is built")
        else:
            self.choice = "plumber"
            if not isinstance(self.inner, PlumberPolicy):
                # within the slots measured to pay: 0.47 -> 0.96 of the optimum where an operator slows
                # down past a peak, 0.986 either way on 192 held-out simulated pipelines (tuner/README.md)
                opts = {"plumber_measured_scaling": True, **self.spec.options}
                self.inner = PlumberPolicy(dataclasses.replace(self.spec, options=opts))
            self.reason = (f"{len(specs)} operators ({', '.join(s.name for s in specs)}): plumber's LP over "
                           "their measured per-slot rates, each operator within the slots measured to pay")
        self.notes.append({"choice": self.choice, "reason": self.reason})

    def decide(self, obs, alloc, specs, budget):
        if self.choice is None:
            self._choose(specs)
        if self.choice == "static" or self.inner is None:
            return None
        return self.inner.decide(obs, alloc, specs, budget)

    def explain(self, obs, alloc, new, specs, budget):
        if self.inner is not None:
            return self.inner.explain(obs, alloc, new, specs, budget)
        return super().explain(obs, alloc, new, specs, budget)

    def pop_notes(self) -> list[dict]:
        return super().pop_notes() + (self.inner.pop_notes() if self.inner is not None else [])

    def describe(self) -> str:
        if self.choice is None:
            return "auto: choosing"
        inner = f" ({self.inner.describe()})" if self.choice != "static" and self.inner is not None else ""
        return self._with_blocks(f"auto -> {self.choice}{inner}")


POLICY_CLASSES = {
    "static": StaticPolicy,
    "ray_default": RayDefaultPolicy,
    "plumber": PlumberPolicy,
    "hill_climb": HillClimbPolicy,
    "oracle": OraclePolicy,
    "rl": RLPolicy,
    "auto": AutoPolicy,
}


def make_policy(spec: TunerSpec) -> Policy:
    return POLICY_CLASSES[spec.policy](spec)
