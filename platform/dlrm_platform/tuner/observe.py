"""Observations: what the tuner sees about once per second.

The live hooks (``ray_hooks``) and the simulator (``simulator``) both produce
:class:`RawSnapshot` objects (cumulative counters plus instantaneous gauges);
:func:`observe` turns two of them into an :class:`Observation` with rates over
the window between them. Everything downstream (policies, features, reward)
sees only ``Observation``, so the same code runs live and in simulation.

Units: operator rates are in the operator's own output rows; ``capacity`` and
``throughput`` are in *samples* delivered to the trainers, i.e. sink rows times
the samples each sink row carries (``samples_per_sink_row``: 1 for row
pipelines, ``batch_size`` when the last operator packs rows into training batches).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlrm_platform.tuner.cost_shift import CostShift, CostShiftDetector


@dataclass
class RawOp:
    """Counters of one operator at one instant. Cumulative fields only grow."""

    rows_in: float = 0.0          # cumulative input rows of finished tasks
    rows_out_done: float | None = None  # cumulative output rows of finished tasks (None: = rows_out)
    rows_out: float = 0.0         # cumulative rows produced by its tasks
    slot_seconds: float = 0.0     # cumulative integral of tasks running (occupied slot-seconds)
    throttled_seconds: float = 0.0  # cumulative slot-seconds held under output backpressure (not in slot_seconds)
    busy_seconds: float | None = None  # cumulative time tasks spent producing outputs (worker-measured)
    bp_seconds: float = 0.0       # cumulative task-submission backpressure time
    spilled_bytes: float = 0.0    # cumulative bytes spilled
    running: float = 0.0          # tasks running now
    queue_blocks: float = 0.0     # input queue length now
    queue_bytes: float = 0.0      # input queue bytes now
    pool_util: float | None = None  # actor-pool utilisation, None for task pools
    pool_size: int | None = None  # actors alive + pending, None for task pools
    completed: bool = False


@dataclass
class RawSnapshot:
    t: float
    ops: dict[str, RawOp]
    sink_rows: float              # cumulative rows delivered to the consumer(s)
    sink_blocks: float | None = None  # cumulative blocks (bundles) delivered, where counted (live)
    mem_used: float = 0.0         # object-store bytes used by the pipeline now
    mem_limit: float = float("inf")  # bytes the tuner may let the pipeline use
    data_wait: float | None = None   # trainers' data-wait fraction, when reported


@dataclass
class OpObs:
    name: str
    slots: int
    cpus_per_slot: float
    out_rate: float               # own output rows/s over the window
    rate_per_slot: float | None   # own output rows per busy slot-second (None: not measured)
    element_ratio: float          # rows out per row in (cumulative)
    running: float                # mean tasks running over the window
    util: float                   # running / slots
    backpressure: float           # fraction of the window under submission backpressure
    queue_blocks: float
    queue_bytes: float
    pool_util: float | None = None
    completed: bool = False
    capacity: float | None = None  # samples/s this op could sustain at `slots` (filled by observe)
    pool_size: int | None = None   # actors alive + pending (actor pools)
    measured: bool = False         # rate_per_slot measured in this window (else remembered)
    tasks_now: float = 0.0         # tasks running at the end of the window
    throttled: float = 0.0         # mean slots held by tasks whose outputs were not read (output backpressure)


@dataclass
class Observation:
    t: float
    window_s: float
    ops: list[OpObs]
    throughput: float             # samples/s delivered over the window
    mem_used: float
    mem_limit: float
    spill_rate: float             # bytes/s spilled over the window
    budget: float
    data_wait: float | None = None
    since_change_s: float = 0.0   # seconds since the allocation last changed
    warming_up: bool = False      # rates are no measurements yet (``WindowedObserver.warmup_s``)
    extra: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.ops]

    def op(self, name: str) -> OpObs:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def mem_fraction(self) -> float:
        if not math.isfinite(self.mem_limit) or self.mem_limit <= 0:
            return 0.0
        return self.mem_used / self.mem_limit

    @property
    def at_memory_limit(self) -> bool:
        """Object-store use at its limit: no "+1" may take a free CPU (``actions.action_mask``)."""
        return self.mem_fraction >= 1.0

    @property
    def used_cpus(self) -> float:
        return sum(o.slots * o.cpus_per_slot for o in self.ops)

    def bottleneck(self) -> str | None:
        known = [o for o in self.ops if o.capacity is not None and not o.completed]
        if not known:
            return None
        return min(known, key=lambda o: o.capacity).name


def sink_factors(ratios: list[float], samples_per_sink_row: float) -> list[float]:
    """Samples delivered per output row of each operator: the product of the
    element ratios of the operators after it, times samples per sink row."""
    out = [0.0] * len(ratios)
    acc = samples_per_sink_row
    for i in range(len(ratios) - 1, -1, -1):
        out[i] = acc
        acc *= ratios[i]
    return out




def rate_per_slot(a: RawOp, b: RawOp, min_slot_seconds: float = 0.1) -> float | None:
    """An operator's output rows per occupied slot-second between its counters ``a`` and ``b``
    (None: too little slot time or no output to tell).

    A slot is held for the whole task - scheduling, argument fetch, the UDF, storing the
    output - so capacity per slot is measured against occupied slot time. The workers'
    own UDF time (busy_seconds) misses that per-task overhead; ``WindowedObserver._rate_by_cost``
    puts it back as the share of occupied time the workers spent in the UDF."""
    d_out = max(b.rows_out - a.rows_out, 0.0)
    d_slot = max(b.slot_seconds - a.slot_seconds, 0.0)
    d_busy = d_slot if d_slot > 0 else (
        max(b.busy_seconds - a.busy_seconds, 0.0)
        if a.busy_seconds is not None and b.busy_seconds is not None else 0.0)
    return d_out / d_busy if d_busy >= min_slot_seconds and d_out > 0 else None


def observe(
    prev: RawSnapshot,
    cur: RawSnapshot,
    alloc: dict[str, int],
    cpus: dict[str, float],
    budget: float,
    *,
    since_change_s: float = 0.0,
    min_slot_seconds: float = 0.1,
    samples_per_sink_row: float = 1.0,
) -> Observation:
    """Rates over the window ``prev -> cur`` for the operators in ``alloc`` (pipeline order)."""
    dt = max(cur.t - prev.t, 1e-6)
    names = list(alloc)
    ops: list[OpObs] = []
    for name in names:
        a = prev.ops.get(name, RawOp())
        b = cur.ops.get(name, RawOp())
        d_out = max(b.rows_out - a.rows_out, 0.0)
        running = max(b.slot_seconds - a.slot_seconds, 0.0) / dt
        done = b.rows_out_done if b.rows_out_done is not None else b.rows_out
        ratio = done / b.rows_in if b.rows_in > 0 and done > 0 else 1.0
        ops.append(
            OpObs(
                name=name,
                slots=int(alloc[name]),
                cpus_per_slot=float(cpus[name]),
                out_rate=d_out / dt,
                rate_per_slot=rate_per_slot(a, b, min_slot_seconds),
                element_ratio=ratio,
                running=running,
                util=running / max(alloc[name], 1),
                backpressure=min(max((b.bp_seconds - a.bp_seconds) / dt, 0.0), 1.0),
                queue_blocks=b.queue_blocks,
                queue_bytes=b.queue_bytes,
                pool_util=b.pool_util,
                completed=b.completed,
                pool_size=b.pool_size,
                tasks_now=b.running,
                throttled=max(b.throttled_seconds - a.throttled_seconds, 0.0) / dt,
            )
        )
    spr = samples_per_sink_row
    factors = sink_factors([o.element_ratio for o in ops], spr)
    for o, f in zip(ops, factors):
        if o.rate_per_slot is not None:
            o.measured = True
            o.capacity = o.slots * o.rate_per_slot * f
    spilled = sum(max(cur.ops.get(n, RawOp()).spilled_bytes - prev.ops.get(n, RawOp()).spilled_bytes, 0.0)
                  for n in names)
    return Observation(
        t=cur.t,
        window_s=dt,
        ops=ops,
        throughput=max(cur.sink_rows - prev.sink_rows, 0.0) / dt * spr,
        mem_used=cur.mem_used,
        mem_limit=cur.mem_limit,
        spill_rate=spilled / dt,
        budget=budget,
        data_wait=cur.data_wait,
        since_change_s=since_change_s,
        extra={"samples_per_sink_row": spr, "sink_factors": factors,
               "sink_rows_per_block": _rows_per_block(prev, cur)},
    )


def _rows_per_block(prev: RawSnapshot, cur: RawSnapshot) -> float | None:
    """Rows per block delivered to the consumer over the window (None: not counted, or none delivered)."""
    if prev.sink_blocks is None or cur.sink_blocks is None or cur.sink_blocks - prev.sink_blocks < 1:
        return None
    return (cur.sink_rows - prev.sink_rows) / (cur.sink_blocks - prev.sink_blocks)


def with_capacities(obs: Observation, rates: dict[str, float]) -> Observation:
    """A copy of ``obs`` whose per-slot rates (and capacities) come from ``rates``."""
    ops = [replace(o) for o in obs.ops]
    factors = obs.extra.get("sink_factors") or [1.0] * len(ops)
    for o, f in zip(ops, factors):
        if o.name in rates:
            o.rate_per_slot = rates[o.name]
            o.capacity = o.slots * rates[o.name] * f
    return replace(obs, ops=ops)


class OccupiedSlotRates:
    """Each operator's output per second of a slot *occupied* by one of its tasks, accumulated
    over observations: its real per-slot speed with per-task overheads (dispatch, the object
    store, I/O round trips) included, which worker-measured busy time leaves out."""

    def __init__(self) -> None:
        self._out: dict[str, float] = {}
        self._running: dict[str, float] = {}

    def add(self, name: str, out_rate: float, running: float) -> None:
        self._out[name] = self._out.get(name, 0.0) + out_rate
        self._running[name] = self._running.get(name, 0.0) + running

    def rates(self) -> dict[str, float]:
        return {n: self._out[n] / r for n, r in self._running.items() if r > 0}


class WindowedObserver:
    """Keeps recent snapshots and measures over a sliding window that never
    reaches back past the last allocation change (plus a settle time), so a
    measurement describes the allocation in force. Used live and in simulation."""

    def __init__(self, window_s: float = 3.0, settle_s: float = 1.0, keep_s: float = 30.0,
                 long_window_s: float = 5.0, op_window_s: float = 6.0, warmup_s: float = 0.0,
                 cost_shifts: CostShiftDetector | None = None, share_window_s: float | None = None):
        self.window_s = window_s
        #: seconds after the sink's first output before an operator's rate counts as measured (0: from it)
        self.warmup_s = warmup_s
        self.long_window_s = long_window_s
        #: an operator's rate per slot is measured over up to this long at its current slots
        self.op_window_s = op_window_s
        self.op_change_t: dict[str, float] = {}
        self._all_changed_t: float | None = None  # the last change given without names
        self.rates: dict[str, float] = {}
        self.settle_s = settle_s
        self.keep_s = keep_s
        self.snaps: list[RawSnapshot] = []
        self.last_change_t: float | None = None
        #: when the sink first delivered in this execution: no rate before it is a measurement
        self.delivered_t: float | None = None
        #: tells cost shifts from the workers' time per row (None: off); a shift it calls rescales the
        #: operator's remembered rate and starts its window afresh, and the next observation carries it
        #: in ``extra["cost_shifts"]`` (operator -> new / old cost per row) for the policies' memories
        self.cost_shifts = cost_shifts
        #: an operator's rate per slot is its rows per second of worker time over ``op_window_s`` times its
        #: worker time's share of its occupied slot time over up to this long (``_rate_by_cost``; None: rows
        #: per occupied slot-second over ``op_window_s``)
        self.share_window_s = share_window_s
        #: operator -> its workers' time's share of its occupied slot time, as last measured
        self.busy_shares: dict[str, float] = {}
        self._new_shifts: dict[str, float] = {}

    def push(self, snap: RawSnapshot, slots: Mapping[str, int] | None = None) -> None:
        """Keep ``snap``; ``slots``: each operator's slots over the interval it ends (the cost-shift
        detector compares costs at the same slots)."""
        if self.delivered_t is None and snap.sink_rows > 0:
            self.delivered_t = snap.t
        self.snaps.append(snap)
        if self.cost_shifts is not None:
            start = self.measured_from()
            if start is None or snap.t < start:
                self.cost_shifts.restart()  # warm-up readings (workers still starting) are no costs
                self.cost_shifts.push(snap, slots)
            else:
                for shift in self.cost_shifts.push(snap, slots):
                    self._apply_shift(shift)
        cutoff = snap.t - self.keep_s
        while len(self.snaps) > 2 and self.snaps[0].t < cutoff:
            self.snaps.pop(0)

    def _apply_shift(self, shift: CostShift) -> None:
        """``shift.name`` costs ``shift.ratio`` times what it did per row: its rate per slot is that much
        lower, and a window reaching back past ``shift.since`` would average the two costs."""
        if (old := self.rates.get(shift.name)) is not None:
            self.rates[shift.name] = old / shift.ratio
        self.op_change_t[shift.name] = max(self.op_change_t.get(shift.name, shift.since), shift.since)
        self._new_shifts[shift.name] = self._new_shifts.get(shift.name, 1.0) * shift.ratio

    def note_change(self, t: float, names: Sequence[str] | None = None) -> None:
        """The allocation changed at ``t``; ``names``: the operators whose slots changed (None: all,
        as after a new block size: every operator's cost per row changed on purpose)."""
        self.last_change_t = t
        if names is None:
            self._all_changed_t = t
            self.op_change_t.clear()
            if self.cost_shifts is not None:
                self.cost_shifts.reset()
        for n in names or ():
            self.op_change_t[n] = t

    def clear(self) -> None:
        """Forget the snapshots (a new execution restarts the counters); keep the learned rates."""
        self.snaps.clear()
        self.delivered_t = None
        if self.cost_shifts is not None:
            self.cost_shifts.restart()

    def measured_from(self) -> float | None:
        """When this execution's rates start to count: the sink's first output plus ``warmup_s``."""
        return None if self.delivered_t is None else self.delivered_t + self.warmup_s

    def since_change(self) -> float:
        if not self.snaps:
            return 0.0
        if self.last_change_t is None:
            return self.snaps[-1].t - self.snaps[0].t
        return self.snaps[-1].t - self.last_change_t

    def base(self, window_s: float | None = None) -> RawSnapshot | None:
        if len(self.snaps) < 2:
            return None
        cur = self.snaps[-1]
        start = cur.t - (window_s if window_s is not None else self.window_s)
        if self.last_change_t is not None:
            start = max(start, self.last_change_t + self.settle_s)
        cands = [s for s in self.snaps[:-1] if s.t >= start - 1e-9]
        # Always measure over at least one interval, even right after a change.
        return cands[0] if cands else self.snaps[-2]

    def _per_op_windows(self, obs: Observation, factors: list[float], min_slot_seconds: float = 0.1) -> None:
        """Each operator's rate per slot over the longest window at its current slots (up to
        ``op_window_s``): a task can outlast several intervals, so one interval sees 0-3 of a long-task
        operator's tasks finish and its rate swings 10x; a move of *other* operators does not make
        this one's rate per occupied slot stale."""
        cur = self.snaps[-1]
        for o, f in zip(obs.ops, factors):
            if o.completed:
                continue
            changed = self.op_change_t.get(o.name, self._all_changed_t)
            start = max(cur.t - self.op_window_s, self.measured_from())
            if changed is not None:
                start = max(start, changed + self.settle_s)
            first = next((sn for sn in self.snaps[:-1] if sn.t >= start - 1e-9), None)
            if first is not None and self.share_window_s is not None and self._flat_cost(o.name):
                # by the workers' time, even over a window shorter than the interval's (right after a
                # move or a cost shift): rows and their time arrive together, so no lump misleads it
                rate = self._rate_by_cost(o.name, first, changed, min_slot_seconds)
                if rate is not None:
                    o.rate_per_slot, o.capacity, o.measured = rate, o.slots * rate * f, True
                    continue
            if first is None or cur.t - first.t <= obs.window_s + 1e-9:
                continue  # no longer than the interval's own window
            a, b = first.ops.get(o.name), cur.ops.get(o.name)
            rate = rate_per_slot(a, b, min_slot_seconds) if a is not None and b is not None else None
            if rate is not None:
                o.rate_per_slot = rate
                o.capacity = o.slots * rate * f
                o.measured = True

    def _flat_cost(self, name: str) -> bool:
        """``name``'s cost per row was measured the same at two slot counts or more (``CostShiftDetector.flat``;
        no detector: taken as flat). Where it moves with the slots (a contended table), blocks that finish
        after a move ran at the concurrency before it, so rows per second of worker time read the new count
        at the old one's speed: live, the contended lookup grown 4 -> 8 read as paid on them, and rl grew it
        on to 16 slots where 5 deliver the most (tuner/README.md, run 53). Its rate stays rows per occupied
        slot-second, which counts the new slots at once."""
        return self.cost_shifts is None or self.cost_shifts.is_flat(name)

    def _rate_by_cost(self, name: str, first: RawSnapshot, changed: float | None,
                      min_slot_seconds: float) -> float | None:
        """``name``'s rows per occupied slot-second as its rows per second of its workers' own time over the
        window from ``first`` (exact: rows and their time arrive together, block by block) times the share of
        its occupied slot time its workers spent in it, over up to ``share_window_s`` at its slots (None:
        no longer window, or no worker time counted).

        Rows per occupied slot-second over one window swing with how many blocks happen to finish in it
        (live, 8,000-row blocks of 6.4 s: 6,600-16,600 samples/s at unchanged slots), and over a window of a
        second or two right after a move they read absurd figures (212,708 samples/s for 4 slots that deliver
        18,000 at most); the share of occupied time spent in the UDF (the rest: dispatch, fetching inputs,
        storing outputs) changes slowly. Where the UDF's own time varies with the slots (a contended table,
        storage channels: the wait is inside it), so does this rate."""
        cur = self.snaps[-1]
        a, b = first.ops.get(name), cur.ops.get(name)
        if a is None or b is None or a.busy_seconds is None or b.busy_seconds is None:
            return None
        d_rows, d_busy = b.rows_out - a.rows_out, b.busy_seconds - a.busy_seconds
        if d_rows <= 0 or d_busy <= 0:
            return None
        start = max(cur.t - self.share_window_s, self.measured_from() or -math.inf)
        if changed is not None:
            start = max(start, changed + self.settle_s)
        long = next((sn for sn in self.snaps[:-1] if sn.t >= start - 1e-9), None)
        lo = long.ops.get(name) if long is not None and long.t < first.t else None
        if lo is not None and lo.busy_seconds is not None:
            l_busy, l_slot = b.busy_seconds - lo.busy_seconds, b.slot_seconds - lo.slot_seconds
            if l_busy > 0 and l_slot >= min_slot_seconds:
                self.busy_shares[name] = min(l_busy / l_slot, 1.0)
        # no longer window at its slots yet: the share measured before (its tasks' overhead, which a move
        # or a cost shift changes little; none measured yet: not told)
        share = self.busy_shares.get(name)
        return None if share is None else d_rows / d_busy * share

    def observation(self, alloc: dict[str, int], cpus: dict[str, float], budget: float,
                    window_s: float | None = None, samples_per_sink_row: float = 1.0) -> Observation | None:
        prev = self.base(window_s)
        if prev is None:
            return None
        obs = observe(prev, self.snaps[-1], alloc, cpus, budget, since_change_s=self.since_change(),
                      samples_per_sink_row=samples_per_sink_row)
        # Rates per slot outlive a window: an operator whose tasks did not finish inside a
        # short window (block granularity) keeps its last measured rate, and its capacity
        # follows its current number of slots.
        factors = obs.extra["sink_factors"]
        start = self.measured_from()
        if start is None or prev.t < start:
            # Start-up: until the sink's first output, tasks run on workers that are still starting and
            # importing (live: 5-20x slower than later), and a policy that read those rates moved the
            # slots to whichever operator started slowest. Remembered rates (an earlier execution) stand.
            # Some workers still warm up after it (``warmup_s``): live, contended_lookup's lookup read
            # 2,046 samples/s at 4 slots 2 s after the first output (1.9 of them busy), 5,600 at 5 later.
            # A warm-up reading is remembered only for an operator with no rate yet: one never measured
            # later (a fast operator held back by its full output queue) still has one.
            after_first_output = self.delivered_t is not None and prev.t >= self.delivered_t
            for o in obs.ops:
                if after_first_output and o.rate_per_slot is not None and o.name not in self.rates:
                    self.rates[o.name] = o.rate_per_slot
                o.rate_per_slot, o.capacity, o.measured = None, None, False
        obs.warming_up = start is None or prev.t < start  # before the first output, or within ``warmup_s``
        if self.delivered_t is not None:
            self._per_op_windows(obs, factors)
        for o, f in zip(obs.ops, factors):
            if o.rate_per_slot is not None:
                old = self.rates.get(o.name)
                self.rates[o.name] = o.rate_per_slot if old is None else 0.5 * old + 0.5 * o.rate_per_slot
            elif o.name in self.rates and not o.completed:
                o.rate_per_slot = self.rates[o.name]
                o.capacity = o.slots * o.rate_per_slot * f
        # throughput over the full window, across changes: steadier than the post-change one
        first = next((sn for sn in self.snaps if sn.t >= self.snaps[-1].t - self.long_window_s), self.snaps[0])
        if first is not self.snaps[-1]:
            span = self.snaps[-1].t - first.t
            obs.extra["throughput_long"] = max(self.snaps[-1].sink_rows - first.sink_rows, 0.0) / span \
                * samples_per_sink_row
        else:
            obs.extra["throughput_long"] = obs.throughput
        obs.extra["cost_shifts"], self._new_shifts = self._new_shifts, {}
        return obs
