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
    assert rep["finalists"]["fused 1 x 1.0 CPU"]["run_means"] == [110.0]  # its lucky first pass left out
    assert rep["oracle_check"]["ok"]
    # the policies, the statics and plumber's final counts, then one round: the two finalists and the 4 policies
    assert calls.count(final) == 2 and len(calls) == 4 + len(bench.PIPELINE_STATICS) + 1 + 2 + 4


def test_a_policy_beyond_the_pipeline_oracle_fails_the_check(bench, monkeypatch, tmp_path):
    fake_pipelines(bench, monkeypatch, lambda extra, call: 200.0 if "tuner.policy=rl" in extra else 100.0)
    rep = bench.pipeline_comparison(BASE, ("rl", "auto"), 10.0, tmp_path)
    assert [v["policy"] for v in rep["oracle_check"]["violations"]] == ["rl"]


def test_run_noise_pools_each_configurations_deviations_about_its_own_mean(bench):
    # relative to each mean: a (mean 10): 0.1^2 + 0.1^2 (df 1); b (mean 100): 0.1^2 + 0 + 0.1^2 (df 2); c: one run
    noise = bench.run_noise({"a": [9.0, 11.0], "b": [90.0, 100.0, 110.0], "c": [100.0]})
    assert noise["df"] == 3 and noise["rel_sd"] == pytest.approx((0.04 / 3) ** 0.5)
    assert noise["configs"] == ["a", "b"]


def test_run_noise_of_nothing_repeated_has_no_degrees_of_freedom(bench):
    noise = bench.run_noise({"a": [10.0], "b": [20.0], "c": []})
    assert noise["df"] == 0 and noise["configs"] == [] and noise["rel_sd"] != noise["rel_sd"]  # nan


def test_run_figure_uses_the_pooled_noise_or_says_it_fell_back_to_the_epochs(bench):
    noise = {"rel_sd": 0.1, "df": 4, "configs": ["a"]}
    fig = bench.run_figure([100.0, 110.0, 120.0, 130.0], noise, within_run_ci95=1.0)
    assert fig == {"mean": 115.0, "ci95": pytest.approx(2.78 * 0.1 * 115.0 / 2), "n": 4, "noise": bench.POOLED_NOISE}
    alone = bench.run_figure([100.0], {"rel_sd": float("nan"), "df": 0, "configs": []}, within_run_ci95=3.0)
    assert alone["ci95"] == 3.0 and alone["noise"] == "within-run epochs (no repeated runs)"


def test_interleave_spreads_the_finalists_among_the_policies(bench):
    assert bench.interleave(["F0", "F1"], ["a", "b", "c", "d", "e", "f"]) == ["F0", "a", "b", "c", "F1", "d", "e", "f"]
    assert bench.interleave(["F0", "F1"], ["a"]) == ["F0", "a", "F1"]
    assert bench.interleave(["F0", "F1"], []) == ["F0", "F1"]


DEFAULT_TASKS = "fused, default tasks"


def drifting(sps_of, drift: float):
    """``sps_of(extra)`` with a drift by how many runs of the same configuration came before: +``drift`` on its
    first run, -``drift`` on its second, and so on (separate processes minutes apart on a shared machine)."""
    return lambda extra, call: sps_of(extra) * (1 + drift if call % 2 == 0 else 1 - drift)


def test_auto_running_the_oracles_configuration_passes_despite_run_to_run_drift(bench, monkeypatch, tmp_path):
    # the failure of run 3 on the demo: auto runs the fused default (as the `fused, default tasks` static does),
    # its first run 8% high, the oracle's re-measurement 8% low; the epochs within a run agree to 1%
    def sps_of(extra):
        if extra in ([], [STATIC]):
            return 500_000.0
        if extra == bench.PIPELINE_STATICS["fused 4 x 0.25 CPU"]:
            return 480_000.0
        return {"tuner.policy=plumber": 450_000.0, "tuner.policy=rl": 420_000.0}.get(
            next((o for o in extra if o.startswith("tuner.policy=") and o != STATIC), ""), 300_000.0)

    fake_pipelines(bench, monkeypatch, drifting(sps_of, 0.08), ci=5_000.0)
    rep = bench.pipeline_comparison(BASE, ("plumber", "rl", "auto"), 10.0, tmp_path)
    assert rep["oracle"] == DEFAULT_TASKS and rep["finalists"][DEFAULT_TASKS]["run_means"] == [460_000.0]
    assert rep["runs"]["auto"] == [540_000.0, 460_000.0] and rep["throughput"]["auto"] == 500_000.0
    assert rep["oracle_check"]["ok"], rep["oracle_check"]["violations"]
    # under the old model (a run's epochs for the noise) the same runs fail: the drift is wider than the epochs
    within_run = rep["policies"]["auto"]["samples_per_s"]["ci95"]
    assert within_run < rep["noise"]["rel_sd"] * rep["throughput"]["auto"]
    old = bench.tuner_bench.oracle_check({
        "auto": rep["policies"]["auto"]["samples_per_s"],
        "oracle": rep["finalists"][DEFAULT_TASKS]["remeasurements"][0]["samples_per_s"]})
    assert [v["policy"] for v in old["violations"]] == ["auto"]
    assert rep["noise"]["configs"] == ["plumber", "rl", "auto"]  # each finalist re-measured once: nothing to pool
    assert rep["figures"]["auto"]["noise"] == rep["figures"]["oracle"]["noise"] == bench.POOLED_NOISE


def test_the_runs_of_policies_that_left_the_oracles_own_configuration_as_it_was_count_as_the_oracles(
        bench, monkeypatch, tmp_path):
    # the demo of run 83: every policy runs the fused default and decides nothing; the oracle's one re-measurement
    # reads high (852k), the other runs of that same pipeline 700-822k
    def sps_of(extra, call):
        if extra == [STATIC]:
            return 750_000.0 if call == 0 else 850_000.0
        if extra == bench.PIPELINE_STATICS["fused 4 x 0.25 CPU"]:
            return 740_000.0 if call == 0 else 760_000.0
        return {"tuner.policy=rl": 730_000.0, "tuner.policy=plumber": 720_000.0}.get(
            next((o for o in extra if o.startswith("tuner.policy=") and o != STATIC), ""), 300_000.0)

    fake_pipelines(bench, monkeypatch, sps_of)
    real = bench.pipeline_under

    def pipeline_under(overrides, seconds, workdir, data_cpus=1.0):
        res = real(overrides, seconds, workdir, data_cpus)
        fused = "ingest.fusion=off" not in overrides  # rl too: fused, as on the demo
        res["pipeline"] = "fused: ..." if fused else "split: ..."
        res["tuner"] = {**res["tuner"], "final_allocation": {"read": 2} if fused else {"read": 1, "parse": 2},
                        "decisions": 3 if "tuner.policy=plumber" in overrides else 0}
        return res

    monkeypatch.setattr(bench, "pipeline_under", pipeline_under)
    rep = bench.pipeline_comparison(BASE, ("static", "plumber", "rl"), 10.0, tmp_path)
    assert rep["oracle"] == DEFAULT_TASKS
    # static and rl ran it as it was; plumber decided (3 decisions): its runs are its own
    assert rep["oracle_runs"] == {"re-measurements": 1, "policies": ["static", "rl"]}
    pooled = [850_000.0] + rep["runs"]["static"] + rep["runs"]["rl"]
    assert rep["figures"]["oracle"]["n"] == 5 and rep["throughput"]["oracle"] == pytest.approx(sum(pooled) / 5)
    assert rep["vs_oracle"]["rl"] == pytest.approx(730_000.0 / (sum(pooled) / 5))
    # where the oracle is another configuration (fused 4 x 0.25 CPU) no policy ran it: its re-measurements alone
    monkeypatch.setattr(bench, "PIPELINE_STATICS", {k: v for k, v in bench.PIPELINE_STATICS.items() if k != DEFAULT_TASKS})
    rep = bench.pipeline_comparison(BASE, ("static", "plumber", "rl"), 10.0, tmp_path)
    assert rep["oracle"] == "fused 4 x 0.25 CPU" and rep["oracle_runs"]["policies"] == []
    assert rep["figures"]["oracle"]["n"] == 1 and rep["throughput"]["oracle"] == 760_000.0


def test_ran_unchanged_asks_for_the_same_pipeline_the_same_counts_and_no_decision(bench):
    static = {"pipeline": "fused: x", "tuner": {"final_allocation": {"read": 3}, "decisions": 0}}
    assert bench.ran_unchanged([static, static], [static])
    assert not bench.ran_unchanged([{**static, "tuner": {"final_allocation": {"read": 3}}}], [static])  # not told
    assert not bench.ran_unchanged([{**static, "tuner": {"final_allocation": {"read": 4}, "decisions": 0}}], [static])
    assert not bench.ran_unchanged([{**static, "tuner": {"final_allocation": {"read": 3}, "decisions": 1}}], [static])
    assert not bench.ran_unchanged([{**static, "pipeline": "split: x"}], [static])
    assert not bench.ran_unchanged([], [static])


def test_a_policy_beyond_the_oracle_in_every_run_still_fails_under_drift(bench, monkeypatch, tmp_path):
    sps_of = drifting(lambda extra: 130.0 if "tuner.policy=rl" in extra else 100.0, 0.02)
    fake_pipelines(bench, monkeypatch, sps_of, ci=0.5)
    rep = bench.pipeline_comparison(BASE, ("rl", "auto"), 10.0, tmp_path, rounds=2)
    assert [v["policy"] for v in rep["oracle_check"]["violations"]] == ["rl"]
    assert rep["figures"]["rl"]["n"] == 3 and rep["figures"]["oracle"]["n"] == 2
    assert rep["noise"]["df"] == 2 + 2 + 1 + 1  # rl and auto 3 runs each, the two finalists 2 re-measurements each


def test_each_round_re_measures_the_finalists_and_every_policy_interleaved(bench, monkeypatch, tmp_path):
    final = [STATIC, "ingest.fusion=off", "ingest.operators.parse.concurrency=2", "ingest.operators.read.concurrency=1"]
    best = bench.PIPELINE_STATICS["fused 4 x 0.25 CPU"]
    calls = fake_pipelines(bench, monkeypatch, lambda extra, call: 120.0 if extra in (final, best) else 100.0)
    policies = ("static", "plumber", "rl", "auto")
    rep = bench.pipeline_comparison(BASE, policies, 10.0, tmp_path, rounds=3)
    assert list(rep["finalists"]) == ["fused 4 x 0.25 CPU", "final of plumber"]
    first_pass = len(policies) + len(bench.PIPELINE_STATICS) + 1
    # finalist, static, plumber, finalist, rl, auto: the finalists spread among the policies, in every round
    per_round = [best, [STATIC], ["tuner.policy=plumber"], final, ["tuner.policy=rl"], []]
    assert calls[first_pass:] == per_round * 3
    assert all(len(rep["runs"][p]) == 4 for p in policies)
    assert rep["runs"]["final of plumber"] == [120.0] * 4
    assert rep["finalists"]["final of plumber"]["run_means"] == [120.0] * 3


def test_suite_entry_threads_the_pipeline_rounds(bench, monkeypatch, tmp_path):
    import argparse

    seen: dict = {}

    def pipeline_comparison(base, policies, seconds, workdir, rounds=1):
        seen["rounds"] = rounds
        return {}

    monkeypatch.setattr(bench, "pipeline_comparison", pipeline_comparison)
    fake_policy_jobs(bench, monkeypatch, lambda extra: 0.02)
    monkeypatch.setattr(bench, "dataset_base", lambda dataset, samples, workdir: (BASE, 1024))
    bench.suite_entry("demo", ("auto",), argparse.Namespace(samples=1, pipeline_s=1.0, policy_reps=1,
                                                            job_pipeline_rounds=3), tmp_path)
    assert seen["rounds"] == 3
    bench.suite_entry("demo", ("auto",), argparse.Namespace(samples=1, pipeline_s=1.0, policy_reps=1), tmp_path)
    assert seen["rounds"] == 1


def test_suite_entry_adds_each_policys_jobs(bench, monkeypatch, tmp_path, capsys):
    fake_pipelines(bench, monkeypatch, drifting(lambda extra: 100.0, 0.25))
    calls = fake_policy_jobs(bench, monkeypatch, lambda extra: 0.05 if "tuner.policy=rl" in extra else 0.02)
    monkeypatch.setattr(bench, "dataset_base", lambda dataset, samples, workdir: (BASE, 1024))
    import argparse

    rep = bench.suite_entry("demo", ("static", "rl", "auto"), argparse.Namespace(
        samples=1000, pipeline_s=5.0, policy_reps=2), tmp_path)
    assert rep["data_wait"] == pytest.approx({"static": 0.02, "rl": 0.05, "auto": 0.02})
    assert rep["job_samples_per_s"]["rl"] == pytest.approx(95_000)
    assert [c for c in calls] == [[*BASE, STATIC], [*BASE, "tuner.policy=rl"], BASE] * 2  # interleaved
    # the pipeline's figures as the check saw them (static's overrides are the fused default static's, run
    # between its two: 125 twice); pooled squares 2 x 0.25^2 (of mean 100) for rl and for auto, over 3 df
    assert {p: rep["runs"][p] for p in ("static", "rl", "auto")} == {
        "static": [125.0, 125.0], "rl": [125.0, 75.0], "auto": [125.0, 75.0]}
    assert rep["figures"]["rl"]["ci95"] == pytest.approx(3.18 * (0.25 / 3) ** 0.5 * 100.0 / 2 ** 0.5)
    bench.print_suite_entry("job:demo", rep)
    out = capsys.readouterr().out
    assert "pooled run-to-run, sd 28.9% of a configuration's mean over 3 df" in out
    assert f"+- {rep['figures']['rl']['ci95']:>7,.0f} (n=2)" in out
