"""The rl-options benchmark (benchmarks/tuner_rl_options.py): its arms parse, and a one-seed run compares
them with the default on the same simulated pipelines."""

from __future__ import annotations

import json

import pytest
from testkit import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("tuner_rl_options") as mod:
        yield mod


def test_an_arm_is_a_name_and_a_json_object_of_rl_options(bench):
    assert bench.parse_arm('h={"rl_limit_hysteresis": null}') == ("h", {"rl_limit_hysteresis": None})
    with pytest.raises(SystemExit, match="NAME=JSON"):
        bench.parse_arm('{"rl_limit_hysteresis": 0.1}')
    with pytest.raises(SystemExit, match="not JSON"):
        bench.parse_arm("h={rl_limit_hysteresis: 0.1}")
    with pytest.raises(SystemExit, match="JSON object"):
        bench.parse_arm("h=[1]")


def test_one_seed_compares_an_arm_with_the_default_on_the_same_pipelines(bench, tmp_path, capsys):
    out = tmp_path / "options.json"
    assert bench.main(["--arm", 'off={"rl_limit_hysteresis": null, "rl_delivered_window_s": null}',
                       "--seeds", "1", "--shift-seeds", "1", "--held-out", "0", "--workers", "1",
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "CPU:" in printed and "contended_lookup@0.4/lookup" in printed and "x)" in printed
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"default", "off"}
    assert "shift max contended_lookup" in printed and "shift runs > 30 s" in printed
    for arm in res.values():
        assert 0.0 < arm["mean/all"] <= 1.0 and 0.0 < arm["contended_lookup@0.4/lookup"] <= 1.0
        # each suite pipeline's cost shift: seconds to 95% of the post-shift level (a step is a second)
        assert all(1.0 <= arm[f"shift max {p}"] <= 130.0 for p in bench.PIPELINES)
        assert arm["shift runs > 30 s"] == sum(arm[f"shift max {p}"] > 30.0 for p in bench.PIPELINES)
        assert 0.5 < arm["shift post-shift share"] <= 1.0


def test_a_shift_run_times_the_recovery_to_its_own_post_shift_level(bench):
    # storage_saturated recovers within seconds in every simulated seed (tuner/README.md)
    recovery, share = bench._shift_run(({}, "storage_saturated", 0))
    assert recovery is not None and 1.0 <= recovery <= 30.0
    assert 0.8 < share <= 1.0
