"""Cost shifts told from the workers' own clocks.

A policy that sees an operator's capacity only as rows per occupied slot-second cannot tell a cost
shift from noise quickly: blocks finish in lumps (a window sees 0-3 of them), a slot's occupied time
includes dispatch and the object store, and a window that straddles the shift reads half of each.
Live, per_task_overhead's sparse hash (8,000-row blocks) took 12-45 s to be seen slower after its
cost per row doubled, and figures from before the shift held it below its new optimum meanwhile
(tuner/README.md, runs 50-52).

Ray Data's workers time each block they produce (``block_generation_time``, the UDF's wall time).
Per row, that is the operator's cost itself: for an operator whose tasks do not wait on each other
it does not depend on how many slots it has, on the other operators, or on when its blocks finish.
:class:`CostShiftDetector` keeps each operator's typical cost per row at each slot count and how far
single readings stray from it, and calls a shift when ``confirm`` readings in a row stray the same way
by more than the tolerance and by more than ``noise_k`` times the operator's own spread (one reading,
where it strays ``at_once`` times that far). Costs are compared at the same slots only: where a table
is contended or a storage service's channels are full, the cost per row rises with the slots, and that
is the operator's scaling curve, not a shift. Several operators straying the same way in one reading
is the machine (a loaded CPU), not their costs, and is passed over."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlrm_platform.tuner.observe import RawSnapshot


@dataclass(frozen=True)
class CostShift:
    """``name``'s cost per row changed by ``ratio`` (new / old), first seen in the readings after ``since``
    (the snapshot time before the first reading that strayed)."""

    name: str
    ratio: float
    since: float


@dataclass
class _OpCost:
    log_cost: float | None = None   # smoothed log of seconds per row
    spread: float | None = None     # smoothed |log deviation| of one reading
    readings: int = 0
    strayed: list[tuple[float, float]] | None = None  # (log cost, snapshot time before it) of the readings in a row that strayed


class CostShiftDetector:
    """Per operator, worker-measured seconds per output row between consecutive snapshots (only where
    rows came out), and the shifts they show (:meth:`push`)."""

    def __init__(self, tolerance: float = 0.3, confirm: int = 2, noise_k: float = 3.0, alpha: float = 0.2,
                 min_readings: int = 5, at_once: float = 2.0, machine_wide: int = 2,
                 count_tolerance: float = 0.1, quiet_s: float = 5.0):
        #: a reading strays where its cost per row is more than this share above or below the typical one
        self.tolerance = tolerance
        #: readings in a row that must stray the same way (and agree within the tolerance) for a shift
        self.confirm = confirm
        #: ... and by more than this many times the operator's spread
        self.noise_k = noise_k
        self.alpha = alpha
        #: readings an operator needs before its spread is known and it is judged
        self.min_readings = min_readings
        #: one reading that strays this many times the bar is a shift at once: live, a policy moved
        #: slots on the smeared figures in the second it waited for the next reading (tuner/README.md, run 53)
        self.at_once = at_once
        #: this many operators straying the same way in one reading is the machine: no reading counts
        self.machine_wide = machine_wide
        #: an operator whose typical costs at two slot counts differ by more than this share is never called
        #: shifted (``_note_counts``); within it, it is ``flat``
        self.count_tolerance = count_tolerance
        self.count_dependent: set[str] = set()
        #: operators measured at two slot counts or more at one cost per row: the only ones called shifted.
        #: Before that, a cost that moves at fixed slots may be a contended operator's in-flight calls
        #: following its upstream: live, the lookup at 8 slots read 1.7x and 2.7x its cost as parse was
        #: grown, each read as a shift, and the credit grew it to 16 (tuner/README.md, run 53)
        self.flat: set[str] = set()
        #: (operator, its slots; None where not given) -> its typical cost there
        self.ops: dict[tuple[str, int | None], _OpCost] = {}
        self._prev: RawSnapshot | None = None
        self._slots: dict[str, int | None] = {}
        #: operator -> until when its readings are passed over (after its slots or its block size changed,
        #: blocks begun before still finish, at the old figure)
        self._quiet_until: dict[str, float] = {}
        self.quiet_s = quiet_s
        self.shifts: list[CostShift] = []

    def reset(self, names: list[str] | None = None) -> None:
        """Forget the typical costs (of ``names``; None: all): what a row costs changed on purpose
        (a new block size puts a different share of per-task cost on each row)."""
        for key in [k for k in self.ops if names is None or k[0] in names]:
            del self.ops[key]
        for name in (set(self._slots) if names is None else set(names)):
            # costs measured across the change (blocks of both sizes in flight) can make a flat operator look
            # count-dependent: what it is is measured again
            self.count_dependent.discard(name)
            self.flat.discard(name)
            if self._prev is not None:
                self._quiet_until[name] = self._prev.t + self.quiet_s

    def restart(self) -> None:
        """A new execution: its counters start from zero; the typical costs stand."""
        self._prev = None

    def push(self, snap: RawSnapshot, slots: Mapping[str, int] | None = None) -> list[CostShift]:
        """Read ``snap`` against the previous snapshot; returns the shifts called on it. ``slots``: each
        operator's slots over the interval; a cost is compared only with the cost at the same slots (where a
        table is contended or storage channels are full, the cost per row rises with the slots: that is the
        operator's scaling, not a shift; the simulated contended lookup lost its peak to such "shifts")."""
        prev, self._prev = self._prev, snap
        for name in snap.ops:
            k = slots.get(name) if slots is not None else None
            if name in self._slots and self._slots[name] != k:
                # blocks finishing for a while yet ran partly at the old count (live, a sparse hash's blocks
                # take 3-6 s)
                self._quiet_until[name] = snap.t + self.quiet_s
            self._slots[name] = k
        if prev is None:
            return []
        readings: dict[tuple[str, int | None], float] = {}
        for name, b in snap.ops.items():
            a = prev.ops.get(name)
            if a is None or a.busy_seconds is None or b.busy_seconds is None:
                continue
            d_rows, d_busy = b.rows_out - a.rows_out, b.busy_seconds - a.busy_seconds
            if d_rows <= 0 or d_busy <= 0:
                continue  # no block finished in between: nothing read
            if snap.t <= self._quiet_until.get(name, -math.inf):
                continue
            readings[(name, self._slots.get(name))] = math.log(d_busy / d_rows)
        strayed = [math.copysign(1.0, d) for key, x in readings.items() if (d := self._strays(key, x))]
        if max(strayed.count(1.0), strayed.count(-1.0)) >= self.machine_wide:
            # several operators slower (or faster) at once is the machine, not their costs: live, a CPU
            # hiccup read every operator of contended_lookup 1.2-1.9x its cost for one second
            return []
        found = [shift for key, x in readings.items() if (shift := self._read(key, x, prev.t)) is not None
                 and self.is_flat(shift.name)]
        self.shifts.extend(found)
        return found

    def is_flat(self, name: str) -> bool:
        """``name``'s cost per row does not move with its slots: measured so at two counts, or its slots
        not given (the caller compares costs at any slots alike)."""
        return name in self.flat or (name in self._slots and self._slots[name] is None)

    def _note_counts(self, name: str) -> None:
        """Mark ``name`` count-dependent once its typical costs at two slot counts differ by more than
        ``count_tolerance``: its tasks wait on each other (a contended table, full storage channels), so
        its cost at a count moves with how many of them are in flight, which upstream decides, too. Live,
        such readings at a count it came back to read as a shift, and the credit that followed grew the
        contended lookup to 16 slots, far past its peak at 6 (tuner/README.md, run 53)."""
        costs = [op.log_cost for (n, _), op in self.ops.items()
                 if n == name and op.log_cost is not None and op.readings >= self.min_readings]
        if len(costs) < 2:
            return
        # judged again at every reading: a count's first readings (workers still warming, blocks of two sizes
        # in flight) can set it apart for a while
        if max(costs) - min(costs) > math.log1p(self.count_tolerance):
            self.count_dependent.add(name)
            self.flat.discard(name)
        else:
            self.flat.add(name)
            self.count_dependent.discard(name)

    def _bar(self, op: _OpCost) -> float | None:
        """How far (log) a reading of ``op`` must stray to count (None: not judged yet)."""
        if op.log_cost is None or op.readings < self.min_readings or op.spread is None:
            return None
        return max(math.log1p(self.tolerance), self.noise_k * op.spread)

    def _strays(self, key: tuple[str, int | None], x: float) -> float:
        """The reading's log deviation where it strays past its bar, else 0."""
        op = self.ops.get(key)
        bar = None if op is None else self._bar(op)
        return 0.0 if bar is None or abs(x - op.log_cost) <= bar else x - op.log_cost

    def _read(self, key: tuple[str, int | None], x: float, before: float) -> CostShift | None:
        op = self.ops.setdefault(key, _OpCost())
        if op.log_cost is None:
            op.log_cost, op.readings = x, 1
            return None
        dev = x - op.log_cost
        bar = self._bar(op)
        if bar is not None:
            if abs(dev) > bar:
                run = op.strayed or []
                if run and (dev > 0) != (run[-1][0] > op.log_cost):
                    run = []  # strayed the other way: a new run
                if run and abs(x - run[-1][0]) > math.log1p(self.tolerance):
                    run = []  # not the same new level
                run.append((x, before))
                op.strayed = run
                if len(run) < self.confirm and abs(dev) <= self.at_once * bar:
                    return None
                new = sum(v for v, _ in run) / len(run)
                shift = CostShift(key[0], math.exp(new - op.log_cost), run[0][1])
                # the new level is the typical cost now; the spread measured before stands; what it cost at
                # other slots describes it before the shift
                op.log_cost, op.strayed = new, None
                for other in [k for k in self.ops if k[0] == key[0] and k != key]:
                    del self.ops[other]
                return shift
        op.strayed = None
        op.spread = abs(dev) if op.spread is None else (1 - self.alpha) * op.spread + self.alpha * abs(dev)
        op.log_cost += self.alpha * dev
        op.readings += 1
        if op.readings >= self.min_readings:
            self._note_counts(key[0])
        return None

    def cost_per_row(self, name: str, slots: int | None = None) -> float | None:
        """The typical worker-measured seconds per output row of ``name`` at ``slots`` (None: not read yet)."""
        op = self.ops.get((name, slots))
        return None if op is None or op.log_cost is None else math.exp(op.log_cost)
