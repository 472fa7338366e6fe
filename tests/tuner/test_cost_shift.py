"""Cost shifts from the workers' own time per row (``tuner/cost_shift.py``) and what the observer and the
policies' memories do with one."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm_platform.tuner.cost_shift import CostShiftDetector
from dlrm_platform.tuner.observe import RawOp, RawSnapshot, WindowedObserver
from dlrm_platform.tuner.scaling import HeldLimit, ScalingMemory


class _Worker:
    """Cumulative counters of one operator that finishes ``blocks`` blocks of 8,000 rows a second, each
    ``cost`` seconds per row times a jitter."""

    def __init__(self) -> None:
        self.rows = 0.0
        self.busy = 0.0

    def advance(self, blocks: int, cost: float, jitter: float = 1.0) -> RawOp:
        self.rows += 8000.0 * blocks
        self.busy += 8000.0 * blocks * cost * jitter
        return RawOp(rows_out=self.rows, busy_seconds=self.busy)


def _run(det: CostShiftDetector, costs: list[float], jitters: list[float] | None = None, blocks: list[int] | None = None):
    w = _Worker()
    shifts = []
    for t, cost in enumerate(costs):
        op = w.advance(blocks[t] if blocks else 1, cost, jitters[t] if jitters else 1.0)
        shifts += [(t, s) for s in det.push(RawSnapshot(float(t), {"hash": op}, 0.0))]
    return shifts


@pytest.mark.parametrize("rise, called_at", [(1.5, 31), (2.0, 30)])
def test_a_rise_in_cost_per_row_is_a_shift_after_two_readings_or_one_far_off(rise, called_at):
    # 1.5x: past the 30% tolerance, read twice before it is called; 2x: more than twice the bar, at once
    rng = np.random.default_rng(0)
    costs = [400e-6] * 30 + [400e-6 * rise] * 10
    jit = list(np.exp(rng.normal(0, 0.02, len(costs))))
    shifts = _run(CostShiftDetector(tolerance=0.3, confirm=2, at_once=2.0), costs, jit)
    assert len(shifts) == 1, shifts
    t, s = shifts[0]
    assert t == called_at
    assert s.name == "hash" and s.ratio == pytest.approx(rise, rel=0.05)
    assert s.since == 29.0  # the snapshot before the first reading at the new cost


def test_one_stray_block_and_gaps_without_output_are_no_shift():
    costs = [400e-6] * 40
    costs[20] = 600e-6  # one slow block (a worker descheduled for a while)
    blocks = [1] * 40
    blocks[10:14] = [0, 0, 0, 0]  # nothing finished for 4 s: nothing read
    assert _run(CostShiftDetector(), costs, blocks=blocks) == []


def test_an_operator_whose_cost_per_row_swings_with_its_concurrency_is_never_called_shifted():
    # a contended lookup: 1 + 0.04 n (n - 1) at 4-10 concurrent calls, 1.5x-4.6x its base cost
    rng = np.random.default_rng(1)
    costs = [400e-6 * (1 + 0.04 * n * (n - 1)) for n in rng.integers(4, 11, 200)]
    assert _run(CostShiftDetector(), costs) == []


def test_a_cost_that_falls_is_a_shift_too_and_the_new_level_is_the_typical_cost_after_it():
    det = CostShiftDetector()
    shifts = _run(det, [800e-6] * 20 + [400e-6] * 20)
    assert [round(s.ratio, 2) for _, s in shifts] == [0.5]
    assert det.cost_per_row("hash") == pytest.approx(400e-6)


def test_reset_forgets_the_typical_cost_so_a_new_block_size_is_no_shift():
    det = CostShiftDetector()
    w = _Worker()
    for t in range(20):
        det.push(RawSnapshot(float(t), {"hash": w.advance(1, 400e-6)}, 0.0))
    det.reset()  # the blocks grew: a smaller share of per-task cost on each row
    found = []
    for t in range(20, 40):
        found += det.push(RawSnapshot(float(t), {"hash": w.advance(1, 250e-6)}, 0.0))
    assert found == [] and det.cost_per_row("hash") == pytest.approx(250e-6)


def _observer_run(obs: WindowedObserver, costs: list[float]) -> list[dict]:
    """An operator at 4 slots, each busy all the time: rows per slot-second = 1 / cost."""
    rows = busy = 0.0
    extras = []
    for t, cost in enumerate(costs):
        rows += 4.0 / cost
        busy += 4.0
        obs.push(RawSnapshot(float(t), {"hash": RawOp(rows_out=rows, slot_seconds=4.0 * t, busy_seconds=busy)},
                             sink_rows=rows))
        o = obs.observation({"hash": 4}, {"hash": 1.0}, 8.0)
        if o is not None:
            extras.append({"t": t, "shifts": o.extra["cost_shifts"], "rate": o.op("hash").rate_per_slot})
    return extras


def test_the_observer_rescales_the_shifted_operators_rate_and_passes_the_shift_on_once():
    obs = WindowedObserver(window_s=3.0, op_window_s=6.0, cost_shifts=CostShiftDetector())
    seen = _observer_run(obs, [400e-6] * 20 + [800e-6] * 12)
    called = [e for e in seen if e["shifts"]]
    assert len(called) == 1 and called[0]["shifts"]["hash"] == pytest.approx(2.0)
    assert called[0]["t"] == 20  # the first reading at twice the cost: far enough off to be called at once
    # from the shift on, the remembered rate is the new cost's (1,250 rows per slot-second), not a
    # mean of the windows on either side of it
    assert seen[-1]["rate"] == pytest.approx(1250.0, rel=0.02)
    assert obs.rates["hash"] == pytest.approx(1250.0, rel=0.02)


def test_without_a_detector_the_observer_calls_no_shift():
    seen = _observer_run(WindowedObserver(window_s=3.0, op_window_s=6.0), [400e-6] * 20 + [800e-6] * 12)
    assert all(e["shifts"] == {} for e in seen)


def test_forget_drops_an_operators_curve_and_limit_and_keeps_its_noise():
    mem = ScalingMemory(["hash", "read"])
    mem.curves["hash"] = {6: (9000.0, 1, 3, None), 7: (9100.0, 2, 3, None)}
    mem.curves["read"] = {3: (20000.0, 1, 3, None)}
    mem.held["hash"] = HeldLimit(6, 7, 2, {6: (9000.0, None, 1), 7: (9100.0, None, 2)}, 3)
    mem.noise["hash"] = 0.1
    mem.forget("hash")
    assert mem.curves["hash"] == {} and "hash" not in mem.held and mem.limit("hash") is None
    assert mem.noise["hash"] == 0.1 and mem.curves["read"]  # the others stand


def test_an_operator_whose_cost_moves_with_its_slots_is_never_called_shifted_and_a_flat_one_is():
    """A contended lookup's cost per row rises with its slots (1 + 0.04 n (n - 1)), a hash's does not; both
    moved between 4 and 10 slots every 8 s, then held at 5, where the hash's cost doubles at 110 s and the
    lookup's at 114 s (both in one second would read as the machine, not their costs). The
    lookup's costs at two counts differ: its cost at a count follows how many of its calls are in flight,
    so it is never called shifted; the hash's doubled cost is a shift, told at once."""
    rng = np.random.default_rng(3)
    det = CostShiftDetector()
    lookup, hashing = _Worker(), _Worker()
    found = []
    for t in range(120):
        n = int([4, 7, 10, 6, 9, 5][(t // 8) % 6]) if t < 100 else 5
        jitter = float(np.exp(rng.normal(0, 0.03)))
        contended = 400e-6 * (1 + 0.04 * n * (n - 1)) * (2.0 if t >= 114 else 1.0)
        snap = RawSnapshot(float(t), {"lookup": lookup.advance(1, contended * jitter),
                                      "hash": hashing.advance(1, 400e-6 * jitter * (2.0 if t >= 110 else 1.0))}, 0.0)
        found += [(t, s.name, s.ratio) for s in det.push(snap, {"lookup": n, "hash": n})]
    assert [(t, name) for t, name, _ in found] == [(110, "hash")], found
    assert found[0][2] == pytest.approx(2.0, rel=0.1)
    assert det.count_dependent == {"lookup"}


def test_every_operator_slower_at_once_is_the_machine_not_a_shift():
    det = CostShiftDetector()
    a, b, c = _Worker(), _Worker(), _Worker()
    found = []
    for t in range(40):
        hiccup = 1.9 if t in (20, 21) else 1.0  # two seconds of a loaded CPU: every operator's tasks slower
        found += det.push(RawSnapshot(float(t), {"read": a.advance(1, 100e-6 * hiccup),
                                                 "hash": b.advance(1, 400e-6 * hiccup),
                                                 "pack": c.advance(1, 60e-6 * (2.0 if t >= 30 else 1.0))}, 0.0))
    assert [(s.name, round(s.ratio, 1)) for s in found] == [("pack", 2.0)]


def test_warm_up_readings_neither_set_the_level_nor_make_a_flat_operator_look_count_dependent():
    """Live (run 54's replay of run 53): a hash read 559 and 468 us per row while its workers warmed up at 4
    slots, then 404 us at 4 and at 7 slots; averaged in, the warm-up set its 4-slot level 13% high, marked it
    count-dependent, and its doubled cost at 7 slots was never judged. The median of the recent readings is
    the level: the hash is flat and the doubling is a shift."""
    det = CostShiftDetector()
    w = _Worker()
    costs = [559e-6, 559e-6, 468e-6] + [404e-6] * 3 + [404e-6] * 16 + [808e-6] * 3  # the first push reads nothing
    counts = [4] * 6 + [7] * 19
    found = []
    for t, (cost, n) in enumerate(zip(costs, counts)):
        found += [(t, s) for s in det.push(RawSnapshot(float(t), {"hash": w.advance(1, cost)}, 0.0), {"hash": n})]
    assert det.flat == {"hash"} and not det.count_dependent
    assert [(t, round(s.ratio, 1)) for t, s in found] == [(22, 2.0)]


def test_a_flat_operators_shift_is_told_at_a_count_it_has_just_moved_to():
    """Live, wide_skewed's hash doubled 3 s before it was grown from 7 to 11 slots: with costs compared at
    one count only, 11 had no level yet and the doubled cost became its level. A flat operator's readings at
    any count are judged against its cost at every count."""
    det = CostShiftDetector()
    w = _Worker()
    found = []
    for t in range(40):
        n = 3 if t < 12 else 7 if t < 30 else 11
        cost = 1000e-6 * (2.0 if t >= 30 else 1.0)  # its first reading at 11 slots, in the quiet after the move
        found += [(t, s.ratio) for s in det.push(RawSnapshot(float(t), {"hash": w.advance(1, cost)}, 0.0),
                                                 {"hash": n})]
    assert [(t, round(r, 1)) for t, r in found] == [(30, 2.0)]


def test_another_operator_slower_by_half_the_tolerance_backs_a_one_reading_stray_up_as_the_machine():
    """Live, contended_lookup's pack read 1.79x its cost for one second as its read read 1.22x (both back the
    next second): without the read, the pack's reading was far enough off to be called a shift at once."""
    det = CostShiftDetector()
    read, pack = _Worker(), _Worker()
    found = []
    for t in range(30):
        found += det.push(RawSnapshot(float(t), {"read": read.advance(1, 100e-6 * (1.22 if t == 20 else 1.0)),
                                                 "pack": pack.advance(1, 60e-6 * (1.79 if t == 20 else 1.0))}, 0.0))
    assert found == []
    # the same stray with the read at its cost is a shift at once
    det, read, pack = CostShiftDetector(), _Worker(), _Worker()
    found = []
    for t in range(22):
        found += det.push(RawSnapshot(float(t), {"read": read.advance(1, 100e-6),
                                                 "pack": pack.advance(1, 60e-6 * (1.79 if t >= 20 else 1.0))}, 0.0))
    assert [(s.name, round(s.ratio, 2)) for s in found] == [("pack", 1.79)]


def test_an_operator_not_yet_known_flat_backs_the_machine_up_too():
    """Live, a hiccup read wide_skewed's read 2.4x its cost and four other operators 1.9-5x, none of them yet
    measured at two slot counts: the read alone was judged, and its stray was called a shift (and one back a
    second later). Every operator with a level counts toward the machine."""
    det = CostShiftDetector()
    read, decode = _Worker(), _Worker()
    found = []
    for t in range(40):
        hiccup = 2.0 if t == 30 else 1.0
        snap = RawSnapshot(float(t), {"read": read.advance(1, 50e-6 * (2.36 if t == 30 else 1.0)),
                                      "decode": decode.advance(1, 300e-6 * hiccup)}, 0.0)
        found += det.push(snap, {"read": 2 if t < 15 else 3, "decode": 4})  # decode never moved: not known flat
    assert det.flat == {"read"} and "decode" not in det.flat
    assert found == []


def test_flat_where_measured_is_no_promise_at_a_count_not_measured_yet():
    """Live (run 54's steady suite): the contended lookup read one cost at 4 and 6 slots (its calls in flight,
    which upstream held alike, set it), then 1.57x at 7, was called shifted, and the credit grew it to 16.
    At a count whose cost is not known yet only a jump big enough to be a shift at once counts: the lookup's
    1.57x at 7 slots is its cost there (it is count-dependent once 7 has readings of its own), while the same
    rise at 6 slots, where its cost is known, is a shift."""

    def run(new_count: int) -> tuple[list, CostShiftDetector]:
        det, w, found = CostShiftDetector(), _Worker(), []
        for t in range(60):
            n = 4 if t < 15 else 6 if t < 35 else new_count
            cost = 560e-6 * (1.57 if t >= 35 else 1.0)
            found += [(t, round(s.ratio, 2)) for s in det.push(RawSnapshot(float(t), {"lookup": w.advance(1, cost)}, 0.0),
                                                               {"lookup": n})]
        return found, det

    found, det = run(7)
    assert found == []
    assert det.count_dependent == {"lookup"}
    found, det = run(6)
    assert found == [(36, 1.57)]
    assert det.flat == {"lookup"}
    # a shift that is a jump at once is told at a count not measured yet, too
    det, w, found = CostShiftDetector(), _Worker(), []
    for t in range(40):
        n = 4 if t < 15 else 6 if t < 35 else 7
        found += [(t, round(s.ratio, 1)) for s in det.push(
            RawSnapshot(float(t), {"hash": w.advance(1, 400e-6 * (2.0 if t >= 35 else 1.0))}, 0.0), {"hash": n})]
    assert found == [(35, 2.0)]


def test_an_operator_measured_at_one_count_only_is_called_shifted_on_two_readings_far_past_its_noise():
    """Live (run 54b), wide_skewed's hash sat at 7 slots all run: never measured at two counts, its doubled
    cost was never judged. At the one count it is known at, two readings in a row each far enough off to be
    a shift at once are one; a cheap operator's CPU hiccup (1.4x, 2.4x, 1.6x for a second each, as
    contended_lookup's pack read live) is not."""
    det, hashing, pack, found = CostShiftDetector(), _Worker(), _Worker(), []
    hiccup = {20: 1.37, 21: 2.41, 22: 1.62, 23: 1.19}
    for t in range(40):
        snap = RawSnapshot(float(t), {"hash": hashing.advance(1, 1020e-6 * (2.0 if t >= 30 else 1.0)),
                                      "pack": pack.advance(1, 63e-6 * hiccup.get(t, 1.0))}, 0.0)
        found += [(t, s.name, round(s.ratio, 1)) for s in det.push(snap, {"hash": 7, "pack": 2})]
    assert not det.flat and not det.count_dependent
    assert found == [(31, "hash", 2.0)]


def test_a_run_begun_at_the_one_count_an_operator_is_known_at_goes_on_at_the_count_a_move_took_it_to():
    """Live (run 57b), dlrm_preprocessing's truncate_history, known at 3 slots only, read 1.92x its cost
    there; a second later the policy grew it to 5 (it had become the bottleneck) and its next reading, at 5
    slots, read 1.89x: the run was dropped with the move and the shift was never told. A run begun at a
    known count goes on at the count a move took it to, judged as it began; a single reading at the new
    count, or one at another level, is no shift."""

    def run(costs_after: list[float], moved: int = 5) -> list:
        det, w, found = CostShiftDetector(), _Worker(), []
        for t in range(30 + len(costs_after)):
            n = 3 if t <= 30 else moved  # moved right after the first stray reading
            cost = 175e-6 * (costs_after[t - 30] if t >= 30 else 1.0)
            found += [(t, round(s.ratio, 1)) for s in det.push(
                RawSnapshot(float(t), {"truncate": w.advance(1, cost)}, 0.0), {"truncate": n})]
        return found

    assert run([1.92, 1.89, 1.9, 1.9]) == [(31, 1.9)]
    assert run([1.92, 1.0, 1.0, 1.0]) == []  # back at its cost at 5: one stray reading
    assert run([1.0, 1.92, 1.0, 1.0]) == []  # its first stray at a count not known yet: not far enough at once
    # not the same new level: no run to go on, and nothing known at 6 or within two slots of it
    assert run([1.92, 3.0, 3.0, 3.0], moved=6) == []
    assert run([1.92, 3.0, 3.0, 3.0]) == [(32, 3.0)]  # at 5, two slots from 3: a new run, at once twice


def test_the_first_reading_after_a_move_is_judged_at_the_count_its_blocks_were_begun_at():
    """Live (runs 60-61), per_task_overhead's hash, known at 6 slots only, was grown to 8 as its cost doubled
    and before a block at the new cost had finished (8,000 rows, 6 s a block): every reading at 2x came at 8,
    a count not known yet, and the shift was never told. The first reading after a move is of blocks begun
    before it, so it is judged at the count before, too, and a second reading at the new level tells the
    shift. A contended table moved 7 -> 11 first reads near its old cost and then climbs (live: 1.07x, then
    1.5x, 1.6x, 2.1x, 1.9x): no shift. Where a block finished in the first interval after the move (short
    blocks), or the first reading comes only after the quiet after the move, its blocks may have begun since:
    not judged so. (Moved 6 -> 9 here: within two slots of the count it is known at, a count is judged as
    that one anyway.)"""

    def run(after: list[float], known: int, moved: int, gap: int = 1) -> list:
        det, w, found = CostShiftDetector(), _Worker(), []
        for t in range(30 + gap + len(after)):
            blocks = 0 if 30 <= t < 30 + gap else 1  # nothing finished in the seconds after the move
            cost = 400e-6 * (after[t - 30 - gap] if t >= 30 + gap else 1.0)
            found += [(t, round(s.ratio, 1)) for s in det.push(
                RawSnapshot(float(t), {"op": w.advance(blocks, cost)}, 0.0), {"op": known if t < 30 else moved})]
        assert not det.flat and not det.count_dependent
        return found

    assert run([2.0, 2.0, 2.0], known=6, moved=9, gap=2) == [(33, 2.0)]
    assert run([1.07, 1.5, 1.6, 2.1, 1.9, 2.0, 2.0], known=7, moved=11) == []
    assert run([2.0, 2.0, 2.0], known=6, moved=9, gap=7) == []
    assert run([2.0, 2.0, 2.0], known=6, moved=9, gap=0) == []


def test_a_count_within_two_slots_of_the_one_count_known_is_judged_as_that_one():
    """Live (runs 61a, 61d), wide_skewed's hash, known at 8 slots only, was grown to 9 (and to 10) as its cost
    doubled, with a block finishing in the first second after the move: every 2x reading came at a count not
    known yet, and the shift was never told. A count a slot or two from the one known is judged as that one:
    two readings at 2x are the shift. A contended table's cost climbs with its calls in flight, 1.4x two
    slots past its count (1 + 0.028 n (n - 1), its peak near 6): no shift; nor 2x four slots past it."""

    def run(cost_at, moved: int) -> list:
        det, w, found = CostShiftDetector(), _Worker(), []
        for t in range(40):
            n = 8 if t < 30 else moved
            cost = cost_at(n, t)
            found += [(t, round(s.ratio, 1)) for s in det.push(
                RawSnapshot(float(t), {"op": w.advance(1, cost)}, 0.0), {"op": n})]
        assert not det.flat and not det.count_dependent  # known at 8 only
        return found

    assert run(lambda n, t: 1008e-6 * (2.0 if t >= 30 else 1.0), moved=9) == [(31, 2.0)]
    assert run(lambda n, t: 1008e-6 * (2.0 if t >= 30 else 1.0), moved=10) == [(31, 2.0)]
    assert run(lambda n, t: 1008e-6 * (2.0 if t >= 30 else 1.0), moved=11) == []  # three slots: not known
    assert run(lambda n, t: 1008e-6 * (2.0 if t >= 30 else 1.0), moved=7) == [(31, 2.0)]
    assert run(lambda n, t: 400e-6 * (1 + 0.028 * n * (n - 1)), moved=10) == []  # 1.37x
    assert run(lambda n, t: 400e-6 * (1 + 0.028 * n * (n - 1)), moved=12) == []  # 2.0x, four slots past


def test_one_cost_read_at_several_counts_between_moves_is_known_though_no_count_settled():
    """Live (run 61c), wide_skewed's hash moved among 6-9 slots every 1-5 s, so no count had settled readings
    of its own (each move starts a quiet), and it read 1,003-1,020 us per row at all of them: its doubled
    cost was never judged. Readings that agree within ``flat_spread`` at two counts or more are one known
    cost: a jump at once, read twice, is its shift. A contended lookup moved as often reads a cost per count
    (1 + 0.04 n (n - 1)): its readings spread wide, and its jumps with its moves are no shift."""
    rng = np.random.default_rng(5)

    def run(cost_at, shift: bool = True) -> list:
        det, w, found = CostShiftDetector(), _Worker(), []
        for t in range(45):
            n = [6, 6, 7, 7, 7, 8, 8, 9, 9, 9][t % 10] if t < 40 else 7  # a move every 2-3 s
            cost = cost_at(n) * float(np.exp(rng.normal(0, 0.004))) * (2.0 if shift and t >= 40 else 1.0)
            found += [(t, round(s.ratio, 1)) for s in det.push(
                RawSnapshot(float(t), {"op": w.advance(1, cost)}, 0.0), {"op": n})]
        assert not det.flat and not det.count_dependent  # no count ever settled
        return found

    assert run(lambda n: 1008e-6) == [(41, 2.0)]
    assert run(lambda n: 1008e-6, shift=False) == []
    assert run(lambda n: 400e-6 * (1 + 0.04 * n * (n - 1)), shift=False) == []


@pytest.mark.parametrize("climb_s, told", [(8.0, [(50, 2.0)]), (0.0, [])])
def test_readings_on_the_climb_after_a_restart_set_no_cost_at_a_count(climb_s, told):
    """Live (run 56), dlrm_preprocessing's truncate_history read 191-279 us per row at 4 slots in the seconds
    after the warm-up (the pipeline still climbing, its workers sharing the CPUs with its start) and 166 us at
    3 later: its costs at two counts differed, it was count-dependent and its doubled cost at 3 was never
    judged. The first ``climb_s`` seconds after a restart count toward no cost at a count."""
    det, w, found = CostShiftDetector(climb_s=climb_s), _Worker(), []
    climb = [1.3, 1.6, 1.7, 1.15, 1.0, 1.15, 1.1, 1.2]  # t = 6..13, at 4 slots
    for t in range(55):
        if t < 6:
            det.restart()  # the warm-up: the observer restarts the detector at every snapshot
        n = 4 if t < 14 else 3
        cost = 166e-6 * (climb[t - 6] if 6 <= t < 14 else 2.0 if t >= 49 else 1.0)
        found += [(t, round(s.ratio, 1)) for s in det.push(RawSnapshot(float(t), {"truncate": w.advance(1, cost)}, 0.0),
                                                           {"truncate": n})]
    assert found == told
    assert ("truncate" in det.count_dependent) == (climb_s == 0.0)
