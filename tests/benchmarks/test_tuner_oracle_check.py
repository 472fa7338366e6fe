"""The tuner benchmark's oracle check (benchmarks/tuner.py), on fake numbers: no Ray, no timing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from testkit import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("tuner") as mod:
        yield mod


def test_confidence_interval_of_per_interval_samples(bench):
    ci = bench.mean_ci([100.0, 110.0, 90.0, 100.0])
    assert ci["mean"] == 100.0 and ci["n"] == 4
    assert ci["ci95"] == pytest.approx(3.18 * np.std([100, 110, 90, 100], ddof=1) / 2)
    assert math.isinf(bench.mean_ci([5.0])["ci95"])  # one sample says nothing about the noise


def test_interval_rates_cut_the_steady_state_into_bins(bench):
    ts = np.arange(0.5, 20.0, 1.0)  # a row batch every second ...
    rows = np.full(len(ts), 100.0)  # ... of 100 rows
    assert bench.interval_rates(ts, rows, 0.0, 20.0, bin_s=5.0) == [100.0] * 4


def test_a_policy_within_the_noise_of_the_oracle_passes(bench):
    stats = {"oracle": {"mean": 10_000.0, "ci95": 300.0}, "rl": {"mean": 10_200.0, "ci95": 300.0},
             "plumber": {"mean": 9_000.0, "ci95": 100.0}}
    check = bench.oracle_check(stats)
    assert check["checked"] and check["ok"] and check["violations"] == []


def test_a_policy_beating_the_oracle_by_more_than_the_noise_fails_the_run(bench):
    # the measurement: rl 10,575, oracle 7,155
    stats = {"oracle": {"mean": 7_155.0, "ci95": 250.0}, "rl": {"mean": 10_575.0, "ci95": 300.0},
             "static": {"mean": 7_000.0, "ci95": 200.0}}
    check = bench.oracle_check(stats)
    assert not check["ok"]
    (v,) = check["violations"]
    assert v["policy"] == "rl" and v["margin"] == pytest.approx(3_420.0)
    assert v["noise"] == pytest.approx(math.hypot(300.0, 250.0))
    assert "rl" in v["message"] and "not an upper bound" in v["message"]


def test_no_oracle_no_check(bench):
    assert bench.oracle_check({"rl": {"mean": 1.0, "ci95": 0.0}}) == {
        "ok": True, "checked": False, "violations": [], "note": "no oracle run"}


def test_ray_default_is_checked_at_the_tasks_ray_ran(bench):
    assert bench.final_allocation({"policy": "ray_default", "observed_tasks_running": {"a": 2.6, "b": 0.2},
                                   "final_allocation": {"a": 1, "b": 1}}) == {"a": 3, "b": 1}
    assert bench.final_allocation({"policy": "rl", "final_allocation": {"a": 2}}) == {"a": 2}


def test_suite_summary_ratios_geometric_means_and_targets(bench):
    reports = {
        "a": {"simulated": {"throughput": {"rl": 100.0, "oracle": 100.0, "plumber": 80.0}},
              "local": {"throughput": {"rl": 90.0, "oracle": 100.0, "plumber": 90.0, "ray_default": 60.0}}},
        "b": {"simulated": {"throughput": {"rl": 100.0, "oracle": 125.0, "plumber": 125.0}},
              "local": {"throughput": {"rl": 100.0, "oracle": 100.0, "plumber": 80.0, "ray_default": 80.0}}},
    }
    s = bench.suite_summary(reports)
    sim, live = s["simulated"], s["local"]
    assert sim["per_pipeline"]["b"]["rl_vs_oracle"] == pytest.approx(0.8)
    assert sim["geomean"]["rl_vs_plumber"] == pytest.approx(math.sqrt(1.25 * 0.8))  # = 1.0
    assert sim["targets"]["rl_vs_oracle_min"] == {"target": 0.95, "measured": pytest.approx(0.8), "met": False,
                                               "headroom": None}
    assert sim["targets"]["rl_vs_ray_default_geomean"]["measured"] is None  # Ray's allocator is not simulated
    assert not sim["targets"]["rl_vs_ray_default_geomean"]["met"]
    assert live["geomean"]["rl_vs_ray_default"] == pytest.approx(math.sqrt(1.5 * 1.25))
    assert live["targets"]["rl_vs_ray_default_geomean"]["met"]  # 1.37 >= 1.3
    assert live["targets"]["rl_vs_oracle_min"]["measured"] == pytest.approx(0.9)
    assert "multinode" not in s
    # the best configuration found (here the oracle) over each baseline: what any policy could show
    assert live["headroom"]["rl_vs_ray_default"] == pytest.approx(math.sqrt(100 / 60 * 100 / 80))
    assert live["targets"]["rl_vs_ray_default_geomean"]["headroom"] == pytest.approx(math.sqrt(100 / 60 * 100 / 80))
    assert sim["targets"]["rl_vs_plumber_geomean"]["headroom"] == pytest.approx(math.sqrt(100 / 80 * 125 / 125))
    assert sim["targets"]["rl_vs_oracle_min"]["headroom"] is None  # not a geometric mean


def test_suite_headroom_is_the_exact_optimum_where_simulated_and_says_when_a_target_is_out_of_reach(bench, capsys):
    reports = {
        "a": {"simulated": {"throughput": {"rl": 90.0, "oracle": 95.0, "plumber": 90.0},
                            "optimum_samples_per_s": 100.0},
              "local": {"throughput": {"rl": 100.0, "oracle": 110.0, "ray_default": 100.0}}},
        "b": {"local": {"throughput": {"rl": 100.0, "ray_default": 50.0}}},  # no oracle: no headroom
    }
    s = bench.suite_summary(reports)
    assert s["simulated"]["headroom"]["rl_vs_plumber"] == pytest.approx(100 / 90)
    assert s["simulated"]["headroom"]["rl_vs_oracle"] == pytest.approx(100 / 95)
    assert "rl_vs_ray_default" not in s["local"]["headroom"]  # b's best is unknown
    s = bench.suite_summary({"a": reports["a"]})
    assert s["local"]["targets"]["rl_vs_ray_default_geomean"]["headroom"] == pytest.approx(1.1)
    bench.print_suite(s)
    out = capsys.readouterr().out
    assert "the best configuration found: 1.100, so no policy could meet it in this run" in out


def test_job_pipelines_join_the_suite_with_their_own_oracle_and_data_wait(bench, monkeypatch, tmp_path):
    import argparse

    tj = bench._tuner_job()
    seen: dict = {}

    def suite_entry(dataset, policies, args, workdir):
        seen.update(dataset=dataset, policies=policies, policy_reps=args.policy_reps, pipeline_s=args.pipeline_s,
                    workdir=workdir)
        return {"throughput": {"static": 95.0, "plumber": 80.0, "rl": 90.0, "auto": 100.0, "oracle": 100.0},
                "data_wait": {"static": 0.02, "plumber": 0.2, "rl": 0.1, "auto": 0.01},
                "job_samples_per_s": {"static": 9.0, "plumber": 8.0, "rl": 9.0, "auto": 9.5},
                "oracle_check": {"ok": True, "checked": True, "violations": []}}

    monkeypatch.setattr(tj, "suite_entry", suite_entry)
    monkeypatch.setattr(tj, "print_suite_entry", lambda name, rep: None)
    args = argparse.Namespace(job_samples=1000, job_policy_reps=3, job_pipeline_s=12.0, job_workdir=tmp_path)
    rep = bench.job_pipeline_report("demo", ["static", "ray_default", "plumber", "rl", "oracle"], args)
    # auto (the platform's default) always runs; the oracle is the pipeline's own search, not a policy
    assert seen == {"dataset": "demo", "policies": ("static", "ray_default", "plumber", "rl", "auto"),
                    "policy_reps": 3, "pipeline_s": 12.0, "workdir": tmp_path / "demo"}
    assert rep["local"]["data_wait"]["rl"] == 0.1 and rep["local"]["job_samples_per_s"]["auto"] == 9.5
    s = bench.suite_summary({"job:demo": rep})
    assert s["local"]["per_pipeline"]["job:demo"]["rl_vs_oracle"] == pytest.approx(0.9)
    assert s["local"]["per_pipeline"]["job:demo"]["rl_vs_plumber"] == pytest.approx(1.125)
    assert "simulated" not in s  # real jobs are not simulated


def test_timeline_keeps_what_the_policy_saw_each_interval(bench):
    ticks = [
        {"type": "tick", "elapsed": 1.04, "throughput": 3890.4, "bottleneck": "lookup", "allocation": {"read": 2, "lookup": 13},
         "per_op": {"read": {"capacity": 10_812.7, "running": 2.0, "util": 1.0, "queue_blocks": 3},
                    "lookup": {"capacity": 912.3, "running": 12.987, "util": 0.999, "throttled": 0.504}}},
        {"type": "tick", "elapsed": 2.1, "throughput": 0.0, "bottleneck": None, "allocation": {"read": 2, "lookup": 13},
         "per_op": {"read": {"capacity": None, "running": 0.0, "util": 0.0},
                    "lookup": {"capacity": 9_301.0, "running": 13.0, "util": 1.0}}},
    ]
    tl = bench._timeline(ticks)
    assert [t["t"] for t in tl] == [1.0, 2.1]
    assert tl[0]["bottleneck"] == "lookup" and tl[0]["allocation"] == {"read": 2, "lookup": 13}
    assert tl[0]["ops"]["lookup"] == {"capacity": 912.0, "running": 12.99, "util": 1.0, "throttled": 0.5,
                                      # the cumulative counters, None where the tick did not carry them
                                      "rows_out_total": None, "busy_s_total": None, "slot_s_total": None}
    assert tl[1]["ops"]["read"]["capacity"] is None  # not measured that interval: kept as unknown, not 0
    assert set(tl[0]["ops"]["read"]) == {"capacity", "running", "util", "throttled", "rows_out_total",
                                         "busy_s_total", "slot_s_total"}


def test_the_oracle_must_beat_every_configuration_a_policy_held_through_its_steady_state(bench):
    """A policy's steady-state figure can come from a configuration it left shortly before the end: the
    oracle re-measures each one it held for a quarter of that window, and the final one."""
    a, b, c = ({"read": 4, "parse": 4}, {"read": 3, "parse": 5}, {"read": 3, "parse": 6})
    res = {"policy": "auto", "elapsed_s": 100.0, "final_allocation": c, "final_block_rows": 8000,
           "allocations": [[20.0, a], [60.0, b], [91.0, c]], "block_rows_steps": [[20.0, 8000, "probe"]]}
    got = bench.steady_configurations(res, 40.0, {"allocation": a, "block_rows": 500})
    assert {"allocation": b, "block_rows": 8000} in got      # 31 of the last 40 s
    assert {"allocation": c, "block_rows": 8000} in got      # the final one, 9 s
    assert len(got) == 2
    early = dict(res, allocations=[[70.0, b]], block_rows_steps=[], final_allocation=b, final_block_rows=None)
    got = bench.steady_configurations(early, 40.0, {"allocation": a, "block_rows": None})
    assert got == [{"allocation": a, "block_rows": None}, {"allocation": b, "block_rows": None}]  # 10 s and 30 s
    ray = {"policy": "ray_default", "observed_tasks_running": {"read": 3.6, "parse": 4.2}, "final_block_rows": None}
    assert bench.steady_configurations(ray, 40.0, {"allocation": a, "block_rows": None}) == [
        {"allocation": {"read": 4, "parse": 4}, "block_rows": None}]


def test_the_oracles_pick_runs_again_held_static_at_its_allocation_and_block_size(bench):
    pipe = bench.load_pipeline(bench.ROOT / "benchmarks/pipelines/per_task_overhead.yaml")
    alloc = {o.name: o.concurrency + 1 for o in pipe.operators}
    pick = bench.pick_pipeline(pipe, {"allocation": alloc, "block_rows": 8000})
    assert {o.name: o.concurrency for o in pick.operators} == alloc
    assert pick.rows_per_block == 8000 and pick.max_rows_per_block is None  # no sizer: the size is held
    assert bench.block_rows_spec(pick, bench.ROOT) is None
    assert [o.ms_per_1k_rows for o in pick.operators] == [o.ms_per_1k_rows for o in pipe.operators]
    # unresizable blocks keep the pipeline's own size
    assert bench.pick_pipeline(pipe, {"allocation": alloc, "block_rows": None}).rows_per_block == pipe.rows_per_block


def test_the_oracles_winner_is_the_best_reading_and_its_figure_a_run_that_did_not_select_it(bench):
    a = {"read": 3, "parse": 5}
    b = {"read": 2, "parse": 6}
    search = {"policy": "oracle", "samples_per_s": 11_500.0, "interval_samples_per_s": [11_000.0, 12_000.0],
              "seconds_to_95pct": 160.0, "final_allocation": b, "final_block_rows": 8000}
    pick = ({"allocation": b, "block_rows": 8000},
            {"samples_per_s": 13_500.0, "interval_samples_per_s": [13_400.0, 13_600.0], "crash": None})
    rl_cfg = ({"allocation": a, "block_rows": 8000},
              {"samples_per_s": 16_900.0, "interval_samples_per_s": [16_800.0, 17_000.0], "crash": None})
    assert bench.needs_confirmation([pick, rl_cfg]) and not bench.needs_confirmation([pick])
    assert bench.oracle_winner(search, [pick, rl_cfg]) == (rl_cfg[0], 16_900.0, "fresh run of 3/5 at 8,000 rows")
    confirm = {"samples_per_s": 15_800.0, "interval_samples_per_s": [15_700.0, 15_900.0], "crash": None}
    got = bench.adopt_fresh_runs(search, [pick, rl_cfg], confirm)
    # the winner is the best configuration read (a policy's here); its figure is the confirmation, not the max
    assert got["final_allocation"] == a and got["final_block_rows"] == 8000
    assert got["samples_per_s"] == 15_800.0 and got["interval_samples_per_s"] == [15_700.0, 15_900.0]
    assert got["figure_from"] == "confirmation run of 3/5 at 8,000 rows"
    assert got["selection"] == {"configuration": rl_cfg[0], "samples_per_s": 16_900.0,
                                "from": "fresh run of 3/5 at 8,000 rows"}
    assert got["search_run"]["samples_per_s"] == 11_500.0 and len(got["fresh_runs"]) == 2
    # the oracle check then reads the confirmation's intervals
    stats = {"oracle": bench.mean_ci(got["interval_samples_per_s"]), "rl": bench.mean_ci([17_400.0, 17_900.0])}
    assert bench.oracle_check(stats)["oracle"]["samples_per_s"] == 15_800.0
    # only the pick ran fresh: its fresh run is its figure, even below the search run's reading
    slow = bench.adopt_fresh_runs(search, [(pick[0], {**pick[1], "samples_per_s": 9_000.0})])
    assert slow["samples_per_s"] == 9_000.0 and slow["final_allocation"] == b
    assert slow["figure_from"] == "fresh run of 2/6 at 8,000 rows" and slow["selection"]["from"] == "search run"
    # a crashed figure run leaves the selection's figure, and says so
    crashed = bench.adopt_fresh_runs(search, [(pick[0], {**pick[1], "crash": "RayTaskError: boom"})])
    assert crashed["samples_per_s"] == 11_500.0 and crashed["fresh_runs"][0]["crash"] == "RayTaskError: boom"
    assert "crashed" in crashed["figure_from"]
    # a round without a search (an earlier round's pick measured fresh): the pick's run is the result's base
    reused = bench.adopt_fresh_runs(None, [pick])
    assert reused["policy"] == "oracle" and reused["search_run"] is None and reused["samples_per_s"] == 13_500.0


def test_later_rounds_reuse_the_oracles_winner_only_when_asked_and_once_it_has_one(bench):
    import argparse

    won = {"policy": "oracle", "final_allocation": {"read": 2}, "final_block_rows": None}
    every = argparse.Namespace(oracle_search_rounds=0)
    first = argparse.Namespace(oracle_search_rounds=1)
    assert not bench.reuses_oracle_pick(3, every, {"oracle": [won]})
    assert not bench.reuses_oracle_pick(0, first, {"oracle": []})  # round 1 searches
    assert bench.reuses_oracle_pick(1, first, {"oracle": [won]})
    assert not bench.reuses_oracle_pick(1, first, {"oracle": [{**won, "final_allocation": None}]})  # nothing to reuse
    with pytest.raises(SystemExit):
        bench.main(["--oracle-search-rounds", "-1", "--sim-only"])
    with pytest.raises(SystemExit):
        bench.main(["--oracle-search-rounds", "1", "--no-oracle-fresh-pick", "--sim-only"])


def test_rl_over_the_oracle_round_by_round_with_its_interval(bench):
    runs = {"rl": [_run(95.0, []), _run(105.0, []), _run(99.0, [])],
            "oracle": [_run(100.0, []), _run(100.0, []), _run(110.0, [])]}
    got = bench.paired_ratios(runs)
    assert got["ratios"] == pytest.approx([0.95, 1.05, 0.9]) and got["n"] == 3
    assert got["mean"] == pytest.approx(0.9667, abs=1e-4)
    assert got["ci95"] == pytest.approx(4.30 * np.std([0.95, 1.05, 0.9], ddof=1) / math.sqrt(3))
    assert bench.paired_ratios({"rl": runs["rl"]}) is None
    assert math.isinf(bench.paired_ratios({"rl": runs["rl"][:1], "oracle": runs["oracle"][:1]})["ci95"])


def test_only_configurations_measured_above_the_oracle_are_run_fresh(bench):
    initial = {"allocation": {"read": 1, "parse": 1}, "block_rows": 500}

    def held(policy, sps, alloc):
        return {"policy": policy, "samples_per_s": sps, "elapsed_s": 100.0, "final_allocation": alloc,
                "final_block_rows": 8000, "allocations": [[10.0, alloc]], "block_rows_steps": [[5.0, 8000, "probe"]]}

    fast, slow, pick = {"read": 3, "parse": 5}, {"read": 5, "parse": 3}, {"read": 2, "parse": 6}
    results = {"rl": [held("rl", 17_000.0, fast)], "plumber": [held("plumber", 9_000.0, slow)],
               "auto": [held("auto", 16_000.0, pick)], "oracle": [held("oracle", 99_999.0, fast)]}
    got = bench.challengers(results, 13_500.0, 40.0, initial, skip=[{"allocation": pick, "block_rows": 8000}])
    assert got == [{"allocation": fast, "block_rows": 8000}]  # not plumber's (below), not the pick again
    assert bench.challengers(results, 20_000.0, 40.0, initial, skip=[]) == []


def _run(sps: float, intervals: list[float], **extra) -> dict:
    return {"samples_per_s": sps, "interval_samples_per_s": intervals, "stalls": 0, "crash": None, **extra}


def test_the_run_noise_pools_every_policys_rounds_the_oracles_included(bench):
    runs = {"rl": [_run(90.0, []), _run(110.0, [])],
            "plumber": [_run(50.0, []), _run(50.0, [], stalls=1)],  # a stall is a failure, not spread
            "oracle": [_run(120.0, []), _run(100.0, [])]}
    noise = bench.suite_run_noise(runs)
    assert noise["configs"] == ["rl", "oracle"]
    # rl about 100: +-0.1 twice; the oracle about 110: +-10/110 twice; two degrees of freedom
    assert noise["df"] == 2 and noise["rel_sd"] == pytest.approx(((2 * 0.1 ** 2 + 2 * (10 / 110) ** 2) / 2) ** 0.5)


def test_the_check_allows_for_the_drift_between_runs_once_rounds_repeat(bench):
    # within each run the intervals are tight (+-1%), but the runs drift by 10%: rl's 8% lead is noise
    tight = [99.0, 100.0, 101.0, 100.0, 99.0, 101.0, 100.0, 100.0]
    runs = {"rl": [_run(108.0 * 0.9, [x * 0.972 for x in tight]), _run(108.0 * 1.1, [x * 1.188 for x in tight])],
            "oracle": [_run(90.0, [x * 0.9 for x in tight]), _run(110.0, [x * 1.1 for x in tight])]}
    first_round = {p: bench.mean_ci(rs[0]["interval_samples_per_s"]) for p, rs in runs.items()}
    assert not bench.oracle_check(first_round)["ok"]  # judged on one run's intervals, rl "beats" the oracle
    noise = bench.suite_run_noise(runs)
    figs = {p: bench.run_figure([r["samples_per_s"] for r in rs], noise, 1.0) for p, rs in runs.items()}
    assert figs["rl"]["noise"] == bench.POOLED_NOISE
    assert bench.oracle_check(figs)["ok"]
    # ... but a lead far beyond the drift still fails the run
    far = {**runs, "rl": [_run(200.0, []), _run(210.0, [])]}
    noise = bench.suite_run_noise(far)
    figs = {p: bench.run_figure([r["samples_per_s"] for r in rs], noise, 1.0) for p, rs in far.items()}
    assert [v["policy"] for v in bench.oracle_check(figs)["violations"]] == ["rl"]


def test_a_two_round_summary_checks_the_oracle_over_runs_and_says_which_noise(bench, capsys):
    from pathlib import Path

    pipe = bench.load_pipeline(Path(bench.ROOT) / "benchmarks/pipelines/per_task_overhead.yaml")
    alloc = {op.name: op.concurrency for op in pipe.operators}

    def run(sps: float) -> dict:
        return {**_run(sps, [sps * 0.99, sps * 1.01] * 4), "seconds_to_95pct": 30.0, "peak_object_store_bytes": 0,
                "final_allocation": alloc, "moves": []}
    suite = {"runs": {"rl": [run(15_300.0), run(18_700.0)], "oracle": [run(14_000.0), run(16_000.0)]},
             "shift_runs": {}, "ceiling_runs": []}
    s = bench.summarise(pipe, suite, ["rl", "oracle"])
    assert s["run_noise"]["df"] == 2 and s["run_ci"]["rl"]["mean"] == pytest.approx(17_000.0)
    assert s["oracle_check"]["ok"] and s["oracle_check"]["noise"] == bench.POOLED_NOISE
    one_round = bench.summarise(pipe, {**suite, "runs": {p: rs[1:] for p, rs in suite["runs"].items()}}, ["rl", "oracle"])
    assert not one_round["oracle_check"]["ok"]  # 18,700 vs 16,000 on +-1% intervals alone
    bench.print_table("local", s, ["rl", "oracle"])
    assert "pooled run-to-run spread" in capsys.readouterr().out


def test_every_run_gets_its_own_tuner_controller(bench):
    # a reused tuner id reuses its controller and the spec it was made with (the oracle's fresh runs of a
    # round all ran the first one's configuration)
    ids = [bench.run_tuner_id("per_task_overhead-local0-fresh", "static") for _ in range(3)]
    assert len(set(ids)) == 3 and all(i.startswith("per_task_overhead-local0-fresh-static-") for i in ids)


def test_rl_options_from_the_command_line_are_typed_and_a_malformed_one_is_named(bench):
    assert bench.parse_rl_options(["rl_judge_moves=true", "rl_judge_warmup_s=10"]) == {
        "rl_judge_moves": True, "rl_judge_warmup_s": 10}
    with pytest.raises(ValueError, match="'rl_judge_warmup_s': expected KEY=VALUE"):
        bench.parse_rl_options(["rl_judge_warmup_s"])


def test_an_earlier_winner_named_on_the_command_line_is_the_oracles_pick_from_round_one(bench):
    import argparse

    pipe = bench.load_pipeline(bench.ROOT / "benchmarks/pipelines/contended_lookup.yaml")
    pick = bench.parse_oracle_pick("4/6/7/5/2", pipe)
    assert pick == {"allocation": {"read": 4, "parse": 6, "user_lookup": 7, "sparse_hash": 5, "pack": 2},
                    "block_rows": None}
    assert bench.reuses_oracle_pick(0, argparse.Namespace(oracle_search_rounds=0, oracle_pick=pick), {"oracle": []})
    for bad, says in (("4/6/7", "5 slot counts"), ("4/x/7/5/2", "expected slots per operator"),
                      ("4/6/7/5/0", "5 slot counts"), ("4/6/7/5/2@8000", "not resizable")):
        with pytest.raises(ValueError, match=says):
            bench.parse_oracle_pick(bad, pipe)
    sized = bench.load_pipeline(bench.ROOT / "benchmarks/pipelines/per_task_overhead.yaml")
    assert bench.parse_oracle_pick("3/4/9/5/3@8000", sized)["block_rows"] == 8000
    with pytest.raises(SystemExit):  # the oracle must run to be measured
        bench.main(["--pipeline", str(bench.ROOT / "benchmarks/pipelines/contended_lookup.yaml"), "--policies", "rl",
                    "--oracle-pick", "4/6/7/5/2"])


def _rows_at(rates: list[tuple[float, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """A row batch every 0.1 s at ``rate`` rows/s over each (start, end, rate) stretch."""
    ts = np.concatenate([np.arange(a + 0.05, b, 0.1) for a, b, _ in rates])
    rows = np.concatenate([np.full(len(np.arange(a + 0.05, b, 0.1)), r * 0.1) for a, b, r in rates])
    return ts, rows


def test_the_recovery_from_a_cost_shift_counts_from_when_the_shift_reaches_the_sink(bench):
    # shift at 60 s; the blocks in flight carry the old 1,000/s to 70 s, then 500/s until rl moves at 90 s
    ts, rows = _rows_at([(0, 70, 1000.0), (70, 90, 500.0), (90, 130, 900.0)])
    first_reach = bench.seconds_to(ts, rows, 0.95 * 900.0, after=60.0) - 60.0
    recovery = bench.recovery_seconds(ts, rows, 60.0, 900.0, 102.0)
    assert first_reach < 5.0  # the first window after the shift: the shift had not reached the sink
    assert 28.0 <= recovery <= 36.0, recovery


def test_a_shift_the_pipeline_never_felt_takes_no_time_and_a_late_dip_counts(bench):
    ts, rows = _rows_at([(0, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) == 0.0
    # back at once, then a move 40 s on that costs two thirds of the throughput for 6 s
    ts, rows = _rows_at([(0, 60, 1000.0), (60, 100, 1000.0), (100, 106, 300.0), (106, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) >= 46.0
    # the post-shift level's own span swings as deep as 0.75 of it (coarse blocks): no dip
    ts, rows = _rows_at([(0, 60, 1000.0), (60, 115, 1000.0), (115, 120, 500.0), (120, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) == 0.0
    ts, rows = _rows_at([(0, 60, 1000.0), (60, 130, 500.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) is None  # never back at 95%


def test_a_dip_within_the_post_shift_levels_own_noise_is_no_late_recovery(bench):
    # the level swings 930 / 1,070 in 8 s stretches (coarse blocks): its 10 s windows 958-1,042
    def run(dip: float):
        stretches = [(a, min(a + 8, 130), dip if a == 92 else 930.0 if (a // 8) % 2 else 1070.0)
                     for a in range(60, 130, 8)]
        return _rows_at([(0, 60, 1000.0), *stretches])

    ts, rows = run(900.0)  # 8 s at 0.90 of the level: below 95% and its span's lowest window, within 3 sd
    post = float(rows[ts >= 102.0].sum() / (130.0 - 102.0))
    assert bench.recovery_seconds(ts, rows, 60.0, post, 102.0) < 10.0
    strict = {"noise_k": 0.0, "fall_within_s": None, "sustain_s": None}
    assert bench.recovery_seconds(ts, rows, 60.0, post, 102.0, **strict) >= 35.0  # the strict line: a late dip
    ts, rows = run(500.0)  # a move that halved it: a dip however noisy the level
    assert bench.recovery_seconds(ts, rows, 60.0, post, 102.0) >= 35.0


def test_one_window_short_of_the_level_long_after_the_shift_is_no_late_recovery(bench):
    """Live (run 67): the allocation unchanged from 2-3 s after the shift, one 5 s window a block short of the
    level 35 s on read as the shift's arrival, one 10 s window at 0.92 50 s on as a dip: 34.5 / 45 s."""
    one_window = {"fall_within_s": None, "sustain_s": None}
    # 5 s at 0.85 of the level 35 s after a shift the pipeline did not feel
    ts, rows = _rows_at([(0, 95, 1000.0), (95, 100, 850.0), (100, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 102.0, **one_window) >= 35.0
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 102.0) == 0.0
    # the shift felt at once (10 s at half the level), then the same late window: the shift's own fall times it
    ts, rows = _rows_at([(0, 65, 1000.0), (65, 75, 500.0), (75, 95, 1000.0), (95, 100, 850.0), (100, 130, 1000.0)])
    assert 10.0 <= bench.recovery_seconds(ts, rows, 60.0, 1000.0, 102.0) <= 20.0
    # a move that costs a third of the throughput for 7 s, 40 s after the shift, holds the clock however it is read
    ts, rows = _rows_at([(0, 100, 1000.0), (100, 107, 667.0), (107, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) >= 40.0
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0, **one_window) >= 40.0
    # and a level that stays low for 30 s after the shift before a move restores it is a late recovery
    ts, rows = _rows_at([(0, 65, 1000.0), (65, 95, 880.0), (95, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 102.0) >= 30.0
    # a shift that reaches the sink late (a backlog draining for 35 s) and a level low for 15 s after: a dip
    ts, rows = _rows_at([(0, 95, 1000.0), (95, 110, 800.0), (110, 130, 1000.0)])
    assert bench.recovery_seconds(ts, rows, 60.0, 1000.0, 112.0) >= 45.0


def test_the_last_move_after_a_shift_is_timed_from_the_shift(bench):
    """Beside the throughput clock: when the tuner last changed the allocation after the shift (live, storage
    63e / 64b: one move as the shift was told, none after, a "recovery" of 32 / 40.5 s from the level's
    swings). Moves before the shift, and ticks that leave the allocation as it was, do not count."""
    a, b, c = {"x": 2, "y": 2}, {"x": 3, "y": 1}, {"x": 2, "y": 2}
    assert bench.last_move_seconds([[10.0, a], [20.0, b], [30.0, b]], 60.0) == 0.0  # none after the shift
    assert bench.last_move_seconds([[10.0, a], [62.8, b], [70.0, b], [90.0, b]], 60.0) == 2.8
    assert bench.last_move_seconds([[10.0, a], [62.8, b], [95.3, c]], 60.0) == 35.3
    assert bench.last_move_seconds([], 60.0) == 0.0
    assert bench.last_move_seconds([[62.0, a]], 60.0) == 2.0  # the run's first decision, after the shift


def test_a_shift_runs_levels_are_put_against_the_model_optimum_before_and_after_the_shift(bench, capsys):
    """A policy that never recovers from the shift reaches its low level at once, and its recovery time alone
    reads fast (live, rl held per_task_overhead's shifted sparse hash at 6 slots for 70 s: "8.5 s"); the
    summary puts each level against the model's optimum before and after the shift."""
    from pathlib import Path

    pipe = bench.load_pipeline(Path(bench.ROOT) / "benchmarks/pipelines/per_task_overhead.yaml")
    alloc = {op.name: op.concurrency for op in pipe.operators}
    run = {**_run(12_000.0, [12_000.0] * 8), "seconds_to_95pct": 30.0, "peak_object_store_bytes": 0,
           "final_allocation": alloc, "moves": []}
    shift = {**run, "pre_shift_samples_per_s": 12_600.0, "post_shift_samples_per_s": 6_686.0, "recovery_s": 8.5}
    s = bench.summarise(pipe, {"runs": {"rl": [run]}, "shift_runs": {"rl": [shift]}, "ceiling_runs": []}, ["rl"])
    _, pre_opt = bench.expected_optimum(pipe)
    _, post_opt = bench.expected_optimum(pipe.shifted())
    assert s["shift_model_optimum"]["samples_per_s"] == pytest.approx(post_opt) and post_opt < pre_opt
    assert s["shift"]["rl"]["recovered_share_of_model_optimum"] == pytest.approx(6_686.0 / post_opt)
    assert s["shift"]["rl"]["pre_share_of_model_optimum"] == pytest.approx(12_600.0 / pre_opt)
    bench.print_table("local", s, ["rl"])
    assert f"{12_600.0 / pre_opt:.2f} / {6_686.0 / post_opt:.2f} of the model optimum before / after" \
        in capsys.readouterr().out
