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


def fake_policy_jobs(bench, monkeypatch, wait_of) -> list[list[str]]:
    """Jobs whose data-wait is ``wait_of(overrides)`` (samples/s 1e5 x (1 - wait)); a policy that steers operators
    (``tuner.policy=`` other than static) runs split and ends at read 1, parse 2."""
    calls: list[list[str]] = []

    def run_job(overrides, epochs, workdir, label):
        calls.append(list(overrides))
        wait = wait_of([o for o in overrides if o not in BASE])
        policy = next((o.split("=", 1)[1] for o in overrides if o.startswith("tuner.policy=")), "auto")
        steered = policy not in ("static", "auto")
        return {"job_data_wait_fraction": wait, "job_samples_per_s": 1e5 * (1 - wait),
                "epoch_data_wait_fraction": [wait, wait], "wall_s": 1.0,
                "pipeline": "split: one Ray Data operator per stage" if steered or "ingest.fusion=off" in overrides
                else "fused: read..batch in one task",
                "tuner": {"policy": policy, "final_allocation": {"read": 1, "parse": 2} if steered else {"read": 2}}}

    monkeypatch.setattr(bench.ingest_bench, "run_job", run_job)
    monkeypatch.setattr(bench.ingest_bench, "log", lambda msg: None)
    return calls


def test_a_policys_final_task_counts_join_the_finalists_so_the_oracle_matches_it(bench, monkeypatch, tmp_path):
    final = ["ingest.operators.parse.concurrency=2", "ingest.operators.read.concurrency=1"]

    def wait_of(extra):
        if all(o in extra for o in final):
            return 0.01  # plumber's allocation, as a static configuration: better than every searched one
        return {"tuner.policy=plumber": 0.011, "tuner.policy=rl": 0.05}.get(
            next((o for o in extra if o.startswith("tuner.policy=") and o != STATIC), ""), 0.02)

    calls = fake_policy_jobs(bench, monkeypatch, wait_of)
    rep = bench.search(bench.JobSearch(BASE, 1024, tmp_path), reps=1, final_reps=1, auto_reps=1,
                       policies=("static", "plumber", "rl", "auto"), policy_reps=2)
    assert "final of plumber" in rep["finalists"]
    assert rep["configurations"]["final of plumber"]["overrides"] == [STATIC, "ingest.fusion=off", *final]
    assert "final of rl" not in rep["finalists"]  # the same task counts: measured once, as plumber's
    assert rep["throughput_oracle"] == "final of plumber"
    assert rep["vs_oracle"]["plumber"] == pytest.approx(0.989 / 0.99)
    assert rep["vs_oracle"]["rl"] == pytest.approx(0.95 / 0.99)
    assert rep["vs_oracle"]["static"] == pytest.approx(0.98 / 0.99)  # static is the default configuration
    assert set(rep["throughput"]) == {"static", "plumber", "rl", "auto", "oracle"}
    assert rep["data_wait"]["rl"] == pytest.approx(0.05)
    assert rep["configurations"]["policy: plumber"]["samples_per_s"]["n"] == 2
    assert sum(1 for c in calls if "tuner.policy=rl" in c) == 2
    assert rep["oracle_check"]["ok"] and bench.failures(rep) == []


def test_a_policy_beyond_the_oracle_fails_the_run(bench, monkeypatch, tmp_path):
    # rl's jobs are faster than anything static, its final task counts included: the oracle is no upper bound
    fake_policy_jobs(bench, monkeypatch, lambda extra: 0.001 if "tuner.policy=rl" in extra else 0.3)
    rep = bench.search(bench.JobSearch(BASE, 1024, tmp_path), reps=1, final_reps=2, auto_reps=2,
                       policies=("rl",), policy_reps=3)
    assert not rep["oracle_check"]["ok"]
    assert [v["policy"] for v in rep["oracle_check"]["violations"]] == ["rl"]
    assert any("rl" in m and "beats the oracle" in m for m in bench.failures(rep))


def test_final_as_static_only_for_split_pipelines(bench):
    split = {"pipeline": "split: ...", "tuner": {"final_allocation": {"read": 2, "batch": 1}}}
    assert bench.final_as_static(split) == [STATIC, "ingest.fusion=off", "ingest.operators.batch.concurrency=1",
                                            "ingest.operators.read.concurrency=2"]
    assert bench.final_as_static({"pipeline": "fused: ...", "tuner": {"final_allocation": {"read": 2}}}) is None
    assert bench.final_as_static({"pipeline": "split: ...", "tuner": {}}) is None


def fake_pipelines(bench, monkeypatch, sps_of, ci: float = 1.0) -> list[list[str]]:
    """Replace the pipeline-alone runner: ``sps_of(overrides, call)`` samples/s (``call``: how many runs of the
    same overrides came before); a policy that steers operators runs split and ends at read 1, parse 2."""
    calls: list[list[str]] = []

    def pipeline_under(overrides, seconds, workdir, data_cpus=1.0):
        extra = [o for o in overrides if o not in BASE]
        sps = sps_of(extra, sum(1 for c in calls if c == extra))
        calls.append(extra)
        policy = next((o.split("=", 1)[1] for o in extra if o.startswith("tuner.policy=")), "auto")
        steered = policy not in ("static", "auto")
        return {"epoch_samples_per_s": [sps] * 5, "samples_per_s": {"mean": sps, "ci95": ci, "n": 5}, "epochs": 8,
                "pipeline": "split: ..." if steered or "ingest.fusion=off" in extra else "fused: ...",
                "tuner": {"policy": policy, "final_allocation": {"read": 1, "parse": 2} if steered else {"read": 2}}}

    monkeypatch.setattr(bench, "pipeline_under", pipeline_under)
    monkeypatch.setattr(bench.ingest_bench, "log", lambda msg: None)
    return calls


def test_pipeline_oracle_measures_the_statics_and_each_policys_final_counts_and_re_measures_the_best(
        bench, monkeypatch, tmp_path):
    final = [STATIC, "ingest.fusion=off", "ingest.operators.parse.concurrency=2", "ingest.operators.read.concurrency=1"]

    def sps_of(extra, call):
        if extra == final:
            return 120.0
        if extra == bench.PIPELINE_STATICS["fused 1 x 1.0 CPU"]:
            return 130.0 if call == 0 else 110.0  # a lucky first run: the re-measurement decides
        return {"tuner.policy=plumber": 115.0, "tuner.policy=rl": 100.0}.get(
            next((o for o in extra if o.startswith("tuner.policy=") and o != STATIC), ""), 90.0)

    calls = fake_pipelines(bench, monkeypatch, sps_of)
    rep = bench.pipeline_comparison(BASE, ("static", "plumber", "rl", "auto"), 10.0, tmp_path)
    assert set(rep["statics"]) == {*bench.PIPELINE_STATICS, "final of plumber"}  # rl ended at the same counts
    assert set(rep["finalists"]) == {"fused 1 x 1.0 CPU", "final of plumber"}
    assert rep["oracle"] == "final of plumber" and rep["throughput"]["oracle"] == 120.0
    assert rep["vs_oracle"] == pytest.approx({"static": 0.75, "plumber": 115 / 120, "rl": 100 / 120, "auto": 0.75})
    assert rep["oracle_check"]["ok"]
    assert calls.count(final) == 2 and len(calls) == 4 + len(bench.PIPELINE_STATICS) + 1 + 2


def test_a_policy_beyond_the_pipeline_oracle_fails_the_check(bench, monkeypatch, tmp_path):
    fake_pipelines(bench, monkeypatch, lambda extra, call: 200.0 if "tuner.policy=rl" in extra else 100.0)
    rep = bench.pipeline_comparison(BASE, ("rl", "auto"), 10.0, tmp_path)
    assert [v["policy"] for v in rep["oracle_check"]["violations"]] == ["rl"]


def test_suite_entry_adds_each_policys_jobs(bench, monkeypatch, tmp_path):
    fake_pipelines(bench, monkeypatch, lambda extra, call: 100.0)
    calls = fake_policy_jobs(bench, monkeypatch, lambda extra: 0.05 if "tuner.policy=rl" in extra else 0.02)
    monkeypatch.setattr(bench, "dataset_base", lambda dataset, samples, workdir: (BASE, 1024))
    import argparse

    rep = bench.suite_entry("demo", ("static", "rl", "auto"), argparse.Namespace(
        samples=1000, pipeline_s=5.0, policy_reps=2), tmp_path)
    assert rep["data_wait"] == pytest.approx({"static": 0.02, "rl": 0.05, "auto": 0.02})
    assert rep["job_samples_per_s"]["rl"] == pytest.approx(95_000)
    assert [c for c in calls] == [[*BASE, STATIC], [*BASE, "tuner.policy=rl"], BASE] * 2  # interleaved
