"""Observations (``tuner/observe.py``): each operator's rate per slot over the longest window at its slots."""

from __future__ import annotations

import pytest

from dlrm_platform.tuner.observe import RawOp, RawSnapshot, WindowedObserver


def _snap(t: float, lookup_rows: float, lookup_slot_s: float, read_rows: float) -> RawSnapshot:
    return RawSnapshot(t, {"read": RawOp(rows_out=read_rows, slot_seconds=2.0 * t),
                           "lookup": RawOp(rows_out=lookup_rows, slot_seconds=lookup_slot_s)}, sink_rows=lookup_rows)


def _lumpy_run(obs: WindowedObserver, until: int, start: int = 0, rows: float = 0.0):
    """4 lookup slots, each task 4 s for a 2,000-row block (500 rows per slot-second), finishing one
    block a second on average, lumpily: 1, 1, 2, then 0 blocks in consecutive seconds."""
    for t in range(start, until + 1):
        rows += 4000.0 if t % 4 == 3 else (0.0 if t % 4 == 0 else 2000.0) if t else 0.0
        obs.push(_snap(float(t), rows, 4.0 * t, 1000.0 * t))
    return rows


def test_a_long_task_operator_is_measured_over_its_whole_window_not_one_interval():
    alloc, cpus = {"read": 2, "lookup": 4}, {"read": 1.0, "lookup": 1.0}
    short = WindowedObserver(window_s=1.0, op_window_s=1.0)
    long = WindowedObserver(window_s=1.0, op_window_s=8.0)
    rates_short, rates_long = [], []
    rows = rows_long = 0.0
    for t in range(0, 16):
        rows = _lumpy_run(short, t, t, rows)
        rows_long = _lumpy_run(long, t, t, rows_long)
        if t >= 9:
            rates_short.append(short.observation(alloc, cpus, 6.0).op("lookup").rate_per_slot or 0.0)
            rates_long.append(long.observation(alloc, cpus, 6.0).op("lookup").rate_per_slot)
    assert max(rates_short) >= 2 * min(r for r in rates_short if r > 0)  # one interval: 0, 1 or 2 blocks
    assert all(r == pytest.approx(500.0, rel=0.05) for r in rates_long), rates_long


def test_a_move_of_another_operator_keeps_this_ones_window_and_its_own_move_restarts_it():
    alloc, cpus = {"read": 2, "lookup": 4}, {"read": 1.0, "lookup": 1.0}
    obs = WindowedObserver(window_s=2.0, settle_s=1.0, op_window_s=8.0)
    rows = _lumpy_run(obs, 10)
    obs.note_change(10.0, ["read"])
    rows = _lumpy_run(obs, 12, 11, rows)
    o = obs.observation(alloc, cpus, 6.0)
    assert o.op("lookup").rate_per_slot == pytest.approx(500.0, rel=0.05)  # 8 s back, across read's move
    obs.note_change(12.0, ["lookup"])
    # after its own move only the windows after it (and the settle time) count: 2 s here
    _lumpy_run(obs, 15, 13, rows)
    first = next(s for s in obs.snaps if s.t >= 13.0)
    assert first.t == 13.0
    rate = obs.observation(alloc, cpus, 6.0).op("lookup").rate_per_slot
    last = obs.snaps[-1].ops["lookup"]
    assert rate == pytest.approx((last.rows_out - first.ops["lookup"].rows_out)
                                 / (last.slot_seconds - first.ops["lookup"].slot_seconds))


def test_a_change_without_names_restarts_every_operators_window():
    obs = WindowedObserver(window_s=1.0, settle_s=1.0, op_window_s=8.0)
    _lumpy_run(obs, 11)
    obs.note_change(10.0)
    o = obs.observation({"read": 2, "lookup": 4}, {"read": 1.0, "lookup": 1.0}, 6.0)
    # 11 - (10 + 1) leaves no window longer than the interval's own: the lumpy interval's rate stands
    assert o.op("lookup").rate_per_slot == pytest.approx(4000.0 / 4.0)


def test_rates_before_the_sinks_first_output_are_not_measurements():
    """Start-up: the first tasks run on workers still starting and importing; until the sink delivers,
    no operator's rate is measured, and afterwards windows start no earlier than that first output."""
    obs = WindowedObserver(window_s=1.0, op_window_s=6.0)
    alloc, cpus = {"read": 2, "lookup": 4}, {"read": 1.0, "lookup": 1.0}
    for t in range(0, 4):  # read finishes slow start-up tasks, nothing reaches the sink yet
        obs.push(RawSnapshot(float(t), {"read": RawOp(rows_out=100.0 * t, slot_seconds=2.0 * t),
                                        "lookup": RawOp(rows_out=0.0, slot_seconds=4.0 * t)}, sink_rows=0.0))
        o = obs.observation(alloc, cpus, 6.0)
        assert o is None or all(op.rate_per_slot is None and not op.measured for op in o.ops)
    for t in range(4, 8):  # delivering: read at 1,000 rows per slot-second
        obs.push(RawSnapshot(float(t), {"read": RawOp(rows_out=300.0 + 2000.0 * (t - 3), slot_seconds=2.0 * t),
                                        "lookup": RawOp(rows_out=1000.0 * (t - 3), slot_seconds=4.0 * t)},
                             sink_rows=1000.0 * (t - 3)))
    o = obs.observation(alloc, cpus, 6.0)
    assert obs.delivered_t == 4.0
    assert o.op("read").measured and o.op("read").rate_per_slot == pytest.approx(1000.0)  # not the start-up's 50


def test_rates_in_the_warm_up_after_the_first_output_are_not_measurements():
    """``warmup_s``: workers still warm up after the sink's first output (live: contended_lookup's lookup
    read 2,046 samples/s at 4 slots 2 s after it, 5,600 later). Until then no rate is measured (the
    observation says it is warming up), and afterwards windows start no earlier than the warm-up's end."""
    obs = WindowedObserver(window_s=1.0, op_window_s=6.0, warmup_s=4.0)
    alloc, cpus = {"read": 2, "lookup": 4}, {"read": 1.0, "lookup": 1.0}
    rows = 0.0
    for t in range(0, 14):  # delivering from t=1; read at 200 rows per slot-second until t=5, then 1,000
        rows += 400.0 if t <= 5 else 2000.0
        obs.push(RawSnapshot(float(t), {"read": RawOp(rows_out=rows if t else 0.0, slot_seconds=2.0 * t),
                                        "lookup": RawOp(rows_out=rows if t else 0.0, slot_seconds=4.0 * t)},
                             sink_rows=rows if t else 0.0))
        o = obs.observation(alloc, cpus, 6.0)
        if o is not None and t < 5.0 + 1.0:  # the interval's window (1 s) still reaches into the warm-up
            assert o.warming_up and not any(op.measured for op in o.ops), t
            if t >= 2:  # a warm-up reading stands in (not measured) where nothing else is known
                assert o.op("read").rate_per_slot == pytest.approx(200.0), t
    assert obs.delivered_t == 1.0 and obs.measured_from() == 5.0 and not o.warming_up
    assert o.op("read").measured and o.op("read").rate_per_slot == pytest.approx(1000.0)  # not the warm-up's 200
    plain = WindowedObserver(window_s=1.0, op_window_s=6.0)  # warmup_s 0: the warm-up's rates blend in
    rows = 0.0
    for t in range(0, 8):
        rows += 400.0 if t <= 5 else 2000.0
        plain.push(RawSnapshot(float(t), {"read": RawOp(rows_out=rows if t else 0.0, slot_seconds=2.0 * t),
                                          "lookup": RawOp(rows_out=rows if t else 0.0, slot_seconds=4.0 * t)},
                               sink_rows=rows if t else 0.0))
    assert plain.observation(alloc, cpus, 6.0).op("read").rate_per_slot < 700.0


def test_an_operator_idle_since_the_warm_up_keeps_its_warm_up_reading():
    """A fast operator whose full output queue holds it back from the warm-up on runs no task after it,
    so no later window measures it: its warm-up reading stands in (not as a measurement), or a policy
    waiting for every operator's rate would wait for ever (a held-out simulated pipeline did: 0.12 of
    its optimum for 90 s)."""
    obs = WindowedObserver(window_s=1.0, op_window_s=6.0, warmup_s=4.0)
    alloc, cpus = {"read": 1, "parse": 2}, {"read": 1.0, "parse": 1.0}
    for t in range(0, 16):  # read works until t=3, then waits; parse works throughout
        read_rows = 3000.0 * min(t, 3)
        obs.push(RawSnapshot(float(t), {"read": RawOp(rows_out=read_rows, slot_seconds=float(min(t, 3))),
                                        "parse": RawOp(rows_out=500.0 * t, slot_seconds=2.0 * t)},
                             sink_rows=500.0 * t))
        o = obs.observation(alloc, cpus, 3.0)  # every interval, as the controller asks
    assert not o.warming_up and o.op("parse").measured
    assert not o.op("read").measured and o.op("read").rate_per_slot == pytest.approx(3000.0)


def test_with_a_share_window_the_rate_per_slot_follows_the_workers_time_not_the_blocks_that_finish():
    """13 slots, each task 6.4 s of worker time for an 8,000-row block, finishing 1 or 3 blocks in alternate
    seconds and now and then none: rows per occupied slot-second over a 6 s window swing with the count that
    finished inside it; rows per worker second times the workers' share of occupied time over 20 s do not."""
    alloc, cpus = {"read": 2, "hash": 13}, {"read": 1.0, "hash": 1.0}
    plain = WindowedObserver(window_s=1.0, op_window_s=6.0)
    by_cost = WindowedObserver(window_s=1.0, op_window_s=6.0, share_window_s=20.0)
    got = {"plain": [], "by_cost": []}
    rows = busy = 0.0
    for t in range(0, 40):
        done = (1 if t % 2 else 3) if t % 7 else 0  # lumpy: now and then nothing finishes for a second
        rows += 8000.0 * done
        busy += 6.4 * done
        snap = RawSnapshot(float(t), {"read": RawOp(rows_out=1000.0 * t, slot_seconds=2.0 * t, busy_seconds=1.9 * t),
                                      "hash": RawOp(rows_out=rows, slot_seconds=13.0 * t, busy_seconds=busy)},
                           sink_rows=rows)
        for name, obs in (("plain", plain), ("by_cost", by_cost)):
            obs.push(snap)
            if t >= 25:
                got[name].append(obs.observation(alloc, cpus, 15.0).op("hash").rate_per_slot)
    rows_per_occupied_s = rows / (13.0 * 39)
    spread = {n: (max(v) - min(v)) / rows_per_occupied_s for n, v in got.items()}
    assert spread["plain"] > 0.25, got["plain"]
    assert spread["by_cost"] < 0.1, got["by_cost"]
    assert sum(got["by_cost"]) / len(got["by_cost"]) == pytest.approx(rows_per_occupied_s, rel=0.1)


def test_right_after_a_move_the_rate_per_slot_uses_the_share_measured_before_and_no_lump_misleads_it():
    """4 slots, each block 1.6 s of worker time for 8,000 rows (5,000 rows per worker second; 90% of occupied
    time in the UDF). A second after the operator's move, 6 blocks begun before it finish at once: rows per
    occupied slot-second over that second read 12,000; by the workers' time and the share measured before,
    4,500."""
    alloc, cpus = {"cross": 4}, {"cross": 1.0}
    obs = WindowedObserver(window_s=1.0, op_window_s=6.0, settle_s=0.0, share_window_s=20.0)
    rows = busy = 0.0
    for t in range(0, 31):
        done = 6 if t == 30 else (2 if t % 4 else 3)
        rows += 8000.0 * done
        busy += 1.6 * done
        slot = 4.0 * t  # 4 slots busy: 2.25 blocks of 1.6 s a second, 90% of it in the UDF
        obs.push(RawSnapshot(float(t), {"cross": RawOp(rows_out=rows, slot_seconds=slot, busy_seconds=busy)},
                             sink_rows=rows))
        if t == 28:
            obs.observation(alloc, cpus, 8.0)
            obs.note_change(28.5, ["cross"])
    rate = obs.observation(alloc, cpus, 8.0).op("cross").rate_per_slot
    assert rate == pytest.approx(5000.0 * 0.9, rel=0.05)
    assert obs.busy_shares["cross"] == pytest.approx(0.9, rel=0.05)


def test_an_operator_whose_cost_moves_with_its_slots_keeps_rows_per_occupied_slot_second():
    """The share window's rate reads an operator whose cost per row moves with its slots (a contended table's)
    at the speed of the blocks begun before its last move: until its cost is measured the same at two counts,
    an operator keeps rows per occupied slot-second."""
    from dlrm_platform.tuner.cost_shift import CostShiftDetector

    alloc, cpus = {"lookup": 4}, {"lookup": 1.0}

    def rate(observer: WindowedObserver) -> float:
        rows = busy = 0.0
        for t in range(0, 20):
            done = [1, 0, 4, 0, 0][t % 5]  # lumpy: a 6 s window sees 4 or 8 blocks
            rows, busy = rows + 2000.0 * done, busy + 3.0 * done
            observer.push(RawSnapshot(float(t), {"lookup": RawOp(rows_out=rows, slot_seconds=4.0 * t,
                                                                 busy_seconds=busy)}, sink_rows=rows), alloc)
        return observer.observation(alloc, cpus, 8.0).op("lookup").rate_per_slot

    def with_detector(flat: bool) -> WindowedObserver:
        observer = WindowedObserver(window_s=1.0, op_window_s=6.0, settle_s=0.0, share_window_s=20.0,
                                    cost_shifts=CostShiftDetector())
        if flat:  # measured at one cost per row at two slot counts
            observer.cost_shifts.flat.add("lookup")
        return observer

    plain = rate(WindowedObserver(window_s=1.0, op_window_s=6.0, settle_s=0.0))
    assert rate(with_detector(True)) != pytest.approx(plain, rel=0.05)  # the share window's rate differs ...
    assert rate(with_detector(False)) == plain  # ... and is not taken until the cost is known not to move
