"""What each operator's capacity turned out to be at the slot counts a policy has tried.

The shield and the move size predict an operator's capacity with ``n`` slots
linearly from its measured per-slot rate (``actions.predicted_bottleneck``), as
Plumber's model does. Real operators do not always scale so: past a storage
service's channels more tasks only wait longer, and past the peak of a lock or
cache more tasks deliver *less* (Universal Scalability Law). A linear model reads
the slower tasks as "this operator needs more slots" and gives it more, which
makes it slower still. :class:`ScalingMemory` keeps, per operator, the capacity
measured at each slot count it ran at, and answers the two questions the linear
model gets wrong there:

* :meth:`limit`: past how many slots was growing this operator measured not to pay
  (the shield vetoes growing it further);
* :meth:`better`: did another slot count measure clearly faster than now (a move
  back to it is taken before anything else), and :meth:`probe_fewer`: where more
  slots measured slower, which fewer slots to try to find the peak.

A cost shift changes an operator's whole curve: a new measurement at a slot count
that differs from the remembered one by more than ``shift_tolerance`` forgets the
operator's curve, and every point expires after ``horizon`` steps. With
``shift_rescales`` (rl) it rescales the counts above instead, measured before it, by the
same ratio: on a noisy operator most such "shifts" are stray windows, and forgetting
the curve erased the evidence that more slots did not pay. rl also keeps the points
above an operator's current count for ``horizon_above`` steps (90): once that evidence
expired after 30, the linear model grew the live contended lookup past its peak again,
+4 slots in one move. Kept that long, a step up that an operator's counters read as unpaid
while the pipeline delivered more there (a warm-up window) would hold a good operator back
for as long, so with ``delivered_margin`` such a step is no limit: the samples/s the
pipeline delivered while the operator was measured at each count are kept beside it.

rl's defaults since runs 24-31 (README): ``limit_hysteresis`` keeps a measured limit until the step it rests on
measures clearly paid (live, the lookup's limit came and went within a tick), judging a point forgotten
meanwhile by its figures when the limit was last measured; ``delivered_window_s`` keeps the sink's
5 s samples/s beside each point instead of one window's (live, one window read 1,900-9,100 at fixed slots,
and such a burst cancelled the limit through ``delivered_margin``).

Live, an operator's capacity is noisy where few of its tasks finish inside a window
(8,000-row blocks, ~2 s tasks: the parse of ``per_task_overhead`` read 9,059 at 4 slots
and 7,887 at 5 in one run). :meth:`better` and :meth:`probe_fewer` therefore compare the
count an operator runs at only while it is measured steady there now (not a figure from
an earlier visit), and ask for a difference of ``noise_k`` times the operator's own
measured noise at least (``noise``: how far a steady measurement strays from its point).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def _step_share(c: float, j: int, c2: float, k: int) -> float | None:
    """What the slots from ``j`` to ``k`` added per slot (capacity ``c`` to ``c2``), as a share of the mean
    capacity per slot at ``k`` (1: linear; None where ``c2`` is not positive)."""
    if c2 <= 0:
        return None
    return ((c2 - c) / (k - j)) / (c2 / k)


def _next_below(curve: Mapping[int, float], k: int) -> int | None:
    """The largest slot count in ``curve`` smaller than ``k`` (None where there is none)."""
    return max((j for j in curve if j < k), default=None)


@dataclass
class HeldLimit:
    """Growing an operator from ``k`` to ``k2`` slots was measured not to pay, last at ``step``;
    ``points``: slots -> (capacity, delivered samples/s, step measured) there then."""

    k: int
    k2: int
    step: int
    points: dict[int, tuple[float, float | None, int]]
    #: how many times ``k2`` had been measured
    readings: int


class ScalingMemory:
    def __init__(self, names: Sequence[str], horizon: int = 30, shift_tolerance: float = 0.3,
                 share_of_linear_gain: float = 0.25, now_measurements: int = 3, drop: float = 0.1,
                 noise_k: float = 0.0, noise_alpha: float = 0.2,
                 shift_rescales: bool = False, horizon_above: int | None = None,
                 delivered_margin: float | None = None, rescale_since: bool = False,
                 limit_hysteresis: float | None = None, delivered_window_s: float | None = None,
                 delivered_max_age: int | None = None, cross_count_shift: float | None = None,
                 keep_expired_slope: bool = False, superlinear_tolerance: float | None = None,
                 above_min_readings: int | None = None, limit_outlives_lower: int | None = None,
                 shift_confirm: bool = False, ended_is_unmeasured: bool = False,
                 held_point_judges_return: bool = False):
        #: operator -> slots -> (smoothed capacity in samples/s, step it was last measured, measurements,
        #: smoothed samples/s the pipeline delivered while it was measured there, None where not given)
        self.curves: dict[str, dict[int, tuple[float, int, int, float | None]]] = {n: {} for n in names}
        self.horizon = horizon
        self.shift_tolerance = shift_tolerance
        #: growing from k to k2 slots "pays" when it adds this share of the linear model's gain
        self.share_of_linear_gain = share_of_linear_gain
        #: the count an operator runs at is compared once measured this often
        self.now_measurements = now_measurements
        #: a larger count measured fewer times than that must have measured this much less
        self.drop = drop
        #: better/probe_fewer ask for a difference of this many times an operator's noise (0: the margin only)
        self.noise_k = noise_k
        self.noise_alpha = noise_alpha
        #: operator -> smoothed relative deviation of a steady measurement from its point's figure
        self.noise: dict[str, float] = {}
        #: a cost shift rescales the operator's points above the shifted one by its ratio (False: forgets all)
        self.shift_rescales = shift_rescales
        #: points above an operator's current count expire after this many steps (None: ``horizon``)
        self.horizon_above = horizon_above
        #: a step up counts as not paid only where the pipeline's delivered samples/s at the larger count
        #: did not exceed that at the smaller by this much (None: the operator's counters alone)
        self.delivered_margin = delivered_margin
        #: a shift rescales the counts above measured since the shifted one last was as well (False: forgets
        #: them). Live, a stray window on the return to a count forgot the count above that had just measured
        #: slower, and rl grew the contended lookup past its peak again (run 21); on, held-out cost shifts
        #: lose (rescaled figures from across a real shift): rl option ``rl_rescale_since``, off by default
        self.rescale_since = rescale_since
        #: a limit, once measured, holds until the step it rests on measures paid by this much more than
        #: the line (or its evidence is ``horizon_above`` steps old): None, a limit lasts while its two
        #: points say so. Live, the contended lookup's limit vanished within a tick (a re-measured point's
        #: smoothed figure crossing the line, a stray window forgetting a point) and rl grew it past its
        #: peak again (run 23)
        self.limit_hysteresis = limit_hysteresis
        #: the delivered samples/s beside each point are the sink's over this many seconds, taken only once
        #: the allocation has been unchanged that long (the caller passes them; None: one window's). Live,
        #: one window of the contended pipeline read 1,900-9,100 samples/s at fixed slots, and such a burst
        #: cancelled the lookup's measured limit through ``delivered_margin`` (run 25)
        self.delivered_window_s = delivered_window_s
        #: ``delivered_margin`` compares two points' delivered samples/s only where they were measured within
        #: this many steps of each other (None: whenever). Live, the pipeline's delivered rate drifts: 50 s
        #: after 5 lookup slots were measured, the 4 held since read 15% below them and freed the limit
        #: (run 33, round 2: +4 to 8)
        self.delivered_max_age = delivered_max_age
        #: a new count whose capacity is below this share of a smaller count's (or a larger count's below this
        #: share of the new count's) is a cost shift, not a scaling curve: no lock or channel limit halves what
        #: an operator delivers for a slot more, a cost per row that rose 8x does. The operator's other points
        #: are forgotten and ``cross_shifts`` counts it (None: off). Without it, rl judged "2 slots of a" by
        #: the figure 1 slot had measured before a's cost rose 8x, went back and held there (0.2 of the
        #: optimum, tests/tuner/test_policies.py)
        self.cross_count_shift = cross_count_shift
        self.cross_shifts = 0
        #: operator -> the limit held (``limit_hysteresis``)
        self.held: dict[str, HeldLimit] = {}
        #: operator -> why its held limit last ended, until read (``pop_ended``): the decision log says it on
        #: the tick it happens, as a limit's start is said by the hold it makes
        self.ended: dict[str, str] = {}
        #: operators whose held limit of a step of two slots or more expired with its lower point while they
        #: ran past it, and that have not grown since (rl's ``one_slot_after_release``)
        self.released: set[str] = set()
        #: operator -> the count of a held limit that ended by age alone (its evidence outlived
        #: ``horizon``/``horizon_above`` with nothing measured against it since), until the operator grows
        #: past it (rl's ``one_slot_after_aged_limit``): the step is unmeasured again, not paid
        self.aged_out: dict[str, int] = {}
        #: a held limit that expired with its lower point leaves its step's slope behind (operator -> (the
        #: step's larger count, the share of a linear gain it added)): ``marginal_share`` answers from it
        #: while no smaller count is measured again (False: off). Live, the contended lookup's limit "4 -> 5
        #: did not pay" expired with the point at 4, and the next "+1" took it 5 -> 9 in one move
        self.keep_expired_slope = keep_expired_slope
        self.expired_share: dict[str, tuple[int, float]] = {}
        #: a count's figure is read as at most the next smaller count's figure scaled linearly, times 1 + this
        #: (None: as measured). Slots running one operator's tasks side by side add at most a linear share
        #: each; a figure above that is a burst of finished tasks, not capacity. Live, per_task_overhead's
        #: sparse hash read 9,232 at 6 slots and 32,076 at 7: rl went back to 7 from 9 ("+97% there") and
        #: held a limit of 7 from it across the cost shift (run 50). rl option ``rl_superlinear_tolerance``
        #: (off): simulated unchanged (no bursts there), live inconclusive over 4 shift runs (README, run 51)
        self.superlinear_tolerance = superlinear_tolerance
        #: a point above the count an operator runs at is kept ``horizon_above`` steps only where measured this
        #: many times at least (fewer: ``horizon``), and so is a limit that rests on it (None: any point). Live,
        #: dlrm_preprocessing's sparse hash read ~3,300 at 4 slots ~20 s into the run while workers still
        #: started, then ~5,200 at 3: the limit "3" held it there, 100% busy with every other operator 10-60%
        #: busy, for the remaining 70 s (5,310 samples/s against plumber's 11,025; tuner/README.md, run 52)
        self.above_min_readings = above_min_readings
        #: a held limit whose step spans this many slots or more outlives its lower point's expiry while the
        #: operator runs at the step's top or past it: the point is judged by its figures when the limit was
        #: last measured (``_ends``) until ``horizon_above`` steps (None: it goes with the point). An
        #: operator past its limit does not measure the count below again, so its point expires after
        #: ``horizon`` steps while the evidence above it is kept ``horizon_above``: live, the contended lookup
        #: at 7-8 slots past a limit at 5-6 went +2 to +4 within a tick of that expiry, each time past its
        #: peak, in 8 of runs 66-68's contended shift runs
        self.limit_outlives_lower = limit_outlives_lower
        #: with ``shift_rescales``, a reading off its point by more than ``shift_tolerance`` is taken for a cost
        #: shift only where the next reading at those slots is off the same way; alone it is left out (False:
        #: at once). A burst window at the lower count of a limit rescales the points above by its ratio while
        #: the lower point is measured back down: live, the contended lookup's "5 -> 6 did not pay" ended as
        #: "capacity 7,781 at 6 slots against 6,621 at 5" (6 last read 5,982, x1.30) and the net's "+1" took
        #: it 6 -> 10 in that tick (tuner/README.md, run 80)
        self.shift_confirm = shift_confirm
        #: a held limit that ends on its step measured to pay (or on what the pipeline delivered there) marks
        #: its count in ``aged_out`` as one that ends by age does (False: by age only): the step paid, but
        #: past where the operator runs now nothing is measured. Live, the contended lookup's "6 -> 8 did not
        #: pay" ended as "the pipeline delivered 6,920 samples/s at 8 slots against 5,536 at 6" and the net's
        #: "+1" took it 8 -> 12 in that tick, past its peak, for 39 s (tuner/README.md, run 80)
        self.ended_is_unmeasured = ended_is_unmeasured
        #: where a held limit's point was forgotten while it holds, the rules that send an operator past it
        #: back judge it by the limit's figures when last measured (:meth:`limit_point`; False: they cannot
        #: judge it, and the operator stays past the limit until it ends)
        self.held_point_judges_return = held_point_judges_return
        #: operator -> (slots, whether up) of a reading off its point awaiting the next (``shift_confirm``)
        self.pending_shift: dict[str, tuple[int, bool]] = {}
        self.step = 0

    def record(self, alloc: Mapping[str, int], capacities: Mapping[str, float | None],
               delivered: float | None = None) -> None:
        """One measurement of the capacity (samples/s) of the operators in ``capacities`` at ``alloc``.
        Pass only operators whose slots have not changed for a few windows: right after a move the
        new slots are occupied before they deliver (a task can outlast several windows), and the
        rates of the windows before still weigh in, so the first windows read low or high."""
        self.step += 1
        got = delivered if delivered is not None and delivered > 0 else None
        for name, cap in capacities.items():
            k = alloc.get(name)
            if cap is None or not k or cap <= 0:
                continue
            curve = self.curves.setdefault(name, {})
            for old in [j for j, (_, t, n, _) in curve.items() if self.step - t > self._horizon(j, k, n)]:
                age = self.step - curve.pop(old)[1]
                if (held := self.held.get(name)) is not None and old in (held.k, held.k2):
                    if (self.limit_outlives_lower is not None and old == held.k and k >= held.k2
                            and held.k2 - held.k >= self.limit_outlives_lower):
                        continue  # judged by held.points until horizon_above (_ends)
                    # its evidence as old as the memory keeps any: kept on, a gradual cost shift held a
                    # simulated operator below its new optimum for the rest of the run
                    self._end(name, f"its point at {old} slots expired ({age} steps old)")
                    self.aged_out[name] = held.k  # its step is unmeasured again, not paid
                    if self.keep_expired_slope and (share := self._held_share(held)) is not None:
                        self.expired_share[name] = (held.k2, share)
                    if old == held.k < k and held.k2 - held.k >= 2:
                        # the operator runs past the limit, and what lies past it is known again only
                        # by measuring it (rl's ``one_slot_after_release``)
                        self.released.add(name)
            seen = curve.get(k)
            if seen is None and self.cross_count_shift is not None and self._across_a_shift(name, curve, k, cap):
                curve.clear()
                self._end(name, f"{cap:,.0f} at {k} slots cannot lie on one curve with its other points (a cost shift)")
                self.noise.pop(name, None)
                self.expired_share.pop(name, None)
                self.cross_shifts += 1
            dev = abs(cap / seen[0] - 1.0) if seen is not None and seen[0] > 0 else None
            pending = self.pending_shift.pop(name, None)
            if dev is not None and dev > self.shift_tolerance and self.shift_confirm and self.shift_rescales:
                # one window off its point is a burst until the next at these slots is off the same way
                up = cap > seen[0]
                if pending is None or pending != (k, up):
                    self.pending_shift[name] = (k, up)
                    continue
            if dev is not None and dev > self.shift_tolerance:
                if self.shift_rescales:
                    # Its cost changed, and so did its capacity at the counts above, by the same factor (a
                    # cost per row scales every count alike): rescaled, they still say whether more slots
                    # pay. Forgetting them let one stray window of a noisy operator erase "more slots did
                    # not pay", and the linear model grew the contended lookup past its peak again. The
                    # counts below are forgotten: a lucky figure there would keep drawing a move back.
                    # A count measured after the shifted one last was may have been measured across the
                    # shift (an operator's window outlasts a tick): forgotten too.
                    # The deviation counts as noise (bounded): a false shift is a noisy window.
                    ratio = cap / seen[0]
                    for j, (v, t, n, d) in list(curve.items()):
                        if j > k and (t <= seen[1] or self.rescale_since):  # measured before the shifted point last was
                            curve[j] = (v * ratio, t, n, d)
                        else:  # below; or measured since, maybe across the shift: neither scale fits it
                            del curve[j]
                    self._note_noise(name, dev)
                    self.expired_share.pop(name, None)  # a step measured before a cost shift sizes nothing
                    if (held := self.held.get(name)) is not None:
                        # its figures from before the shifted count last was compare with it rescaled; those
                        # measured since may be from after the shift already (kept as they are: a stray
                        # window on the return to 6 lookup slots must not make 10 look paid, nor a real shift
                        # keep a count above that measured after it from looking paid)
                        held.points = {j: (c * ratio if t <= seen[1] else c, d, t)
                                       for j, (c, d, t) in held.points.items()}
                else:
                    curve.clear()  # its cost changed: the rest of its curve is stale too
                    self.noise.pop(name, None)  # and the deviations on the way there were no noise
                    self._end(name, f"{cap:,.0f} at {k} slots, {dev:.0%} off its point there (a cost shift)")
                    self.expired_share.pop(name, None)
                curve[k] = (cap, self.step, 1, got)
                continue
            if dev is not None:
                self._note_noise(name, dev)
            if seen is None:
                curve[k] = (cap, self.step, 1, got)
            else:
                d = seen[3] if got is None else got if seen[3] is None else 0.5 * (seen[3] + got)
                curve[k] = (0.5 * (seen[0] + cap), self.step, seen[2] + 1, d)

    def _across_a_shift(self, name: str, curve: Mapping[int, tuple], k: int, cap: float) -> bool:
        """``cap`` at ``k`` slots and some other count's figure cannot lie on one scaling curve
        (``cross_count_shift``): more slots measured to deliver less than that share of fewer, by more than
        3x the operator's measured noise (live, a lookup's windows swing 4-8x: its readings say nothing of
        the kind; an operator whose noise is not measured yet is not judged)."""
        noise = self.noise.get(name)
        if noise is None:
            return False  # how far its readings stray is not known yet: nothing to tell a shift by

        def drop(more: float, fewer: float) -> bool:
            return fewer > 0 and more < self.cross_count_shift * fewer and 1.0 - more / fewer > 3.0 * noise

        return any((j < k and drop(cap, v[0])) or (j > k and drop(v[0], cap)) for j, v in curve.items())

    def _horizon(self, j: int, now: int, readings: int) -> int:
        """How many steps a point at ``j`` slots measured ``readings`` times is kept while the operator runs at
        ``now``."""
        return self.horizon if j <= now else self._limit_horizon(readings)

    def _limit_horizon(self, readings: int) -> int:
        """``horizon_above``, or ``horizon`` for a point above measured fewer than ``above_min_readings`` times."""
        few = self.above_min_readings is not None and readings < self.above_min_readings
        return self.horizon if few or self.horizon_above is None else self.horizon_above

    def _note_noise(self, name: str, dev: float) -> None:
        old = self.noise.get(name)
        if old is not None:  # one stray window (a cost shift under way) moves it by a bounded step
            dev = min(dev, 2.0 * old + 0.02)
        self.noise[name] = dev if old is None else (1 - self.noise_alpha) * old + self.noise_alpha * dev

    def forget(self, name: str, why: str = "its cost per row changed") -> None:
        """Drop everything measured of ``name``: its cost per row changed (``cost_shift``), so every
        point of its curve, and any limit resting on them, describes an operator that no longer runs.
        Its noise stands: how far one window strays is the counters', not the cost's."""
        self.curves[name] = {}
        self._end(name, why)
        self.expired_share.pop(name, None)
        self.released.discard(name)
        self.aged_out.pop(name, None)

    def forget_all(self) -> None:
        """Drop every operator's points, limits and noise: they were read while the pass's rates still
        climbed (workers warming up), so neither the figures nor their spread describe it steady."""
        for name in self.curves:
            self.forget(name, "what was measured while the workers warmed up is forgotten")
        self.noise.clear()

    def forget_above(self, name: str, k: int) -> None:
        """Drop ``name``'s points above ``k`` slots (what it delivered there end to end says otherwise)."""
        curve = self.curves.get(name, {})
        for j in [j for j in curve if j > k]:
            del curve[j]

    def settled(self, name: str) -> dict[int, float]:
        """Slot count -> capacity, for every point recorded (each one measured steady; with
        ``superlinear_tolerance``, no more than a linear gain over the count below allows)."""
        curve = {k: v[0] for k, v in self.curves.get(name, {}).items()}
        if self.superlinear_tolerance is None:
            return curve
        below: tuple[int, float] | None = None
        for k in sorted(curve):
            if below is not None:
                curve[k] = min(curve[k], below[1] * k / below[0] * (1.0 + self.superlinear_tolerance))
            below = (k, curve[k])
        return curve

    def delivered(self, name: str) -> dict[int, float]:
        """Slot count -> samples/s the pipeline delivered while ``name`` was measured there (where given)."""
        return {k: v[3] for k, v in self.curves.get(name, {}).items() if v[3] is not None}

    def limit_point(self, name: str, limit: int) -> tuple[float, float | None] | None:
        """``name``'s figures at its ``limit``: (capacity, delivered samples/s or None), from its curve, or
        where that point was forgotten while the limit holds (``held``), from the limit's figures when it was
        last measured, as :meth:`_ends` judges it (``held_point_judges_return``; None where neither has it).
        A reading off its point at a count past the limit (a cost shift, or a first window read low as its
        workers started) forgets the counts below it, the limit's among them, while the limit holds: live,
        the contended lookup sat at 12 slots past a limit of 8 for 34 s, 12 reading ~4,500 against ~5,900
        at 8, and no rule could compare the two (tuner/README.md, run 81)."""
        if limit in self.curves.get(name, {}):
            return self.settled(name)[limit], self.curves[name][limit][3]
        held = self.held.get(name)
        if self.held_point_judges_return and held is not None and held.k == limit and limit in held.points:
            c, d, _ = held.points[limit]
            return c, d
        return None

    def delivered_past(self, name: str, now: int, limit: int) -> tuple[float, float] | None:
        """What the pipeline delivered with ``name`` at ``now`` slots (measured often there) and at its
        ``limit`` (:meth:`limit_point`): (at now, at the limit); None where either figure is missing."""
        delivered = self.delivered(name)
        at_limit = self.limit_point(name, limit)
        if not self.measured_often(name, now) or now not in delivered or at_limit is None or at_limit[1] is None:
            return None
        return delivered[now], at_limit[1]

    def no_faster_past(self, name: str, now: int, limit: int, margin: float) -> bool:
        """``name`` at ``now`` slots, past its ``limit``, is measured no faster there: ``now`` measured often,
        its capacity at most ``margin`` over the limit's, and the pipeline delivered no more there."""
        if (both := self.delivered_past(name, now, limit)) is None:
            return False
        curve, at_limit = self.settled(name), self.limit_point(name, limit)
        return at_limit is not None and curve[now] <= at_limit[0] * (1.0 + margin) and both[0] <= both[1]

    def delivered_less_past(self, name: str, now: int, limit: int, drop: float) -> bool:
        """``name`` at ``now`` slots, past its ``limit``, measured often there, and the pipeline delivered at
        least ``drop`` less there than at the limit (whatever its own counters read: live, the contended
        lookup's at a count just grown read as its new workers started)."""
        both = self.delivered_past(name, now, limit)
        return both is not None and both[0] <= both[1] * (1.0 - drop)

    def no_faster_past_unmeasured_limit(self, name: str, now: int, limit: int, margin: float) -> bool:
        """``name`` at ``now`` slots, past its ``limit``, measured often there at most ``margin`` over the
        limit's capacity (a negative ``margin``: at least that much under it), where what the pipeline
        delivered at the limit was never measured (the count was left before ``delivered_window_s`` passed),
        so :meth:`no_faster_past` cannot compare it, and the pipeline delivers less at ``now`` than the
        limit's capacity. Its counters say the slots past the limit bought nothing; going back measures
        the pipeline there."""
        curve, delivered = self.settled(name), self.delivered(name)
        at_limit = self.limit_point(name, limit)
        if not self.measured_often(name, now) or now not in curve or at_limit is None or now not in delivered:
            return False
        # and the limit's capacity alone is above what the pipeline delivers now: going back can cap it no lower
        return (at_limit[1] is None and curve[now] <= at_limit[0] * (1.0 + margin)
                and at_limit[0] > delivered[now])

    def measured_no_faster_above(self, name: str, k: int) -> bool:
        """A count of ``name`` larger than ``k`` measured at no more capacity than ``k`` (False where ``k``
        itself is not measured)."""
        curve = self.settled(name)
        return k in curve and any(c <= curve[k] for j, c in curve.items() if j > k)

    def measured_often(self, name: str, k: int) -> bool:
        """``k`` measured ``now_measurements`` times: the count an operator runs at is measured again
        every window, so it is compared only once its figure is steadier."""
        return self.curves.get(name, {}).get(k, (0.0, 0, 0, None))[2] >= self.now_measurements

    def measured_now(self, name: str, k: int) -> bool:
        """``name`` measured steady at ``k`` slots by the latest :meth:`record` (this visit, not a stale one)."""
        point = self.curves.get(name, {}).get(k)
        return point is not None and point[1] == self.step

    def margin(self, name: str, margin: float) -> float:
        """The relative difference two of ``name``'s points must show to count: ``margin``, or
        ``noise_k`` times its measured noise where that is more."""
        return max(margin, self.noise_k * self.noise.get(name, 0.0))

    def step_looks_paid(self, name: str, k: int) -> bool:
        """The step up to ``k`` slots from the next smaller count measured added the share of the linear
        model's gain that :meth:`limit` asks for, on however few measurements ``k`` has (True where
        nothing smaller, or ``k`` itself, is measured)."""
        curve = self.settled(name)
        j = _next_below(curve, k)
        if k not in curve or j is None:
            return True
        return curve[k] >= self._paid_line(curve[j], j, k)

    def limit(self, name: str) -> int | None:
        """The slots ``k`` of ``name`` from which the next larger count measured did not pay (the
        first such step up; None: no such evidence)."""
        curve = self.settled(name)

        def did_not_pay(k: int, k2: int) -> bool:
            if self._delivered_rose(name, k, k2):
                return False  # its counters say no, what the pipeline delivered says yes
            if self.measured_often(name, k2):
                return curve[k2] < self._paid_line(curve[k], k, k2)
            return curve[k2] < curve[k] * (1.0 - self.drop)  # fewer measurements: only a clear drop counts

        ks = sorted(curve)
        # measured counts in order: the first step up that did not pay
        found = next(((k, k2) for k, k2 in zip(ks, ks[1:]) if did_not_pay(k, k2)), None)
        if self.limit_hysteresis is None:
            return found[0] if found else None
        held = self.held.get(name)
        if found is not None and (held is None or found[0] <= held.k):
            self.held[name] = self._hold(name, *found)
            return found[0]
        if held is not None and (why := self._ends(name, held)) is None:
            return held.k if found is None else min(held.k, found[0])
        if held is not None and found is None and self._aged(held):
            self.aged_out[name] = held.k  # its step is unmeasured again, not paid
        if held is not None:
            self._end(name, why if found is None else f"{why}; the first step that did not pay is now {found[0]} -> {found[1]}")
            if found is None and self.ended_is_unmeasured:
                self.aged_out.setdefault(name, held.k)  # what lies past where it runs is measured afresh
        if found is not None:
            self.held[name] = self._hold(name, *found)
        return found[0] if found else None

    def _hold(self, name: str, k: int, k2: int) -> HeldLimit:
        curve, settled = self.curves[name], self.settled(name)
        return HeldLimit(k, k2, self.step, {j: (settled[j], curve[j][3], curve[j][1]) for j in (k, k2)},
                         curve[k2][2])

    def _ends(self, name: str, held: HeldLimit) -> str | None:
        """Why a held limit ends now (None: it stands). It stands until the step it rests on measures clearly
        paid (``k2`` over the line by ``limit_hysteresis``), or what the pipeline delivered rose there as
        :meth:`limit` asks, or ``horizon_above`` steps pass. A point forgotten meanwhile (a stray window read
        as a cost shift) is judged by its figures when the limit was last measured: live, forgetting the
        counts below made the step up to 11 lookup slots "count as paid"."""
        if self._aged(held):
            return f"measured last {self.step - held.step} steps ago"
        curve, settled = self.curves.get(name, {}), self.settled(name)
        (c, d, t), (c2, d2, t2) = ((settled[j], curve[j][3], curve[j][1]) if j in curve else held.points[j]
                                   for j in (held.k, held.k2))
        if self._rose(d, d2, t, t2):
            return f"the pipeline delivered {d2:,.0f} samples/s at {held.k2} slots against {d:,.0f} at {held.k}"
        if held.k2 in curve and not self.measured_often(name, held.k2):
            return None
        line = self._paid_line(c, held.k, held.k2) * (1.0 + self.limit_hysteresis)
        if c2 < line:
            return None
        return f"capacity {c2:,.0f} at {held.k2} slots against {c:,.0f} at {held.k}: the step paid"

    def _end(self, name: str, why: str) -> None:
        """``name``'s held limit (if any) ends, for ``why``."""
        held = self.held.pop(name, None)
        if held is not None:
            self.ended[name] = f"its limit of {held.k} slots ended: {why}"

    def pop_ended(self) -> dict[str, str]:
        """Why each held limit that ended since the last call ended."""
        out, self.ended = self.ended, {}
        return out

    def _aged(self, held: HeldLimit) -> bool:
        """``held`` last measured longer ago than its points are kept (``_limit_horizon``)."""
        return self.step - held.step > self._limit_horizon(held.readings)

    def _paid_line(self, capacity: float, k: int, k2: int) -> float:
        """The capacity at ``k2`` slots that counts as paid from ``capacity`` at ``k``: the share of
        the linear model's gain :meth:`limit` asks for."""
        return capacity * (1.0 + self.share_of_linear_gain * (k2 / k - 1.0))

    def _rose(self, d: float | None, d2: float | None, t: int, t2: int) -> bool:
        """Delivered samples/s rose from ``d`` (measured last at step ``t``) to ``d2`` (at ``t2``) by more
        than ``delivered_margin``, the two measured within ``delivered_max_age`` steps of each other."""
        if self.delivered_max_age is not None and abs(t - t2) > self.delivered_max_age:
            return False
        return self.delivered_margin is not None and d is not None and d2 is not None \
            and d2 > d * (1.0 + self.delivered_margin)

    def _delivered_rose(self, name: str, k: int, k2: int) -> bool:
        curve = self.curves.get(name, {})
        if k not in curve or k2 not in curve:
            return False
        return self._rose(curve[k][3], curve[k2][3], curve[k][1], curve[k2][1])

    def better(self, name: str, now: int, margin: float) -> int | None:
        """The slot count that measured the most capacity, if it beat the capacity at ``now`` by more
        than ``margin`` (or than its noise, :meth:`margin`); None otherwise, or while ``now`` is not
        measured often, and steady now."""
        if not self.measured_often(name, now) or (self.noise_k > 0 and not self.measured_now(name, now)):
            return None
        # within `horizon` only: a point kept longer (`horizon_above`) says where more slots did not pay,
        # not where to go (a warm-up figure 40 steps old drew no move, and kept the move back after a
        # cost shift from being taken)
        settled = self.settled(name)
        curve = {k: settled[k] for k, (_, t, _, _) in self.curves.get(name, {}).items()
                 if k == now or self.step - t <= self.horizon}
        best = max(curve, key=curve.get)
        return best if curve[best] > curve[now] * (1.0 + self.margin(name, margin)) else None

    def probe_fewer(self, name: str, now: int, share: float = 0.7, margin: float = 0.0) -> int | None:
        """Where more slots than ``now`` measured *less* capacity (its tasks slow each other down; by
        more than ``margin`` or its noise, :meth:`margin`) and nothing between ``share * now`` and
        ``now`` is measured: that many slots, to find the peak."""
        if not self.measured_often(name, now) or (self.noise_k > 0 and not self.measured_now(name, now)):
            return None
        curve = self.settled(name)
        floor = 1.0 - self.margin(name, margin) if self.noise_k > 0 else 1.0
        if not any(k2 > now and curve[k2] < curve[now] * floor for k2 in curve):
            return None
        target = max(1, math.ceil(now * share))
        if target >= now or any(target <= k < now for k in curve):
            return None
        return target

    def marginal_share(self, name: str, k: int) -> float | None:
        """What the last slots up to ``k`` added per slot, as a share of ``name``'s mean capacity per slot
        at ``k`` (1: linear; from ``k`` and the next smaller count measured; None where either is not)."""
        curve = self.settled(name)
        j = _next_below(curve, k)
        if j is None and (kept := self.expired_share.get(name)) is not None and k >= kept[0]:
            return kept[1]  # the step of an expired limit, while nothing below is measured again
        if k not in curve or j is None:
            return None
        return _step_share(curve[j], j, curve[k], k)

    @staticmethod
    def _held_share(held: HeldLimit) -> float | None:
        """The share of a linear gain the step of ``held`` added (as ``marginal_share`` reads a step)."""
        return _step_share(held.points[held.k][0], held.k, held.points[held.k2][0], held.k2)

    def describe(self, name: str) -> str:
        curve = self.settled(name)
        return ", ".join(f"{curve[k]:,.0f} at {k}" for k in sorted(curve))


class AllocationThroughput:
    """The samples/s each recent whole allocation delivered, end to end, and whether the moves paid.

    :class:`ScalingMemory` judges an operator by its own counters, which are block-granular: live, the
    contended lookup of ``benchmarks/pipelines/contended_lookup.yaml`` (tasks that outlast the tuner's
    interval) measured 9.3k, 8.2k, 1.0k, 0.9k samples/s of capacity in consecutive seconds at fixed
    slots, so its rules never fired and a policy kept growing the lookup past its peak. The delivered
    throughput is what every move is for and does not depend on any one operator's counters. Each visit
    to an allocation is measured on its own (a return after a cost shift is not averaged with what it
    delivered before), over ``min_measure_s`` at least. Where an allocation measured within the last
    ``memory_s`` delivered more than the current one by more than ``noise_k`` times the measured noise
    (at least ``min_margin``), :meth:`better_than_now` names it; the operators the current allocation
    has more slots of are then kept at that allocation's slots for ``memory_s`` (doubled each time the
    same operator is caught again), and :meth:`probe_fewer` tries them lower, step by step; either
    move is undone by :meth:`judge_trial` where it delivered less than where it started. Nothing is
    measured in a pass's first ``warmup_s`` of delivery. Used by ``rl`` with ``rl_judge_moves``.
    """

    def __init__(self, memory_s: float = 60.0, min_measure_s: float = 4.0, settle_s: float = 1.0,
                 min_margin: float = 0.08, noise_k: float = 2.0, alpha: float = 0.2, prior_noise: float = 0.25,
                 prior_windows: int = 8, warmup_s: float = 20.0):
        self.memory_s = memory_s
        self.min_measure_s = min_measure_s
        self.settle_s = settle_s
        self.min_margin = min_margin
        self.noise_k = noise_k
        self.alpha = alpha
        #: allocation -> (mean delivered samples/s over its latest visit, seconds measured, time last measured)
        self.measured: dict[tuple[tuple[str, int], ...], tuple[float, float, float]] = {}
        # smoothed relative deviation of one window's throughput from its visit's mean; until
        # `prior_windows` have been compared, a conservative prior (a sink that delivers a few large
        # blocks a second swings +-30% between windows)
        self.noise = prior_noise
        self.prior_windows = prior_windows
        self.windows = 0
        self._first: list[float] = []  # the first windows' deviations (replace the prior once enough)
        # A pipeline's first seconds of delivery are no allocation's steady state: live, nothing for
        # 5-37 s (workers starting), then bursts of 8k samples/s as queued blocks flush, then 5k.
        self.warmup_s = warmup_s
        self.delivering_since: float | None = None
        #: operator -> (slots it is kept at or below, until when)
        self.limits: dict[str, tuple[int, float]] = {}
        #: operator -> until when: more of its slots delivered less, so fewer may deliver more
        self.suspects: dict[str, float] = {}
        self.times_limited: dict[str, int] = {}
        self.probed: dict[tuple[str, int], float] = {}  # (operator, slots) -> when last probed
        #: the judged move under way (a move back or a probe): the allocation it left, and the limits
        #: before it (restored where the move turns out to deliver less)
        self.trial: tuple[dict[str, int], dict[str, tuple[int, float]]] | None = None
        self.max_memory_s = 8 * memory_s

    @staticmethod
    def key(alloc: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(alloc.items()))

    def record(self, t: float, alloc: Mapping[str, int], throughput: float, window_s: float,
               since_change_s: float) -> None:
        """One window's delivered samples/s at ``alloc`` (ignored until the allocation has settled)."""
        if self.delivering_since is None and throughput > 0:
            self.delivering_since = t
        if self.delivering_since is None or t - self.delivering_since < self.warmup_s:
            return
        measured_for = min(since_change_s, t - self.delivering_since - self.warmup_s) - self.settle_s
        if measured_for <= 0 or window_s <= 0:
            return
        key = self.key(alloc)
        old = self.measured.get(key)
        if old is not None and old[1] > measured_for + 1e-9:
            old = None  # a new visit (the counters of the last one describe another time)
        # windows overlap (a 3 s window each 1 s tick): weigh each by the time it adds
        weight = min(window_s, measured_for, math.inf if old is None else t - old[2])
        if weight <= 0:
            return
        if old is None:
            self.measured[key] = (throughput, weight, t)
            return
        mean, secs, _ = old
        if mean > 0 and secs >= self.min_measure_s:
            dev = abs(throughput - mean) / mean
            self.windows += 1
            if self.windows <= self.prior_windows:  # the prior holds until enough windows: then their mean
                self._first.append(dev)
                if self.windows == self.prior_windows:
                    self.noise = sum(self._first) / len(self._first)
            else:
                self.noise = (1 - self.alpha) * self.noise + self.alpha * dev
        secs += weight
        self.measured[key] = (mean + (throughput - mean) * weight / secs, secs, t)

    def new_execution(self) -> None:
        """A new execution of the pipeline (an epoch's pass) starts delivering, and warms up, anew."""
        self.delivering_since = None

    def forget(self) -> None:
        """A cost shift: what each allocation delivered before it describes another pipeline, and so do the
        limits and the probes drawn from it (the judged move under way included)."""
        self.measured.clear()
        self.limits.clear()
        self.suspects.clear()
        self.probed.clear()
        self.trial = None

    def margin(self) -> float:
        # a mean over min_measure_s of ~1 s windows: its error is about one window's / sqrt(seconds)
        return max(self.min_margin, self.noise_k * self.noise / math.sqrt(max(self.min_measure_s, 1.0)))

    def ready(self, alloc: Mapping[str, int]) -> bool:
        """``alloc``'s current visit has been measured long enough to be compared."""
        m = self.measured.get(self.key(alloc))
        return m is not None and m[1] >= self.min_measure_s

    def better_than_now(self, t: float, alloc: Mapping[str, int]) -> tuple[dict[str, int], float] | None:
        """(the allocation measured lately that delivered the most, its gain over ``alloc``) where that
        gain clears the margin; None otherwise, or while ``alloc`` is not measured long enough. Keeps
        the operators ``alloc`` has more slots of at that allocation's slots for ``memory_s``."""
        now = self.measured.get(self.key(alloc))
        if now is None or now[1] < self.min_measure_s or now[0] <= 0:
            return None
        for key in [k for k, m in self.measured.items() if t - m[2] > self.memory_s]:
            del self.measured[key]
        cands = [(m[0], k) for k, m in self.measured.items() if m[1] >= self.min_measure_s and k != self.key(alloc)]
        if not cands:
            return None
        best, key = max(cands)
        if best <= now[0] * (1.0 + self.margin()):
            return None
        target = dict(key)
        self.trial = (dict(alloc), dict(self.limits))
        for name, k in target.items():
            if alloc.get(name, 0) > k:
                # each time growing it is measured not to pay again, the evidence is kept twice as long
                # (a re-test costs the pipeline the seconds it runs past the peak)
                self.times_limited[name] = self.times_limited.get(name, 0) + 1
                keep = min(self.memory_s * 2 ** (self.times_limited[name] - 1), self.max_memory_s)
                self.limits[name] = (k, t + keep)
                self.suspects[name] = t + self.memory_s  # its peak may lie below k too
            elif (lim := self.limit(name, t)) is not None and k > lim:
                self.limits[name] = (k, self.limits[name][1])  # measured best there
        return target, best / now[0] - 1.0

    def probe_fewer(self, t: float, alloc: Mapping[str, int], min_slots: Mapping[str, int],
                    share: float = 0.7) -> tuple[str, int] | None:
        """(operator, slots) to try next: an operator whose growth was measured to deliver less (its
        peak may lie lower still) at ``share`` of its slots, unless that count was probed within
        ``memory_s``; kept at or below it until measured. None: nothing to probe."""
        for name in [n for n, until in self.suspects.items() if t > until]:
            del self.suspects[name]
        for name in sorted(self.suspects):
            k = max(min_slots.get(name, 1), math.ceil(alloc.get(name, 0) * share))
            if k >= alloc.get(name, 0) or t - self.probed.get((name, k), -math.inf) <= self.memory_s:
                continue  # nothing below, or tried lately (whatever the other operators had then)
            self.probed[(name, k)] = t
            self.trial = (dict(alloc), dict(self.limits))
            self.limits[name] = (k, t + self.memory_s)
            return name, k
        return None

    def judge_trial(self, alloc: Mapping[str, int]) -> dict[str, int] | None:
        """Once the allocation a judged move (back or probe) went to is measured: the allocation the move
        left, where that delivered more, with the limits from before the move. None: no such move under
        way, not measured yet, or it paid.

        A judged move is an experiment, kept only if it delivers at least as much as where it started.
        Otherwise a probe within the noise margin of :meth:`better_than_now` is kept as often as not and
        step by step walks the operator below its peak, and a move back, chosen as the best of several
        noisy means (the luckiest), is never checked (live, and in the simulator at 25% window noise,
        both left the contended lookup at 3 slots where 5-6 deliver 15% more)."""
        if self.trial is None or not self.ready(alloc):
            return None
        left, limits = self.trial
        self.trial = None
        before, now = self.measured.get(self.key(left)), self.measured.get(self.key(alloc))
        if before is None or now is None or before[0] <= now[0]:
            return None  # it paid, or the evidence expired: nothing to go back to
        self.limits = limits
        return left

    def limit(self, name: str, t: float) -> int | None:
        """The slots ``name`` is kept at or below (more were measured to deliver less), if any."""
        lim = self.limits.get(name)
        if lim is None or t > lim[1]:
            return None
        return lim[0]
