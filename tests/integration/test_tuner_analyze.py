"""`dlrm-platform analyze` on a small pipeline file: the report names the bottleneck."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

PIPELINE = """
name: tiny
rows_per_block: 1000
row_bytes: 64
cluster: {num_cpus: 8, data_cpus: 6, object_store_mb: 300}
operators:
  - {name: read, ms_per_1k_rows: 40, concurrency: 2}
  - {name: parse, ms_per_1k_rows: 400, concurrency: 2}
  - {name: dedup, ms_per_1k_rows: 40, concurrency: 2, element_ratio: 0.9}
"""


def test_analyze_json_report(tmp_path, capsys):
    import ray

    from dlrm_platform.cli import main

    if ray.is_initialized():
        ray.shutdown()
    path = tmp_path / "tiny.yaml"
    path.write_text(PIPELINE)
    profile = tmp_path / "profile.json"
    assert main(["analyze", str(path), "--json", "--seconds", "12", "--profile-out", str(profile)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bottleneck"] == "parse"
    assert report["current_allocation"] == {"read": 2, "parse": 2, "dedup": 2}
    rec = report["recommended_allocation"]
    assert sum(rec.values()) <= 6 and rec["parse"] >= 3
    assert report["predicted_max_throughput"] > report["observed_throughput"] > 0
    by = {o["name"]: o for o in report["operators"]}
    assert by["parse"]["rate_per_core"] < by["read"]["rate_per_core"]
    assert 0.8 < by["dedup"]["element_ratio"] <= 1.0
    prof = json.loads(profile.read_text())
    assert [o["name"] for o in prof["ops"]] == ["read", "parse", "dedup"] and prof["cpu_budget"] == 6
    assert not ray.is_initialized()  # analyze started and stopped its own cluster


def test_analyze_rejects_a_bad_pipeline_file(tmp_path, capsys):
    from dlrm_platform.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("name: x\noperators:\n  - {name: read, ms_per_1k_rows: -1, colour: red}\n")
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "operators.0.ms_per_1k_rows" in err and "operators.0.colour" in err
