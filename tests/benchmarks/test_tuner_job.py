"""The job-level oracle of benchmarks/tuner_job.py on fake jobs: the search, the oracle's pick and the check."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("tuner_job") as mod:
        yield mod


def fake_jobs(bench, monkeypatch, waits: dict[str, float], auto_wait: float, jitter: float = 0.0005,
              others: float = 0.0) -> list[list[str]]:
    """Replace the job runner: a job's data-wait is 0.02 plus ``waits`` of its overrides (``others`` for an
    override not in it), with a deterministic +-``jitter`` by call count; returns the override lists run."""
    calls: list[list[str]] = []

    def run_job(overrides, epochs, workdir, label):
        calls.append(list(overrides))
        extra = [o for o in overrides if o not in BASE]
        wait = auto_wait if not extra else 0.02 + sum(waits.get(o, others) for o in extra if o != STATIC)
        wait += jitter if len(calls) % 2 else -jitter
        return {"job_data_wait_fraction": wait, "job_samples_per_s": 1e5 * (1 - wait),
                "epoch_data_wait_fraction": [wait, wait / 2], "wall_s": 1.0}

    monkeypatch.setattr(bench.ingest_bench, "run_job", run_job)
    monkeypatch.setattr(bench.ingest_bench, "log", lambda msg: None)
    return calls


BASE = ["data.path=/nowhere"]
STATIC = "tuner.policy=static"


def test_block_rows_are_given_in_batches(bench):
    assert bench.resolve(["ingest.block_rows=@2", "ingest.prefetch_batches=4"], 1024) == [
        "ingest.block_rows=2048", "ingest.prefetch_batches=4"]


def test_auto_fails_only_beyond_the_noise(bench):
    best = {"mean": 0.015, "ci95": 0.001}
    assert not bench.auto_check({"mean": 0.020, "ci95": 0.001}, best)["ok"]
    assert bench.auto_check({"mean": 0.0155, "ci95": 0.001}, best)["ok"]
    assert bench.auto_check({"mean": 0.010, "ci95": 0.001}, best)["ok"]
    assert bench.auto_check({"mean": 0.5, "ci95": float("inf")}, best)["ok"]  # one run: no noise estimate


def test_search_combines_the_knobs_that_helped_and_picks_the_best_finalist(bench, monkeypatch, tmp_path: Path):
    prefetch4, cache_off = "ingest.prefetch_batches=4", "ingest.cache.mode=off"
    calls = fake_jobs(bench, monkeypatch, {prefetch4: -0.008, "ingest.block_rows=2048": -0.004,
                                           cache_off: 0.3}, auto_wait=0.0105)
    rep = bench.search(bench.JobSearch(BASE, 1024, tmp_path), reps=2, final_reps=2, auto_reps=3)
    assert rep["best_per_knob"] == {"prefetch": "prefetch: 4", "block rows": "block rows: 2 batches"}
    combined = next(lb for lb in rep["configurations"] if lb.startswith("combined"))
    assert set(rep["configurations"][combined]["overrides"]) == {
        "tuner.policy=static", prefetch4, "ingest.block_rows=2048"}
    assert rep["oracle"] == combined  # 0.02 - 0.008 - 0.004 = 0.008, the lowest
    assert rep["configurations"][combined]["data_wait"]["n"] == 4  # 2 in the search, 2 as a finalist
    assert rep["configurations"]["auto (defaults)"]["data_wait"]["n"] == 3
    assert sum(1 for c in calls if c == BASE) == 3  # auto runs the defaults, no static override
    assert not rep["check"]["ok"]  # auto 0.0105 against 0.008, noise ~0.001


def test_auto_at_the_oracle_passes(bench, monkeypatch, tmp_path: Path):
    fake_jobs(bench, monkeypatch, {}, auto_wait=0.02, jitter=0.0, others=0.001)
    rep = bench.search(bench.JobSearch(BASE, 1024, tmp_path), reps=1, final_reps=2, auto_reps=2)
    assert rep["best_per_knob"] == {}  # nothing beat the default: no combination
    assert not any(lb.startswith("combined") for lb in rep["configurations"])
    assert rep["check"]["ok"], rep["check"]["message"]


def test_the_combination_leaves_out_fused_knobs_when_fusion_is_off(bench, monkeypatch, tmp_path: Path):
    fake_jobs(bench, monkeypatch, {"ingest.fusion=off": -0.004, "ingest.block_rows=2048": -0.002,
                                   "ingest.prefetch_batches=1": -0.001}, auto_wait=0.01, jitter=0.0)
    rep = bench.search(bench.JobSearch(BASE, 1024, tmp_path), reps=1, final_reps=1, auto_reps=1)
    assert rep["best_per_knob"] == {"fusion": "fusion: off (split, config concurrency)", "prefetch": "prefetch: 1"}
    combined = next(lb for lb in rep["configurations"] if lb.startswith("combined"))
    assert "ingest.block_rows=2048" not in rep["configurations"][combined]["overrides"]
