"""The synthetic benchmark pipelines' definitions (``tuner/sleep_pipelines.py``)."""

from __future__ import annotations

from pathlib import Path

from dlrm_platform.tuner.sleep_pipelines import expected_optimum, load_pipeline

PIPELINES = Path(__file__).resolve().parents[2] / "benchmarks" / "pipelines"


def test_a_shifted_pipeline_costs_its_shifted_operator_factor_times_more_per_row_and_needs_more_of_it():
    """per_task_overhead's sparse hash costs twice as much per row after its shift (what the live benchmark's
    control file applies); the model's optimum after the shift gives it more slots and delivers less, which
    is what a live recovery's level is put against."""
    pipe = load_pipeline(PIPELINES / "per_task_overhead.yaml")
    after = pipe.shifted()
    by_name = {o.name: o for o in pipe.operators}
    for o in after.operators:
        factor = pipe.shift.factor if o.name == pipe.shift.operator else 1.0
        assert o.ms_per_1k_rows == by_name[o.name].ms_per_1k_rows * factor
        assert o.ms_per_task == by_name[o.name].ms_per_task
    assert after.shift is None and after.shifted() is after
    (pre_alloc, pre), (post_alloc, post) = expected_optimum(pipe), expected_optimum(after)
    assert post < pre and post_alloc[pipe.shift.operator] > pre_alloc[pipe.shift.operator]
