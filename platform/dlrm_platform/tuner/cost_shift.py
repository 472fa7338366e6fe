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
:class:`CostShiftDetector` keeps each operator's typical cost per row (the median of its latest readings)
and how far single readings stray from it, and calls a shift when ``confirm`` readings in a row stray the
same way by more than the tolerance and by more than ``noise_k`` times the operator's own spread (one
reading, where it strays ``at_once`` times that far). Where a table is contended or a storage service's
channels are full, the cost per row rises with the calls in flight, and that is the operator's scaling curve,
not a shift, so what is judged depends on what is known of the operator at its slots now:

* measured at one cost at two slot counts or more (flat), at a count with readings of its own: as above;
* flat, at a count not measured yet (flat where measured is no promise past it), or measured at one count
  only (there, or within ``near_slots`` of it), or read at one cost across counts between moves too frequent
  for any count to settle: a jump far enough to be a shift at once (once, or, where not measured flat, twice
  in a row);
* costs that differ between counts (count-dependent): never.

A run of readings begun at a count goes on at the count a move took the operator to before the run's next
reading, judged as it began; where no block finished in the interval after a move, the first reading since
(of blocks begun before the move) is judged at the count before, too; and the readings of the first seconds
after a new execution's warm-up (the pipeline still climbs) set no cost at a count.

Several operators straying the same way in one reading is the machine (a loaded CPU), not their costs, and
is passed over."""

from __future__ import annotations

import math
import statistics
from collections import deque
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


#: the mean absolute deviation of normal readings times this is their standard deviation (the mean, not the
#: median: a window where a contended operator happened to read one cost often has a median deviation near 0)
_MEAN_DEV_TO_SIGMA = 1.2533


class _Readings:
    """An operator's recent readings (log seconds per row) at one place: its typical cost is their median
    and its spread their mean deviation from it, so a few warm-up readings do not set the level
    (live, two warm-up readings at 559 and 468 us against a hash's 404 us, averaged in, set its 4-slot level
    13% high and marked it count-dependent: its doubled cost was never judged; tuner/README.md, run 54)."""

    def __init__(self, size: int, start: list[float] | None = None, held_spread: float | None = None,
                 start_counts: list[int | None] | None = None):
        self.recent: deque[float] = deque(start or [], maxlen=size)
        #: the slots each reading was taken at, where they are kept (an operator's level: readings at any slots)
        self.counts: deque[int | None] = deque(start_counts or [], maxlen=size)
        #: the spread measured before a shift, until the new level has readings enough of its own
        self.held_spread = held_spread

    def typical(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def spread(self, min_readings: int) -> float | None:
        if len(self.recent) < min_readings:
            return self.held_spread
        mid = statistics.median(self.recent)
        return _MEAN_DEV_TO_SIGMA * statistics.fmean(abs(x - mid) for x in self.recent)


class CostShiftDetector:
    """Per operator, worker-measured seconds per output row between consecutive snapshots (only where
    rows came out), and the shifts they show (:meth:`push`)."""

    def __init__(self, tolerance: float = 0.3, confirm: int = 2, noise_k: float = 3.0, window: int = 9,
                 min_readings: int = 5, at_once: float = 2.0, machine_wide: int = 2,
                 count_tolerance: float = 0.1, quiet_s: float = 5.0, climb_s: float = 8.0,
                 flat_spread: float = 0.01, near_slots: int = 2):
        #: a reading strays where its cost per row is more than this share above or below the typical one
        self.tolerance = tolerance
        #: readings in a row that must stray the same way (and agree within the tolerance) for a shift
        self.confirm = confirm
        #: ... and by more than this many times the operator's spread
        self.noise_k = noise_k
        #: the latest readings a typical cost is the median of
        self.window = window
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
        #: readings at two counts or more whose spread is at most this are of one cost (``_flat_across_moves``)
        self.flat_spread = flat_spread
        #: an operator known at one count only is judged at counts this many slots or fewer from it, too
        #: (``_near_known``)
        self.near_slots = near_slots
        self.count_dependent: set[str] = set()
        #: operators measured at two slot counts or more at one cost per row: judged at the tolerance. Before
        #: that, a cost that moves at fixed slots may be a contended operator's in-flight calls following its
        #: upstream: live, the lookup at 8 slots read 1.7x and 2.7x its cost as parse was grown, each read as
        #: a shift, and the credit grew it to 16 (tuner/README.md, run 53); only a jump far past its noise,
        #: read twice, counts then
        self.flat: set[str] = set()
        #: operator -> its recent readings at any slots: what a flat operator's readings are judged against
        #: (its cost is the same at every count, so a shift is told at a count it has just moved to, too)
        self.levels: dict[str, _Readings] = {}
        #: (operator, its slots; None where not given) -> its recent readings there, outside the quiet
        #: after a change: whether it is flat
        self.at_count: dict[tuple[str, int | None], _Readings] = {}
        #: operator -> (log cost, snapshot time before it) of its latest readings in a row that strayed
        self._strayed: dict[str, list[tuple[float, float]]] = {}
        self._prev: RawSnapshot | None = None
        self._slots: dict[str, int | None] = {}
        #: operator -> its slots before its latest move, until its first reading since: that reading's blocks
        #: were begun before the move, at that count (``_read``)
        self._moved_from: dict[str, int | None] = {}
        #: ... of those, the operators no block of which finished in the first interval after the move
        self._waited: set[str] = set()
        #: operator -> until when its readings are left out of its costs at a count (after its slots or its
        #: block size changed, blocks begun before still finish, at the old figure)
        self._quiet_until: dict[str, float] = {}
        self.quiet_s = quiet_s
        #: after a restart (the warm-up of a new execution), readings of this many seconds more are left out of
        #: the costs at a count: the pipeline still climbs and the workers share the CPUs with its start. Live,
        #: dlrm_preprocessing's truncate_history read 191-279 us per row at 4 slots on the climb and 166 us at 3
        #: after it: count-dependent, its doubled cost was never judged (tuner/README.md, run 58)
        self.climb_s = climb_s
        self._restarted = False

    def reset(self, names: list[str] | None = None) -> None:
        """Forget the typical costs (of ``names``; None: all): what a row costs changed on purpose
        (a new block size puts a different share of per-task cost on each row)."""
        for name in (set(self._slots) | set(self.levels) if names is None else set(names)):
            self.levels.pop(name, None)
            self._strayed.pop(name, None)
            self._moved_from.pop(name, None)
            self._waited.discard(name)
            for key in [k for k in self.at_count if k[0] == name]:
                del self.at_count[key]
            # costs measured across the change (blocks of both sizes in flight) can make a flat operator look
            # count-dependent: what it is is measured again
            self.count_dependent.discard(name)
            self.flat.discard(name)
            if self._prev is not None:
                self._quiet_until[name] = self._prev.t + self.quiet_s

    def restart(self) -> None:
        """A new execution: its counters start from zero; the typical costs stand (its first ``climb_s``
        seconds of readings count toward none at a count)."""
        self._prev = None
        self._restarted = True

    def push(self, snap: RawSnapshot, slots: Mapping[str, int] | None = None) -> list[CostShift]:
        """Read ``snap`` against the previous snapshot; returns the shifts called on it. ``slots``: each
        operator's slots over the interval; an operator whose costs at two counts differ is never judged (where
        a table is contended or storage channels are full, the cost per row rises with the slots: that is the
        operator's scaling, not a shift; the simulated contended lookup lost its peak to such "shifts"), and
        one not known flat at its slots now only on a jump far past its noise (module docstring)."""
        prev, self._prev = self._prev, snap
        for name in snap.ops:
            k = slots.get(name) if slots is not None else None
            if name in self._slots and self._slots[name] != k:
                # blocks finishing for a while yet ran partly at the old count (live, a sparse hash's blocks
                # take 3-6 s)
                self._quiet_until[name] = snap.t + self.quiet_s
                self._moved_from.setdefault(name, self._slots[name])
            self._slots[name] = k
        if prev is None:
            return []
        if self._restarted:  # the first reading since a restart: the climb starts
            self._restarted = False
            for name in snap.ops:
                self._quiet_until[name] = max(self._quiet_until.get(name, -math.inf), prev.t + self.climb_s)
        readings: dict[str, float] = {}
        for name, b in snap.ops.items():
            a = prev.ops.get(name)
            if a is None or a.busy_seconds is None or b.busy_seconds is None:
                continue
            d_rows, d_busy = b.rows_out - a.rows_out, b.busy_seconds - a.busy_seconds
            if d_rows > 0 and d_busy > 0:  # else no block finished in between: nothing read
                readings[name] = math.log(d_busy / d_rows)
        # no block finished in the interval since its move: the blocks that finish next were begun before it
        self._waited |= self._moved_from.keys() - readings.keys()
        # every operator with a level backs the machine up, flat or not yet known (live, a hiccup read
        # wide_skewed's read 2.4x, with four others 1.9-5x that were not yet known flat, as a shift; a
        # count-dependent one's wide spread sets its own bar high)
        judged = {name: x - level for name, x in readings.items() if (level := self._typical(name)) is not None}
        # several operators slower (or faster) at once is the machine, not their costs: live, a CPU hiccup
        # read every operator of contended_lookup 1.2-1.9x its cost for one second, wide_skewed's pack 2x as
        # its read and filter slowed 1.6-2x, and contended_lookup's pack 1.79x as its read slowed 1.22x:
        # each would have been a shift. Half the tolerance is enough to back another's stray up
        strayed = [math.copysign(1.0, d) for name, d in judged.items()
                   if abs(d) > (self._bar(name, self.tolerance / 2) or math.inf)]
        if max(strayed.count(1.0), strayed.count(-1.0)) >= self.machine_wide:
            return []
        found = []
        for name, x in readings.items():
            shift = self._read(name, x, prev.t, snap.t)
            if shift is not None:
                found.append(shift)
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
        costs = [r.typical() for (n, _), r in self.at_count.items()
                 if n == name and len(r.recent) >= self.min_readings]
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

    def _typical(self, name: str) -> float | None:
        level = self.levels.get(name)
        return None if level is None else level.typical()

    def _bar(self, name: str, tolerance: float | None = None) -> float | None:
        """How far (log) a reading of ``name`` must stray to count, past ``tolerance`` (None: the detector's)
        and its noise (None: not judged yet)."""
        level = self.levels.get(name)
        spread = None if level is None else level.spread(self.min_readings)
        least = math.log1p(self.tolerance if tolerance is None else tolerance)
        return None if spread is None else max(least, self.noise_k * spread)

    def _read(self, name: str, x: float, before: float, now: float) -> CostShift | None:
        level = self.levels.setdefault(name, _Readings(self.window))
        bar, typical = self._bar(name), level.typical()
        run = self._strayed.get(name, [])
        once = None if bar is None else self.at_once * bar
        # where no block finished in the interval after a move, the first reading since is of blocks begun
        # before it: where the count before is known, it is judged as read there, too. Live, per_task_overhead's
        # hash, known at 6 slots only, was grown to 8 as its cost doubled and before a block at the new cost had
        # finished (8,000 rows, 6 s a block): every 2x reading came at 8, a count not known yet, and the shift
        # was never told (runs 59c, 60c, 61b). A contended table's cost climbs over the readings after its move
        # (the lookup, 7 -> 11 slots: 1.07x, then 1.5x, 1.6x, 2.1x), not in the first
        known_here = self._known_here(name, self._slots.get(name))
        if name in self._moved_from:
            moved_from = self._moved_from.pop(name)
            waited = name in self._waited
            self._waited.discard(name)
            known_here = known_here or (waited and now <= self._quiet_until.get(name, -math.inf)
                                        and self._known_here(name, moved_from))
        flat = self.is_flat(name)
        known_here = known_here or (not flat and self._flat_across_moves(name))
        # a count within ``near_slots`` of one it is known at is judged as that one: a contended table's cost
        # per row climbs 1.3-1.5x a slot or two past a count it was read at, not 2x at once (over the recorded
        # live runs, such readings came to at most 1.58x). Live, wide_skewed's hash, known at 8 slots only,
        # was grown to 9 (61d) and to 10 (61a) as its cost doubled: every 2x reading came at a count not
        # known yet, and the shift was never told. Judged against its cost there: its level may hold readings
        # at counts farther off
        if not known_here and not flat and name not in self.count_dependent:
            near = self._near_known(name)
            if near is not None:
                known_here, typical = True, near
        # measured at its slots now but at one count only: whether its cost moves with its slots is not known,
        # so only a jump far past its noise, read twice, counts (live, wide_skewed's hash sat at 7 slots all
        # run and its doubled cost was never judged; cheap operators' 2-3 s CPU hiccups read 1.8-2.4x once)
        one_count = known_here and not flat and name not in self.count_dependent
        # a run begun at a count it was known at goes on where a move took it before the run's next reading,
        # judged as it began: live, dlrm_preprocessing's truncate_history read 1.92x its cost at 3 slots, the
        # policy grew it to 5 a second later (it had become the bottleneck), and the run was dropped there:
        # the shift was never told (tuner/README.md, run 58)
        # (its typical cost is still the one the run strays from: a reading that strays is no part of it)
        carried = bool(run) and not known_here and not flat and name not in self.count_dependent
        one_count = one_count or carried
        if bar is not None and ((not run and not known_here) or one_count):
            # flat where it was measured is no promise past it: a contended table's cost per row stays put
            # while its calls in flight do and climbs once they rise (live, the lookup read one cost at 4 and
            # 6 slots and 1.57x at 7, and the credit that followed grew it to 16; tuner/README.md, run 55).
            # At a count whose cost is not known yet, only a jump that is a shift at once counts
            bar = once
        stray = bar is not None and typical is not None and abs(x - typical) > bar
        if stray and run and ((x > typical) != (run[-1][0] > typical)
                              or abs(x - run[-1][0]) > math.log1p(self.tolerance)):
            run = []  # strayed the other way, or not to the same new level: a new run ...
            stray = not carried  # ... which does not begin at a count not known yet
        if (flat or one_count) and stray:
            run.append((x, before))
            self._strayed[name] = run
            if len(run) < self.confirm and (one_count or abs(x - typical) <= once):
                return None
            new = [v for v, _ in run]
            shift = CostShift(name, math.exp(sum(new) / len(new) - typical), run[0][1])
            # the new level is the typical cost now; the spread measured before stands until it has readings
            # of its own; what it cost at its slot counts describes it before the shift
            self.levels[name] = _Readings(self.window, new, level.spread(self.min_readings),
                                          [self._slots.get(name)] * len(new))
            for key in [k for k in self.at_count if k[0] == name]:
                del self.at_count[key]
            self.at_count[(name, self._slots.get(name))] = _Readings(self.window, new)
            del self._strayed[name]
            return shift
        self._strayed.pop(name, None)
        level.recent.append(x)
        level.counts.append(self._slots.get(name))
        if now > self._quiet_until.get(name, -math.inf):
            self.at_count.setdefault((name, self._slots.get(name)), _Readings(self.window)).recent.append(x)
            self._note_counts(name)
        return None

    def _flat_across_moves(self, name: str) -> bool:
        """``name``'s latest ``window`` readings, at two slot counts or more, agree within ``flat_spread``:
        where moves came too often for a count to have settled readings of its own (live, wide_skewed's hash
        moved among 6-9 slots every 1-5 s and read 1,003-1,020 us per row at all of them: no count was known,
        and its doubled cost was never judged; run 61c), one cost at several counts is known all the same."""
        level = self.levels.get(name)
        if level is None or len(level.recent) < self.window or len(set(level.counts)) < 2:
            return False
        spread = level.spread(self.min_readings)
        return spread is not None and spread <= self.flat_spread

    def _near_known(self, name: str) -> float | None:
        """``name``'s typical cost (log) at the nearest count within ``near_slots`` of its slots now where it
        is known (``_known_here``); None: none is."""
        k = self._slots.get(name)
        if k is None:
            return None
        for j in sorted(range(max(k - self.near_slots, 1), k + self.near_slots + 1), key=lambda j: abs(j - k)):
            if self._known_here(name, j):
                return self.at_count[(name, j)].typical()
        return None

    def _known_here(self, name: str, k: int | None) -> bool:
        """``name`` has ``min_readings`` settled readings at ``k`` slots (or its slots are not given)."""
        here = self.at_count.get((name, k))
        return k is None or (here is not None and len(here.recent) >= self.min_readings)

    def cost_per_row(self, name: str, slots: int | None = None) -> float | None:
        """The typical worker-measured seconds per output row of ``name`` (at ``slots``; None: at any slots;
        None: not read yet)."""
        readings = self.levels.get(name) if slots is None else self.at_count.get((name, slots))
        typical = None if readings is None else readings.typical()
        return None if typical is None else math.exp(typical)
