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
operator's curve, and every point expires after ``horizon`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


class ScalingMemory:
    def __init__(self, names: Sequence[str], horizon: int = 30, shift_tolerance: float = 0.3,
                 share_of_linear_gain: float = 0.25, now_measurements: int = 3, drop: float = 0.1):
        #: operator -> slots -> (smoothed capacity in samples/s, step it was last measured, measurements)
        self.curves: dict[str, dict[int, tuple[float, int, int]]] = {n: {} for n in names}
        self.horizon = horizon
        self.shift_tolerance = shift_tolerance
        #: growing from k to k2 slots "pays" when it adds this share of the linear model's gain
        self.share_of_linear_gain = share_of_linear_gain
        #: the count an operator runs at is compared once measured this often
        self.now_measurements = now_measurements
        #: a larger count measured fewer times than that must have measured this much less
        self.drop = drop
        self.step = 0

    def record(self, alloc: Mapping[str, int], capacities: Mapping[str, float | None]) -> None:
        """One measurement of the capacity (samples/s) of the operators in ``capacities`` at ``alloc``.
        Pass only operators whose slots have not changed for a few windows: right after a move the
        new slots are occupied before they deliver (a task can outlast several windows), and the
        rates of the windows before still weigh in, so the first windows read low or high."""
        self.step += 1
        for name, cap in capacities.items():
            k = alloc.get(name)
            if cap is None or not k or cap <= 0:
                continue
            curve = self.curves.setdefault(name, {})
            for old in [j for j, (_, t, _) in curve.items() if self.step - t > self.horizon]:
                del curve[old]
            seen = curve.get(k)
            if seen is not None and abs(cap / seen[0] - 1.0) > self.shift_tolerance:
                curve.clear()  # its cost changed: the rest of its curve is stale too
                seen = None
            curve[k] = (cap, self.step, 1) if seen is None else (0.5 * (seen[0] + cap), self.step, seen[2] + 1)

    def settled(self, name: str) -> dict[int, float]:
        """Slot count -> capacity, for every point recorded (each one measured steady)."""
        return {k: v[0] for k, v in self.curves.get(name, {}).items()}

    def _measured_often(self, name: str, k: int) -> bool:
        """``k`` measured ``now_measurements`` times: the count an operator runs at is measured again
        every window, so it is compared only once its figure is steadier."""
        return self.curves.get(name, {}).get(k, (0.0, 0, 0))[2] >= self.now_measurements

    def limit(self, name: str) -> int | None:
        """The slots ``k`` of ``name`` from which the next larger count measured did not pay (the
        first such step up; None: no such evidence)."""
        curve = self.settled(name)

        def did_not_pay(k: int, k2: int) -> bool:
            if self._measured_often(name, k2):
                return curve[k2] < curve[k] * (1.0 + self.share_of_linear_gain * (k2 / k - 1.0))
            return curve[k2] < curve[k] * (1.0 - self.drop)  # fewer measurements: only a clear drop counts

        ks = sorted(curve)
        for k, k2 in zip(ks, ks[1:]):  # measured counts in order: the first step up that did not pay
            if did_not_pay(k, k2):
                return k
        return None

    def better(self, name: str, now: int, margin: float) -> int | None:
        """The slot count that measured the most capacity, if it beat the capacity at ``now`` by more
        than ``margin`` (None otherwise, or while ``now`` is not measured)."""
        if not self._measured_often(name, now):
            return None
        curve = self.settled(name)
        best = max(curve, key=curve.get)
        return best if curve[best] > curve[now] * (1.0 + margin) else None

    def probe_fewer(self, name: str, now: int, share: float = 0.7) -> int | None:
        """Where more slots than ``now`` measured *less* capacity (its tasks slow each other down) and
        nothing between ``share * now`` and ``now`` is measured: that many slots, to find the peak."""
        if not self._measured_often(name, now):
            return None
        curve = self.settled(name)
        if not any(k2 > now and curve[k2] < curve[now] for k2 in curve):
            return None
        target = max(1, math.ceil(now * share))
        if target >= now or any(target <= k < now for k in curve):
            return None
        return target

    def describe(self, name: str) -> str:
        curve = self.settled(name)
        return ", ".join(f"{curve[k]:,.0f} at {k}" for k in sorted(curve))
