"""benchmarks/ingest.py: the paired ceiling measures what the pipeline's read tasks deliver, and its summary's
interval is the order statistics it claims."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from testkit import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("ingest") as mod:
        yield mod


def test_paired_summary_takes_the_median_and_an_order_statistic_interval(bench):
    ratios = [1.1, 0.4, 0.9, 0.5, 0.7, 0.6, 1.0, 0.8]
    s = bench.paired_summary(ratios)
    assert s["median"] == pytest.approx(0.75)
    # 8 pairs: the 2nd smallest and 2nd largest cover the median with probability 1 - 2 * 9/256
    assert (s["low"], s["high"]) == (0.5, 1.0)
    assert s["coverage"] == pytest.approx(1 - 2 * 9 / 256)
    assert s["share_at_target"] == pytest.approx(7 / 8)  # target 0.5: only 0.4 below
    # Too few pairs for 90%: the extremes, with the coverage they have.
    few = bench.paired_summary([0.3, 0.6, 0.9])
    assert (few["low"], few["high"], few["coverage"]) == (0.3, 0.9, pytest.approx(0.75))


@pytest.mark.parametrize("dedup", [False, True])
def test_ceiling_process_runs_the_jobs_read_tasks_once_per_request(bench, tmp_path, dedup):
    job = bench.load(bench.demo_overrides(tmp_path, 2_000) + [f"ingest.dedup={str(dedup).lower()}"])
    bench.ensure_data(job)
    from dlrm_platform.ingest.source import validate_dataset

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in validate_dataset(job.data).train)
    ceiling = bench.CeilingProcess(job, tmp_path / "q")
    try:
        first, second = ceiling.measure(), ceiling.measure()
    finally:
        ceiling.close()
    assert first[0] == second[0] == rows  # every training sample once per pass (the demo data has no bad rows)
    assert first[1] > 0 and second[1] > 0
    assert not ceiling._proc.is_alive()
