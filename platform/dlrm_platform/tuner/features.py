"""Normalised RL observations, identical live and in the simulator.

Nothing here depends on a pipeline's absolute speed, its number of CPUs or its
number of operators: rates appear only as ratios (an operator's capacity over
the delivered throughput, throughput over the best seen), CPUs only as shares
of the budget, and operators are padded to ``K_MAX`` with a validity flag. This
is what lets one pretrained policy act on pipelines it never saw.

Layout of the flat vector: ``K_MAX x F`` per-operator features, ``G`` global
features, then the ``N_ACTIONS`` action mask (1 = allowed).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from dlrm_platform.tuner.actions import K_MAX, N_ACTIONS, action_mask, free_cpus
from dlrm_platform.tuner.observe import Observation, OpObs
from dlrm_platform.tuner.scaling import AllocationThroughput, ScalingMemory
from dlrm_platform.tuner.spec import OpSpec

F = 12   # per-operator features
G = 7    # global features
OBS_DIM = K_MAX * F + G + N_ACTIONS

OP_FEATURES = (
    "valid", "cpu_share", "util", "log_capacity_ratio", "measured", "queue",
    "backpressure", "at_min", "recently_changed", "is_bottleneck",
    "log_capacity_ratio_plus_one", "log_capacity_ratio_minus_one",
)
GLOBAL_FEATURES = (
    "free_cpu_share", "memory", "log_throughput_vs_best", "dlog_throughput",
    "recently_acted", "num_ops", "data_wait",
)


#: ticks of delivered throughput ``FeatureState`` keeps (``note_delivered``): a minute and more at ~1 s a tick
DELIVERED_TICKS = 90
#: the holds ``FeatureState.held_gains`` keeps (rl's ``held_mean_ticks`` reads at most these)
HELD_GAIN_TICKS = 30


class Hold(NamedTuple):
    """What one hold of rl's read (``FeatureState.note_held_gain``)."""

    bottleneck: str
    #: the bottleneck's "+1"'s predicted relative gain
    gain: float
    #: samples/s each operator could sustain at its slots (None: not read)
    caps: dict[str, float | None]
    #: share of each operator's slots running tasks over the hold's window
    busy: dict[str, float]
    #: ... and held by a task at all, those whose outputs were not read included (``OpObs.throttled``)
    occupied: dict[str, float]


#: a reading of an operator whose slots were at least this share busy is a busy reading
#: (``FeatureState.note_busy_capacity``; rl's ``idle_reads_busy_capacity`` and ``credit_reads_rise``)
BUSY_UTIL = 0.8


class FeatureState:
    """What the features remember between steps (per controller / episode)."""

    def __init__(self, names: Sequence[str]):
        self.steps_since_change = {n: 99 for n in names}
        self.steps_since_action = 99
        self.best = 0.0
        self.prev: float | None = None
        self.ema: float | None = None
        # not features: the policy's memory of how each operator scaled and of what each allocation
        # delivered end to end (rl's shield reads both)
        self.scaling = ScalingMemory(names)
        self.moves = AllocationThroughput()
        #: when the pipeline last read as warming up (``Observation.warming_up``; None: not seen)
        self.warming_up_t: float | None = None
        #: the ``warming_up_t`` whose climb rl's scaling memory has forgotten (``RLPolicyRunner.scaling_after_warmup_s``)
        self.climb_forgotten_t: float | None = None
        #: the pass has not held yet since its operators were measured: rl's moves still climb from the
        #: start allocation (``RLPolicyRunner.chain_slots``)
        self.climbing = True
        #: operator -> its busy share of its slots, smoothed over ticks (``note_util``)
        self.util: dict[str, float] = {}
        #: operator -> (slots, until when) it may grow to bar its counters' noise after its cost per row
        #: rose (rl's ``shift_credit_s``)
        self.shift_credit: dict[str, tuple[int, float]] = {}
        #: operator -> its slots when that rise was told: while the credit runs it keeps at least those
        #: (rl's ``credit_keeps_slots``)
        self.shift_told_slots: dict[str, int] = {}
        #: operator -> its measured capacity (samples/s) in the reading the rise was told in (None: none read;
        #: rl's ``credit_measures_told_count``)
        self.shift_told_capacity: dict[str, float | None] = {}
        #: operator -> the capacity per slot (samples/s) its rise implies: what it read busy before, divided by
        #: the rise (rl's ``credit_reads_rise``)
        self.shift_capacity_per_slot: dict[str, float] = {}
        #: operator -> when its rise was told (rl's ``shift_reads_busy_after_s``)
        self.shift_told_t: dict[str, float] = {}
        #: operator -> (its slots, until when) when another operator's cost rise was told: what a move on the
        #: credit takes from it below those, a move may give back on the credit's bar (rl's ``donor_repair_s``)
        self.donor_told_slots: dict[str, tuple[int, float]] = {}
        #: operator -> steps since a move last grew it (rl's ``grown_keeps_steps``)
        self.steps_since_grown: dict[str, int] = {}
        #: operator -> its capacity per slot (samples/s) as read while its slots were busy at a count held a
        #: few steps: the median of its last readings (``note_busy_capacity``; rl's ``idle_reads_busy_capacity``)
        self.busy_capacity_per_slot: dict[str, float] = {}
        self.busy_readings: dict[str, list[tuple[float, float]]] = {}  # operator -> [(t, capacity per slot)]
        #: operator -> ticks in a row its slots read less busy than rl's ``idle_reads_busy_capacity``
        #: (``note_idle``; rl's ``rise_read_until_idle_steps``)
        self.idle_steps: dict[str, int] = {}
        #: the last move the policy made: (when, {operator: slots it changed by}) (``note_move``)
        self.last_move: tuple[float, dict[str, int]] | None = None
        #: operator -> (slots, until when): a move that grew it past those slots was taken back by the next
        #: move, and it is not grown past them again until then (``note_move``; rl's ``taken_back_s``)
        self.taken_back: dict[str, tuple[int, float]] = {}
        #: operator -> ticks in a row it bound the pipeline while so held (``note_held_binding``)
        self.held_binding_ticks: dict[str, int] = {}
        #: (tick, samples/s delivered over its window, the window's seconds), the last ``DELIVERED_TICKS``
        #: (``note_delivered``; rl's ``rise_floor_delivered_s`` and ``busy_floor_delivered_s``)
        self.delivered: deque[tuple[float, float, float]] = deque(maxlen=DELIVERED_TICKS)
        #: operator -> (its slots, the first tick it was seen at them) (``note_delivered``)
        self.slots_since: dict[str, tuple[int, float]] = {}
        #: when a cost shift was last told: what was delivered before it floors no busy reading after
        #: (``note_busy_capacity``'s ``floor_min_span_s``)
        self.cost_shift_t: float = -math.inf
        #: the latest holds, each (tick, the allocation, what the hold read) (``note_held_gain``; rl's
        #: ``held_mean_ticks``)
        self.held_gains: deque[tuple[float, tuple[tuple[str, int], ...], Hold]] = deque(maxlen=HELD_GAIN_TICKS)

    def note_move(self, t: float, before: Mapping[str, int], after: Mapping[str, int], hold_s: float | None,
                  within_s: float) -> None:
        """A move from ``before`` to ``after`` at ``t``. Where it undoes exactly the last move, made at most
        ``within_s`` before, each operator the last move grew is held at its slots now for ``hold_s``
        seconds (None: not held)."""
        change = {n: after.get(n, 0) - before.get(n, 0) for n in after.keys() | before.keys()}
        change = {n: d for n, d in change.items() if d}
        if not change:
            return
        last = self.last_move
        if (hold_s is not None and last is not None and t - last[0] <= within_s
                and change == {n: -d for n, d in last[1].items()}):
            for name, d in last[1].items():
                if d > 0:
                    self.taken_back[name] = (after[name], t + hold_s)
        self.last_move = (t, change)

    def note_held_binding(self, t: float, bottleneck: str | None, lift_after: int | None) -> None:
        """Count the ticks in a row each operator held by ``taken_back`` was the ``bottleneck``; from
        ``lift_after`` in a row its hold lifts (None: never). The hold is for two operators taking turns to
        bind, each move trading a slot between them; the held one binding alone, tick after tick, says the
        take-back was wrong (live, storage_saturated's hash held at 4 slots, the bottleneck in every tick for
        27 s at 0.75-0.85 of the level after its shift: tuner/README.md, run 68)."""
        held = self.taken_back_limits(t)
        self.held_binding_ticks = {n: self.held_binding_ticks.get(n, 0) + 1 for n in held if n == bottleneck}
        if lift_after is None:
            return
        for name in [n for n, k in self.held_binding_ticks.items() if k >= lift_after]:
            self.taken_back.pop(name, None)
            self.held_binding_ticks.pop(name)

    def taken_back_limits(self, t: float) -> dict[str, int]:
        """The slots each operator whose growth was taken back (``note_move``) is held at until its time is up."""
        return {n: k for n, (k, until) in self.taken_back.items() if t <= until}

    def note_util(self, obs: Observation, alpha: float) -> None:
        """Smooth each operator's busy share of its slots by ``alpha`` per tick (rl's ``waited_on_alpha``)."""
        for o in obs.ops:
            old = self.util.get(o.name)
            self.util[o.name] = o.util if old is None else (1.0 - alpha) * old + alpha * o.util

    def note_busy_capacity(self, obs: Observation, min_util: float, min_steps: int, readings: int = 5,
                           max_age_s: float | None = None, floor_min_span_s: float | None = None) -> int:
        """Each operator's capacity per slot as the median of its last ``readings`` readings taken with its
        slots at least ``min_util`` busy and unchanged for ``min_steps`` steps (rl's ``idle_reads_busy_capacity``):
        a busy window reads high now and then too (live, per_task_overhead's parse 56,379 samples/s at 6
        slots, 100% busy, between readings of 16,000), and a mean would carry it for ticks. A reading counts
        ``max_age_s`` seconds (None: until five newer ones replace it); an operator with none left has no figure.
        With ``floor_min_span_s``, a reading is at no less than what the pipeline delivered a slot over the
        windows since the later of the operator's last change of slots and the last cost shift told, where they
        span that many seconds (``delivered_since``): every row delivered went through it. Returns how many
        readings that floor raised."""
        floored = 0
        for o in obs.ops:
            if (o.completed or not o.measured or o.capacity is None or o.slots <= 0 or o.util < min_util
                    or self.steps_since_change.get(o.name, 0) < min_steps):
                continue
            per_slot = o.capacity / o.slots
            if floor_min_span_s is not None:
                delivered = self.delivered_at_slots(o.name, self.cost_shift_t, floor_min_span_s)
                if delivered is not None and delivered / o.slots > per_slot:
                    per_slot = delivered / o.slots
                    floored += 1
            last = self.busy_readings.setdefault(o.name, [])
            last.append((obs.t, per_slot))
            del last[:-readings]
        for name, last in self.busy_readings.items():
            if max_age_s is not None:
                last[:] = [(t, v) for t, v in last if obs.t - t <= max_age_s]
            if last:
                self.busy_capacity_per_slot[name] = float(np.median([v for _, v in last]))
            else:
                self.busy_capacity_per_slot.pop(name, None)
        return floored

    def busy_capacity_per_slot_since(self, name: str, since: float, readings: int,
                                     spread: float) -> float | None:
        """``name``'s capacity per slot as the median of its busy readings (``note_busy_capacity``) taken from
        ``since`` on, where there are ``readings`` of them and the highest is at most ``spread`` times the
        lowest (None: fewer, or they disagree)."""
        recent = [v for t, v in self.busy_readings.get(name, []) if t >= since][-readings:]
        if len(recent) < readings or max(recent) > spread * min(recent):
            return None
        return float(np.median(recent))

    def note_delivered(self, obs: Observation, alloc: Mapping[str, int]) -> None:
        """What the pipeline delivered over this tick's window, and since when each operator has its slots."""
        self.delivered.append((obs.t, max(float(obs.throughput), 0.0), max(float(obs.window_s), 0.0)))
        for name, k in alloc.items():
            if self.slots_since.get(name, (None, 0.0))[0] != k:
                self.slots_since[name] = (k, obs.t)

    def delivered_since(self, since: float, min_span_s: float) -> float | None:
        """The samples/s the pipeline delivered over the windows of the ticks that began at ``since`` or
        later, each weighted by its length (None: together they span less than ``min_span_s`` seconds)."""
        windows = [(t, thr, w) for t, thr, w in self.delivered if w > 0.0 and t - w >= since - 1e-9]
        if not windows or windows[-1][0] - min(t - w for t, _, w in windows) < min_span_s:
            return None
        return sum(thr * w for _, thr, w in windows) / sum(w for _, _, w in windows)

    def delivered_at_slots(self, name: str, after: float, min_span_s: float) -> float | None:
        """``delivered_since`` the later of ``after`` and ``name``'s last change of slots (None: its slots were
        never noted, or the windows since span less than ``min_span_s``)."""
        noted = self.slots_since.get(name)
        return None if noted is None else self.delivered_since(max(noted[1], after), min_span_s)

    def note_idle(self, obs: Observation, max_util: float) -> None:
        """Count, per operator, the ticks in a row its slots read less than ``max_util`` busy."""
        for o in obs.ops:
            idle = not o.completed and o.slots > 0 and o.util < max_util
            self.idle_steps[o.name] = self.idle_steps.get(o.name, 0) + 1 if idle else 0

    def drop_credit(self, name: str) -> None:
        """Forget ``name``'s shift credit and what was noted with it."""
        for noted in (self.shift_credit, self.shift_told_slots, self.shift_told_capacity,
                      self.shift_capacity_per_slot, self.shift_told_t):
            noted.pop(name, None)

    def forget_busy_capacity(self, name: str) -> None:
        """Drop ``name``'s busy readings (its cost per row changed: they describe it before)."""
        self.busy_capacity_per_slot.pop(name, None)
        self.busy_readings.pop(name, None)

    def note_action(self, before: Mapping[str, int], after: Mapping[str, int]) -> None:
        changed = False
        for n in self.steps_since_change:
            if before.get(n) != after.get(n):
                self.steps_since_change[n] = 0
                changed = True
                if after.get(n, 0) > before.get(n, 0):
                    self.scaling.released.discard(n)  # grown: its next limit is measured afresh
                    if after[n] > self.scaling.aged_out.get(n, after[n]):
                        self.scaling.aged_out.pop(n)  # past it: the step is being measured again
                    self.steps_since_grown[n] = 0
        if changed:
            self.steps_since_action = 0

    def note_held_gain(self, t: float, alloc: Mapping[str, int], bottleneck: str, gain: float,
                       caps: Mapping[str, float | None], ops: Sequence[OpObs] = ()) -> None:
        """A hold at ``alloc`` with ``bottleneck`` binding, its "+1" predicted to gain ``gain``, the operators
        read at ``caps``, and how busy the slots of ``ops`` (those not finished) were."""
        live = [o for o in ops if not o.completed]
        self.held_gains.append((t, AllocationThroughput.key(alloc), Hold(
            bottleneck, gain, dict(caps), {o.name: o.util for o in live},
            {o.name: o.util + o.throttled / max(o.slots, 1) for o in live})))

    def held_at(self, alloc: Mapping[str, int], since: float) -> list[Hold]:
        """The latest holds in a row at ``alloc``, each after ``since``, the latest last."""
        key = AllocationThroughput.key(alloc)
        out: list[Hold] = []
        for t, at, hold in reversed(self.held_gains):
            if at != key or t <= since:
                break
            out.append(hold)
        return out[::-1]

    def tick(self) -> None:
        for n in self.steps_since_change:
            self.steps_since_change[n] += 1
        for n in self.steps_since_grown:
            self.steps_since_grown[n] += 1
        self.steps_since_action += 1

    def reset_best(self) -> None:
        self.best = 0.0


def featurize(
    obs: Observation,
    alloc: Mapping[str, int],
    specs: Sequence[OpSpec],
    budget: float,
    fs: FeatureState,
) -> tuple[np.ndarray, np.ndarray]:
    """(flat observation vector incl. mask, bool mask). Updates the throughput memory in ``fs``."""
    # the steadier of the two throughput measurements (the short one restarts at every change)
    thr = max(float(obs.extra.get("throughput_long", obs.throughput)), 0.0)
    if obs.since_change_s >= 3.0:
        thr = max(obs.throughput, 0.0)
    # Smooth the best-seen with a slow decay so that a cost shift (new lower optimum)
    # does not leave the agent chasing an unreachable past throughput forever.
    fs.best = max(thr, fs.best * 0.995)
    d_log = 0.0 if fs.prev is None or fs.prev <= 0 or thr <= 0 else math.log(thr / fs.prev)
    fs.prev = thr

    caps = {o.name: o.capacity for o in obs.ops}
    completed = {o.name: o.completed for o in obs.ops}
    mask = action_mask(alloc, specs, budget, mem_fraction=obs.mem_fraction, capacities=caps, completed=completed)

    per_op = np.zeros((K_MAX, F), dtype=np.float32)
    known = [o for o in obs.ops if o.capacity is not None]
    bottleneck = min(known, key=lambda o: o.capacity).name if known else None
    def lr(cap: float | None) -> float:
        if cap is None or thr <= 0:
            return 0.0
        return float(np.clip(math.log(max(cap, 1e-9) / thr), -1.0, 3.0)) / 3.0

    for k, (s, o) in enumerate(zip(specs[:K_MAX], obs.ops[:K_MAX])):
        n = alloc[s.name]
        ratio = lr(o.capacity)
        # what its capacity would be with one slot more / less (linear per-slot model)
        plus = lr(o.capacity * (n + 1) / n) if o.capacity is not None and n > 0 else 0.0
        minus = lr(o.capacity * (n - 1) / n) if o.capacity is not None and n > 1 else -1.0 / 3.0
        per_op[k] = (
            1.0,
            n * s.num_cpus / budget,
            float(np.clip(o.util, 0.0, 1.5)),
            ratio,
            1.0 if o.measured else 0.0,
            math.tanh(o.queue_blocks / (n + 1.0)),
            float(np.clip(o.backpressure, 0.0, 1.0)),
            1.0 if n <= s.min_slots else 0.0,
            math.exp(-fs.steps_since_change.get(s.name, 99) / 3.0),
            1.0 if s.name == bottleneck else 0.0,
            plus,
            minus,
        )
    glob = np.array(
        (
            max(free_cpus(alloc, specs, budget), 0.0) / budget,
            float(np.clip(obs.mem_fraction, 0.0, 2.0)) / 2.0,
            float(np.clip(math.log(thr / fs.best), -2.0, 0.0)) / 2.0 if thr > 0 and fs.best > 0 else -1.0,
            float(np.clip(d_log, -1.0, 1.0)),
            math.exp(-fs.steps_since_action / 3.0),
            len(specs) / K_MAX,
            1.0 if obs.data_wait is None else float(np.clip(obs.data_wait, 0.0, 1.0)),
        ),
        dtype=np.float32,
    )
    vec = np.concatenate([per_op.reshape(-1), glob, mask.astype(np.float32)])
    return vec, mask
