"""The Plumber LP: maximise the slowest operator's rate under the CPU budget."""

from __future__ import annotations

import numpy as np

from dlrm_platform.tuner.observe import RawOp, RawSnapshot, observe
from dlrm_platform.tuner.plumber import analyse, solve_lp
from dlrm_platform.tuner.spec import OpSpec


def test_lp_allocates_in_proportion_to_cost():
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    # samples/s per slot: b is 8x as expensive as a, c 4x
    per_slot = {"a": 800.0, "b": 100.0, "c": 200.0}
    sol = solve_lp(specs, per_slot, 13.0)
    assert sum(sol.allocation.values()) == 13
    assert sol.allocation == {"a": 1, "b": 8, "c": 4}
    assert np.isclose(sol.predicted_throughput, 13 / (1 / 800 + 1 / 100 + 1 / 200))
    assert sol.predicted_integer_throughput == 800.0


def test_lp_respects_cpu_sizes_and_minimums():
    specs = [OpSpec("a", 2.0), OpSpec("b", 0.5, min_slots=2)]
    sol = solve_lp(specs, {"a": 100.0, "b": 1000.0}, 10.0)
    a, b = sol.allocation["a"], sol.allocation["b"]
    assert 2 * a + 0.5 * b <= 10.0 and b >= 2 and a >= 1
    assert a == 4  # a is the expensive one: it gets most of the budget


def _snap(t, rows_out, slot_s, sink, ratios=None):
    ratios = ratios or {}
    return RawSnapshot(t, {n: RawOp(rows_in=rows_out[n] / ratios.get(n, 1.0), rows_out=rows_out[n],
                                    slot_seconds=slot_s[n], running=1, queue_blocks=3)
                           for n in rows_out}, sink)


def test_report_names_the_bottleneck_and_recommends():
    specs = [OpSpec("read", 1.0), OpSpec("parse", 1.0), OpSpec("dedup", 1.0)]
    alloc = {"read": 2, "parse": 2, "dedup": 2}
    # over 10 s: parse is busy all the time (the bottleneck); read and dedup idle half of it.
    prev = _snap(0.0, {"read": 0, "parse": 0, "dedup": 0}, {"read": 0, "parse": 0, "dedup": 0}, 0)
    cur = _snap(10.0, {"read": 10000, "parse": 10000, "dedup": 9000}, {"read": 5, "parse": 20, "dedup": 4},
                9000, ratios={"dedup": 0.9})
    obs = observe(prev, cur, alloc, {s.name: 1.0 for s in specs}, 6.0)
    assert obs.bottleneck() == "parse"
    assert np.isclose(obs.throughput, 900.0)
    rep = analyse(obs, specs, 6.0)
    assert rep.bottleneck == "parse" and "busy" in rep.bottleneck_reason
    assert rep.recommended_allocation["parse"] > 2
    assert rep.predicted_max_throughput > obs.throughput
    text = rep.render()
    assert "bottleneck: parse" in text and "recommended allocation" in text
    by = {o.name: o for o in rep.operators}
    # rate per core in samples/s: read 2000 rows/slot-s * 0.9 = 1800; parse 500 * 0.9 = 450
    assert np.isclose(by["read"].rate_per_core, 1800.0) and np.isclose(by["parse"].rate_per_core, 450.0)
