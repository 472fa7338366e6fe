"""Rows per block as the tuner's second knob (tuner/block_size.py), in the simulator and alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlrm_platform.tuner.block_size import BlockSizer, Drain, OpTaskTimes, fill_seconds
from dlrm_platform.tuner.controller import Controller
from dlrm_platform.tuner.observe import Observation, OpObs, RawOp, RawSnapshot
from dlrm_platform.tuner.simulator import SimOp, SimPipeline, run_controller_in_sim
from dlrm_platform.tuner.sleep_pipelines import _make_op_fn, SyntheticOperator
from dlrm_platform.tuner.spec import BlockRowsSpec, TunerSpec

SIZES = [250, 500, 1000, 2000, 4000]


def overhead_pipeline(mem_limit: float = 2e9) -> SimPipeline:
    """Four operators whose tasks each pay 0.12-0.15 s whatever their rows; 250-row blocks."""
    ops = [SimOp("read", 4000, task_s=0.15, sat=8), SimOp("parse", 3000, task_s=0.12),
           SimOp("hash", 2000, task_s=0.12), SimOp("pack", 6000, task_s=0.12, ratio=0.9)]
    return SimPipeline(ops=ops, budget=24, block_rows=250, row_bytes=256, mem_limit=mem_limit, lumpy=True,
                       inflight_memory=True)


def spec_for(pipe: SimPipeline, policy: str, tmp_path, **options) -> TunerSpec:
    return TunerSpec(tuner_id=f"t-{policy}", policy=policy, cpu_budget=pipe.budget,
                     ops=pipe.specs({n: 4 for n in pipe.names}), options=dict(options),
                     block_rows=BlockRowsSpec(initial=int(pipe.block_rows), max_rows=SIZES[-1],
                                              control_file=str(tmp_path / f"{policy}-rows.json")))


def steady(trace: list[dict], n: int = 60) -> float:
    return float(np.mean([x["throughput"] for x in trace[-n:]]))


def test_task_time_fit_separates_the_fixed_cost_from_the_per_row_cost():
    times = OpTaskTimes()
    for rows in (500, 1000, 2000):
        for tasks in (0.0, 3.0, 1.0):  # intervals in which no task, three and one finished
            times.add(rows, tasks * (0.2 + rows * 1e-4), tasks)
    fixed, per_row = times.fit()
    assert fixed == pytest.approx(0.2)
    assert per_row == pytest.approx(1e-4)
    one = OpTaskTimes(ray_fixed=0.05)
    one.add(1000, 0.9, 3.0)
    assert one.fit() == pytest.approx((0.05, 0.25 / 1000))  # one size: only Ray's share is known fixed
    few = OpTaskTimes()
    few.add(1000, 0.3, 1.0)
    assert few.fit() is None  # one task is not a measurement


@pytest.mark.parametrize("policy", ["rl", "auto"])
def test_policy_grows_the_blocks_while_the_fixed_cost_pays(policy, tmp_path):
    pipe = overhead_pipeline()
    trace = run_controller_in_sim(pipe, spec_for(pipe, policy, tmp_path), steps=220, seed=1)
    _, best_rows, best = overhead_pipeline().optimum_over_block_rows(SIZES)
    assert trace[-1]["block_rows"] >= 2000, [x["block_rows"] for x in trace[::10]]
    assert steady(trace) >= 0.95 * best
    # the same policy with the blocks fixed at 250 rows (what plumber and ray_default have)
    fixed = overhead_pipeline()
    no_knob = TunerSpec(tuner_id="fixed", policy=policy, cpu_budget=24, ops=fixed.specs({n: 4 for n in fixed.names}))
    assert steady(trace) > 1.5 * steady(run_controller_in_sim(fixed, no_knob, steps=220, seed=1))
    # the controller told the pipeline: the control file holds the size in force
    assert json.loads((tmp_path / f"{policy}-rows.json").read_text()) == {"block_rows": trace[-1]["block_rows"]}


def test_blocks_stay_within_the_object_store(tmp_path):
    # 24 slots x 2 blocks x 256 B/row within half of 15 MB: blocks of at most ~610 rows
    pipe = overhead_pipeline(mem_limit=15e6)
    trace = run_controller_in_sim(pipe, spec_for(pipe, "rl", tmp_path), steps=200, seed=2)
    assert max(x["block_rows"] for x in trace) == 500


def _obs(t: float, throughput: float, since_change: float) -> Observation:
    op = OpObs(name="a", slots=4, cpus_per_slot=1.0, out_rate=throughput, rate_per_slot=throughput / 4,
               element_ratio=1.0, running=4.0, util=1.0, backpressure=0.0, queue_blocks=2.0, queue_bytes=2e5,
               capacity=throughput)
    return Observation(t=t, window_s=1.0, ops=[op], throughput=throughput, mem_used=1e6, mem_limit=1e9,
                       spill_rate=0.0, budget=4.0, since_change_s=since_change, extra={"sink_factors": [1.0]})


def test_a_step_that_delivers_less_is_undone_and_not_retried_soon(tmp_path):
    sizer = BlockSizer(BlockRowsSpec(initial=500, control_file=str(tmp_path / "r.json")),
                       {"block_settle_s": 2, "block_measure_s": 4, "block_ban_s": 60})
    t, step = 0.0, None
    while step is None:  # steady at 500 rows: the first step is a probe, to the largest size (16x)
        t += 1
        step = sizer.decide(_obs(t, 1000.0, t), {"a": 4})
    assert step[0] == 8000 and "probing" in step[1]["text"] and sizer.judging
    undone = None
    while undone is None and t < 60:  # 8000-row blocks deliver 20% less
        t += 1
        undone = sizer.decide(_obs(t, 800.0, t), {"a": 4})
    assert undone is not None and undone[0] == 500 and "undone" in undone[1]["text"]
    later = [sizer.decide(_obs(t + k, 1000.0, t + k), {"a": 4}) for k in range(1, 40)]
    assert all(x is None or x[0] < 8000 for x in later)  # 8000 is banned for 60 s


def test_oracle_measures_block_sizes_and_beats_every_given_configuration(tmp_path):
    pipe = overhead_pipeline()
    other = {"allocation": {"read": 4, "parse": 4, "hash": 4, "pack": 4}, "block_rows": 1000}
    spec = spec_for(pipe, "oracle", tmp_path, oracle_max_measured=3, oracle_settle_s=2, oracle_measure_s=4,
                    oracle_finalists=2, oracle_final_measure_s=6, oracle_extra_candidates=[other])
    trace = run_controller_in_sim(pipe, spec, steps=260, seed=1)
    _, _, best = overhead_pipeline().optimum_over_block_rows(SIZES)
    assert trace[-1]["block_rows"] == 4000
    assert "done" in trace[-1]["policy_state"]
    assert steady(trace) >= 0.95 * best
    other_pipe = overhead_pipeline()
    other_pipe.block_rows = 1000
    assert steady(trace) > other_pipe.throughput(other["allocation"])


def test_controller_records_the_block_size_move_with_its_bottleneck(tmp_path):
    pipe = overhead_pipeline()
    spec = spec_for(pipe, "rl", tmp_path)
    run = run_controller_in_sim(pipe, spec, steps=80, seed=1)
    assert any(x["block_rows"] != 250 for x in run)
    ctl = Controller(spec_for(overhead_pipeline(), "rl", tmp_path))
    ctl.start_epoch()
    ctl.tick(RawSnapshot(0.0, {n: RawOp() for n in pipe.names}, 0.0, 0.0, 2e9), 24)
    ctl.set_block_rows(1000, 1.0)
    assert json.loads((tmp_path / "rl-rows.json").read_text()) == {"block_rows": 1000}
    ctl.set_block_rows(10**6, 2.0)  # clamped to the spec's largest size
    assert ctl.block_rows == SIZES[-1]


def test_sleep_pipeline_read_takes_the_block_size_as_each_task_starts(tmp_path):
    control = tmp_path / "rows.json"
    op = SyntheticOperator(name="read", ms_per_1k_rows=0.001, ms_per_task=1.0)
    fn = _make_op_fn(op, rows_per_block=100, row_floats=2, control_file=None, storage_name=None, first=True,
                     block_rows_file=str(control))
    assert len(fn({"id": np.array([0])})["id"]) == 100  # no control yet: the YAML's size
    control.write_text(json.dumps({"block_rows": 400}))
    assert len(fn({"id": np.array([1])})["id"]) == 400


def test_block_rows_spec_and_pipeline_refuse_an_initial_size_outside_their_bounds(tmp_path):
    from pydantic import ValidationError

    from dlrm_platform.tuner.sleep_pipelines import PipelineDef

    with pytest.raises(ValidationError, match="block_rows.initial 1000 is outside"):
        BlockRowsSpec(initial=1000, control_file=str(tmp_path / "r.json"), max_rows=800)
    with pytest.raises(ValidationError, match="max_rows_per_block 100 < rows_per_block 500"):
        PipelineDef(name="p", rows_per_block=500, max_rows_per_block=100,
                    operators=[{"name": "read", "ms_per_1k_rows": 10}])


def test_the_suites_per_task_overhead_pipeline_is_resizable_and_its_optimum_needs_larger_blocks():
    from pathlib import Path

    from dlrm_platform.tuner.simulator import from_profile
    from dlrm_platform.tuner.sleep_pipelines import block_row_sizes, expected_optimum, load_pipeline

    pipe = load_pipeline(Path(__file__).resolve().parents[2] / "benchmarks/pipelines/per_task_overhead.yaml")
    assert block_row_sizes(pipe) == [500, 1000, 2000, 4000, 8000]
    sim = from_profile(pipe.ground_truth())
    _, at_500 = sim.optimum()
    _, best = expected_optimum(pipe)
    assert best > 1.1 * at_500  # the YAML's own per-task costs alone, before Ray's are added live


def test_a_noisy_step_whose_answer_is_clear_is_kept_without_waiting_for_three_windows(tmp_path):
    """Large blocks reach the sink one every second or two, so a step's intervals swing widely; it is
    measured longer only while that noise leaves its answer open."""
    def probe_then(samples):
        sizer = BlockSizer(BlockRowsSpec(initial=500, control_file=str(tmp_path / "r.json")),
                           {"block_settle_s": 2, "block_measure_s": 4})
        t, step = 0.0, None
        while step is None:
            t += 1
            step = sizer.decide(_obs(t, 1000.0, t), {"a": 4})
        t0 = t
        while sizer.judging and t < t0 + 60:
            t += 1
            sizer.decide(_obs(t, samples[int(t) % len(samples)], t), {"a": 4})
        return sizer, t - t0

    clear, clear_s = probe_then([2000.0, 6000.0, 4000.0])  # 4,000 +- 1,150 against 1,000: kept at once
    assert clear.rows == 8000 and "kept" in clear.last_reason
    close, close_s = probe_then([300.0, 1800.0, 900.0])  # 1,000 +- 430: measured for three windows
    assert close.rows == 8000 and "kept" in close.last_reason
    assert clear_s < close_s


def test_the_sizers_drain_counts_the_new_blocks_latency_alongside_the_old_blocks_not_after_them():
    """Held samples come out while the first new block travels: the sizer measures once both are
    done; the oracle (stacked) waits for one after the other."""
    def done_after(overlapped: bool) -> float:
        drain = Drain(settle_s=2.0, overlapped=overlapped)
        at_change = _obs(0.0, 1000.0, 0.0)
        at_change.ops[0].tasks_now, at_change.ops[0].queue_blocks = 0.0, 0.0
        drain.start(at_change, 500, 8000, fits={"a": (0.5, 0.001)})  # 8.5 s per new task
        drain.left = 10_000.0  # ten seconds' worth of old blocks queued
        t = 0.0
        while drain.draining:
            t += 1.0
            drain.update(_obs(t, 1000.0, t))
        return t

    assert fill_seconds(_obs(0.0, 1000.0, 0.0), 500, 8000, fits={"a": (0.5, 0.001)}) == pytest.approx(8.5)
    assert done_after(overlapped=True) == pytest.approx(10.0)   # max(drained at 10 s, filled at 8.5 s)
    assert done_after(overlapped=False) == pytest.approx(19.0)  # drained at 10 s, then 8.5 s more


def test_the_drain_ends_when_the_sink_delivers_blocks_of_the_new_size():
    """Live, the sink's blocks are counted: once its rows per block pass the geometric middle of the
    old and the new size, the old blocks are out, whatever the held-samples count still says."""
    def obs_at(t: float, rows_per_block: float | None) -> Observation:
        o = _obs(t, 1000.0, t)
        o.extra["sink_rows_per_block"] = rows_per_block
        return o

    drain = Drain(settle_s=2.0, overlapped=True)
    drain.start(obs_at(0.0, 450.0), 500, 8000, fits={"a": (0.5, 0.005)})  # a 40 s fill by the fit
    drain.left = 1e9  # the count would never run out
    t, seen = 0.0, {1.0: 450.0, 2.0: 450.0, 3.0: 900.0, 4.0: 1500.0, 5.0: 2500.0, 6.0: 7200.0}
    while drain.draining and t < 29:
        t += 1.0
        drain.update(obs_at(t, seen.get(t, 7200.0)))
    assert t == 5.0  # 2,500 > 450 x 4 (the middle of 1x and 16x)
    shrink = Drain(settle_s=2.0, overlapped=True)
    shrink.start(obs_at(0.0, 7200.0), 8000, 500)
    shrink.left = 1e9
    assert not shrink.update(obs_at(2.0, 4000.0)) and shrink.update(obs_at(3.0, 1000.0))
