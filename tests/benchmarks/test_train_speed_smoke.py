"""benchmarks/train_speed.py: its timing measures what it claims, its variants train the same
samples, and (smoke, slow) it runs end to end at tiny sizes and writes the promised JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import benchmark_module

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("train_speed") as mod:
        yield mod


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_measure_times_only_the_training_steps(bench, monkeypatch):
    """samples/s = samples trained / seconds inside ``run`` (warm-up and release excluded), every
    round on the same batches for every variant, the order rotated."""
    import torch

    wall, cpu = FakeClock(), FakeClock()
    monkeypatch.setattr(bench.time, "perf_counter", wall)
    monkeypatch.setattr(bench.time, "process_time", cpu)
    calls: list[tuple[str, list[int]]] = []

    class Fake(bench.Variant):
        def __init__(self, name: str, s_per_batch: float, cpu_per_batch: float) -> None:
            self.name, self.s, self.c = name, s_per_batch, cpu_per_batch

        def run(self, indices):
            calls.append((self.name, list(indices)))
            wall.t += self.s * len(indices)
            cpu.t += self.c * len(indices)
            return 64 * len(indices)

        def release(self):
            wall.t += 10.0  # must not count
            cpu.t += 10.0

    t = bench.measure([Fake("a", 0.5, 1.0), Fake("b", 0.25, 0.25)], num_batches=5, rounds=3, steps=2,
                      device=torch.device("cpu"), warmup=2)
    assert t["a"].samples_per_s == [128.0] * 3 and t["b"].samples_per_s == [256.0] * 3
    assert t["a"].samples_per_cpu_s == [64.0] * 3 and t["b"].samples_per_cpu_s == [256.0] * 3
    timed = calls[2:]  # after one warm-up call per variant
    assert [c[0] for c in timed] == ["a", "b", "b", "a", "a", "b"]
    assert [c[1] for c in timed] == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 0], [4, 0]]


@pytest.mark.slow
def test_the_variants_train_the_same_samples_and_learn(bench):
    """Reference, stock TorchRec and ours each train on the batches they are given (same sample
    count) and update their weights: none of them is fast for doing nothing."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    device = torch.device("cpu")
    bench.init_process_group(device)
    try:
        job = bench.criteo_job(500, 64)
        packed = bench.criteo_batches(job, 3)
        cols = job.data.columns
        from dlrm_platform.train.batches import unpack_batch

        batches = [unpack_batch(t, cols.sparse_features, len(cols.dense_columns)) for t in packed]
        ref = bench.Reference(job, batches, device, sparse=False)
        stock = bench.StockTorchRec(job, batches, device)
        ours = bench.Ours(job, packed, device)

        def weights(v) -> dict[str, torch.Tensor]:
            module = {"reference": lambda: torch.nn.ModuleList([ref.emb_l, ref.bot_l, ref.top_l]),
                      "torchrec": lambda: stock.model, "ours": lambda: ours.model}[v.name]()
            out = {}
            for k, x in module.state_dict().items():
                if hasattr(x, "local_shards"):  # a sharded embedding table
                    x = torch.cat([s.tensor.flatten() for s in x.local_shards()])
                if isinstance(x, torch.Tensor) and x.is_floating_point():
                    out[k] = x.detach().clone()
            return out

        for v in (ref, stock, ours):
            before = weights(v)
            assert v.run([0, 1, 2]) == 3 * 64, v.name
            after = weights(v)
            changed = [k for k in before if not torch.equal(before[k], after[k])]
            assert len(changed) >= len(before) // 2, (v.name, len(changed), len(before))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.slow
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
                "cpu_torchrec", "ours_dedup_demo_mlps", "cpu_ratio_ours_dedup_vs_torchrec", "ours_user_once",
                "dedup_lookup_bound", "dedup_lookup_bound_amdahl", "ours_dedup_vs_bound"):
        assert figures[key] > 0, key
    for name in ("reference", "torchrec", "ours", "ours_sessions", "ours_dedup"):  # every round was timed
        assert len(figures["rounds_samples_per_s"][name]) == 2, name
    assert figures["session_dedup_factor"] > 1.0
    assert 0.0 <= figures["auc_fp32"] <= 1.0 and 0.0 <= figures["auc_bf16"] <= 1.0
    assert figures["ours_precision"] in ("fp32", "bf16")
    # The printed table names every variant and the targets.
    for name in ("reference", "torchrec", "ours", "ours_dedup", "targets:"):
        assert name in proc.stdout
