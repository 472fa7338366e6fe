"""The Plumber LP: maximise the slowest operator's rate under the CPU budget."""

from __future__ import annotations

import numpy as np
import pytest

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


@pytest.mark.parametrize(("num_cpus", "min_slots", "max_slots", "budget"),
                         [(0.5, 1, None, 1.0), (1.0, 1, None, 3.5), (1.0, 2, 3, 8.0), (2.0, 1, None, 1.0)])
def test_one_operator_needs_no_solver_and_agrees_with_it(num_cpus, min_slots, max_slots, budget):
    from dlrm_platform.tuner import plumber

    spec = [OpSpec("fused", num_cpus, min_slots=min_slots, max_slots=max_slots)]
    direct = plumber.solve_lp(spec, {"fused": 1000.0}, budget)
    x = plumber._linprog(spec, np.array([1000.0]), np.array([num_cpus]), budget)
    solved = plumber.solve_lp(spec + [OpSpec("idle", 0.01, max_slots=1)], {"fused": 1000.0, "idle": 1e9},
                              budget + 0.01)
    assert direct.allocation["fused"] == solved.allocation["fused"]
    if x is not None:
        assert direct.continuous["fused"] == pytest.approx(x[0]) and direct.predicted_throughput == pytest.approx(x[1])


def test_the_fused_pipelines_report_does_not_import_scipy():
    import subprocess
    import sys

    code = ("import sys\n"
            "from dlrm_platform.tuner.plumber import solve_lp\n"
            "from dlrm_platform.tuner.spec import OpSpec\n"
            "solve_lp([OpSpec('fused', 0.5)], {'fused': 1e5}, 1.0)\n"
            "assert 'scipy.optimize' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
