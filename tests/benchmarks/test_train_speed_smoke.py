"""Smoke run of benchmarks/train_speed.py at tiny sizes: it runs end to end and writes the promised JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_train_speed_smoke(tmp_path):
    out = tmp_path / "train_speed.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "train_speed.py"),
        "--hash-size", "500", "--batch-size", "64", "--batches", "2", "--rounds", "2", "--steps", "1",
        "--session-samples", "1200", "--auc-sessions", "200", "--auc-batch-size", "128", "--no-auc-criteo-mlps",
        "--workdir", str(tmp_path / "work"), "--json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    for key in ("reference", "torchrec", "ours", "ours_dedup", "ratio_ours_vs_reference", "ratio_ours_vs_torchrec",
                "ratio_ours_dedup_vs_torchrec"):
        assert isinstance(figures[key], float) and math.isfinite(figures[key]) and figures[key] > 0, key
    for key in ("reference_sparse", "torchrec_sessions", "ours_sessions", "dense_fp32", "dense_bf16", "cpu_ours",
                "cpu_torchrec", "ours_dedup_demo_mlps", "cpu_ratio_ours_dedup_vs_torchrec"):
        assert figures[key] > 0, key
    assert figures["ratio_ours_vs_torchrec"] == pytest.approx(figures["ours"] / figures["torchrec"])
    assert figures["ratio_ours_dedup_vs_torchrec"] == pytest.approx(
        figures["ours_dedup"] / figures["torchrec_sessions"])
    assert figures["session_dedup_factor"] > 1.0
    assert 0.0 <= figures["auc_fp32"] <= 1.0 and 0.0 <= figures["auc_bf16"] <= 1.0
    assert figures["ours_precision"] in ("fp32", "bf16")
    # The printed table names every variant and the targets.
    for name in ("reference", "torchrec", "ours", "ours_dedup", "targets:"):
        assert name in proc.stdout
