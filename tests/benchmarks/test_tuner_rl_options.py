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
                       "--seeds", "1", "--held-out", "0", "--workers", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "CPU:" in printed and "contended_lookup@0.4/lookup" in printed and "x)" in printed
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"default", "off"}
    for arm in res.values():
        assert 0.0 < arm["mean/all"] <= 1.0 and 0.0 < arm["contended_lookup@0.4/lookup"] <= 1.0
