"""Precision selection (auto/fp32/bf16 on CPU and GPU) and worker thread planning."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from dlrm_platform.config import JobConfig
from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.train.lockstep import StepBatch
from dlrm_platform.train.loop import Worker
from dlrm_platform.train.model import build_dense_optimizer, build_sharded_model
from dlrm_platform.train.perf import (
    BF16_MIN_DENSE_MACS,
    GPU_BF16_MIN_STEP_MACS,
    Precision,
    configure_threads,
    cpu_flags,
    cpu_has_native_bf16,
    dense_macs_per_sample,
    plan_threads,
    resolve_precision,
)
from dlrm_platform.train.mlflow_logger import NullTracker

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
NO_BF16 = {"avx2", "fma", "avx512f"}
AVX512_BF16 = NO_BF16 | {"avx512_bf16"}
AMX = NO_BF16 | {"amx_bf16", "amx_tile"}

CRITEO = {"label": "label", "item": {"dense": [f"d{i}" for i in range(13)],
                                     "categorical": [f"c{i}" for i in range(26)]}}
DEMO = {"label": "label",
        "user": {"dense": ["ud0", "ud1", "ud2"], "categorical": ["uc0", "uc1", "uc2"], "multi_hot": ["hist"]},
        "item": {"dense": ["id0", "id1", "id2"], "categorical": ["ic0", "ic1", "ic2"]}}


def _job(columns, bottom, top, precision="auto") -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": "/tmp/unused", "columns": columns},
        "train": {"embedding_dim": 16, "bottom_mlp": bottom, "top_mlp": top, "precision": precision},
    })


def criteo(precision="auto") -> JobConfig:
    return _job(CRITEO, [512, 256, 64, 16], [512, 256, 1], precision)


def demo(precision="auto") -> JobConfig:
    return _job(DEMO, [64, 16], [64, 1], precision)


def test_default_precision_is_auto() -> None:
    assert demo().train.precision == "auto"
    assert JobConfig.model_validate({"data": {"path": "/x", "columns": DEMO}}).train.precision == "auto"


def test_cpu_flags_parsed_from_cpuinfo(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n")
    flags = cpu_flags(info)
    assert {"avx512_bf16", "amx_tile", "fpu"} <= flags and "model" not in flags
    assert cpu_has_native_bf16(flags)
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert not cpu_has_native_bf16(set())


def test_dense_macs_per_sample() -> None:
    # bottom 13*512 + 512*256 + 256*64 + 64*16; top input 16 + 27*26/2 = 367: 367*512 + 512*256 + 256*1
    assert dense_macs_per_sample(criteo()) == 155_136 + 319_232
    # demo: 6*64 + 64*16; top input 16 + 8*7/2 = 44: 44*64 + 64
    assert dense_macs_per_sample(demo()) == 1_408 + 2_880
    assert dense_macs_per_sample(demo()) < BF16_MIN_DENSE_MACS < dense_macs_per_sample(criteo())


@pytest.mark.parametrize(
    ("job", "flags", "expected", "reason"),
    [
        (criteo(), AVX512_BF16, "bf16", "avx512_bf16"),
        (criteo(), AMX, "bf16", "amx_bf16"),
        (criteo(), NO_BF16, "fp32", "neither AVX512-BF16 nor AMX"),
        (demo(), AVX512_BF16, "fp32", "too small"),
        (criteo("fp32"), AVX512_BF16, "fp32", "requested"),
        (demo("bf16"), AVX512_BF16, "bf16", "requested"),
        (criteo("bf16"), NO_BF16, "bf16", "emulated"),
    ],
)
def test_cpu_precision(job, flags, expected, reason) -> None:
    p = resolve_precision(job, CPU, flags=flags)
    assert p.name == expected and reason in p.reason and not p.tf32
    assert p.requested == job.train.precision
    assert f"precision {expected}" in p.describe() and reason in p.describe()


@pytest.mark.parametrize(
    ("precision", "cuda_bf16", "expected", "tf32"),
    [
        ("auto", True, "fp32", True),  # Ampere or newer, small MLPs: TF32, no autocast
        ("auto", False, "fp32", False),  # older GPUs
        ("fp32", True, "fp32", False),
        ("bf16", True, "bf16", True),
        ("bf16", False, "bf16", False),
    ],
)
def test_gpu_precision_ignores_the_cpu(precision, cuda_bf16, expected, tf32) -> None:
    p = resolve_precision(demo(precision), CUDA, flags=AVX512_BF16, cuda_bf16=cuda_bf16)
    assert (p.name, p.tf32) == (expected, tf32)
    assert ("+ TF32 matmuls" in p.describe()) == tf32


@pytest.mark.parametrize(("batch_size", "expected"), [(2048, "fp32"), (16384, "fp32"), (65536, "bf16")])
def test_gpu_auto_picks_bf16_only_for_enough_mlp_work_per_step(batch_size, expected) -> None:
    # Measured on an H100 with the Criteo model: bf16 0.83x of fp32 at batch 2048, equal at 16384.
    job = criteo()
    job = job.model_copy(update={"ingest": job.ingest.model_copy(update={"batch_size": batch_size})})
    p = resolve_precision(job, CUDA, flags=NO_BF16, cuda_bf16=True)
    step = dense_macs_per_sample(job) * batch_size
    assert p.name == expected and p.tf32
    assert (step >= GPU_BF16_MIN_STEP_MACS) == (expected == "bf16")
    assert "multiply-adds per step" in p.reason


def test_autocast_contexts() -> None:
    with Precision("bf16", "auto", "x").autocast("cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with Precision("fp32", "auto", "x").autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    assert Precision("bf16", "auto", "x").autocast_dtype == torch.bfloat16
    assert Precision("fp32", "auto", "x").autocast_dtype is None


def test_worker_resolves_precision_and_trains_in_bf16(tiny_job, packed_batch, gloo_group) -> None:
    job = tiny_job(precision="bf16")
    model = build_sharded_model(job, CPU)
    worker = Worker(job, model, build_dense_optimizer(model, job.train), CPU, 0, 1, NullTracker())
    assert worker.precision.name == "bf16"
    batch = unpack_batch(packed_batch(32), ["uc", "hist", "ic"], 3)
    with worker.autocast():
        loss, logits = worker.model(batch)
    assert loss.dtype == torch.float32  # the loss autocasts back to fp32
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    assert tables and all(p.dtype == torch.float32 for p in tables)  # embeddings stay fp32
    losses = [worker.train_step(StepBatch(batch, 32, 32, 0.0)) / 32 for _ in range(30)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.7 * losses[0]
    # The tiny job's MLPs are far below the bf16 threshold: auto keeps it in fp32 on any CPU.
    auto = Worker(tiny_job(), model, worker.dense_optimizer, CPU, 0, 1, NullTracker())
    assert auto.precision.name == "fp32"


@pytest.mark.parametrize(
    ("assigned", "visible", "local", "intra"),
    [
        (1.0, 2, 1, 1),  # the demo: one worker with 1 CPU on 2 cores
        (0.5, 2, 2, 1),  # fractional CPUs: never 0 threads
        (2.0, 8, 2, 2),  # as assigned
        (2.9, 16, 1, 2),  # floored
        (4.0, 2, 2, 1),  # more logical CPUs than cores: capped at the worker's share of the node
        (8.0, 16, 4, 4),
        (None, 8, 2, 4),  # nothing assigned: the worker's share of the visible CPUs
        (None, 1, 4, 1),
    ],
)
def test_plan_threads(assigned, visible, local, intra) -> None:
    plan = plan_threads(assigned, visible, local)
    assert (plan.intra_op, plan.inter_op) == (intra, 1)
    assert intra * local <= max(visible, local)  # no oversubscription of the node
    assert f"{intra} intra-op" in plan.describe()
    if assigned is not None and math.floor(assigned) > visible // local:
        assert "capped" in plan.reason


def test_configure_threads_sets_and_reports_torch_threads() -> None:
    # A fresh interpreter: the inter-op pool can only be sized before first use.
    code = (
        "import json, os, torch\n"
        "from dlrm_platform.train.perf import configure_threads, plan_threads\n"
        "got = configure_threads(plan_threads(2.0, 4, 1))\n"
        "print(json.dumps([got.intra_op, got.inter_op, torch.get_num_threads(), torch.get_num_interop_threads(),"
        " os.environ['OMP_NUM_THREADS'], got.reason]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    intra, inter, torch_intra, torch_inter, omp, reason = json.loads(out.stdout.strip().splitlines()[-1])
    assert (intra, inter, torch_intra, torch_inter, omp) == (2, 1, 2, 1, "2")
    assert "assigned 2 CPU" in reason


def test_configure_threads_when_the_interop_pool_is_already_sized() -> None:
    # torch sizes the inter-op pool once per process; a second request is reported, not fatal.
    code = (
        "import dataclasses, json, torch\n"
        "from dlrm_platform.train.perf import configure_threads, plan_threads\n"
        "torch.set_num_interop_threads(3)\n"
        "got = configure_threads(plan_threads(1.0, 4, 1))\n"
        "print(json.dumps([got.intra_op, got.inter_op, got.reason]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    intra, inter, reason = json.loads(out.stdout.strip().splitlines()[-1])
    assert (intra, inter) == (1, 3)  # what torch really runs with is what gets reported
    assert "inter-op pool already started, left as is" in reason


def test_fp32_islands_inside_the_bf16_forward(tiny_job, packed_batch) -> None:
    from torchrec.models.dlrm import InteractionArch

    from dlrm_platform.train.model import build_dlrm
    from dlrm_platform.train.perf import FP32_ISLAND_MAX_OUT, install_fp32_islands

    job = tiny_job(bottom_mlp=[64, 8], top_mlp=[64, 1])
    model = build_dlrm(job, "cpu")
    names = install_fp32_islands(model, "cpu")
    assert install_fp32_islands(model, "cpu") == names  # idempotent
    narrow = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features < 32]
    assert FP32_ISLAND_MAX_OUT == 32 and len(narrow) == 2  # the bottom MLP's 64->8 and the logit layer
    assert set(names) == {*narrow, "model.inter_arch"}
    dtypes: dict[str, torch.dtype] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, InteractionArch)):
            module.register_forward_hook(lambda m, a, out, name=name: dtypes.__setitem__(name, out.dtype))
    batch = unpack_batch(packed_batch(16), ["uc", "hist", "ic"], 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, logits = model(batch)
        assert torch.is_autocast_enabled("cpu")  # restored after every island
    assert {dtypes[n] for n in names} == {torch.float32}
    wide = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features >= 32]
    assert wide and {dtypes[n] for n in wide} == {torch.bfloat16}
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for n, p in model.named_parameters()
               if "embedding_bags" not in n)
    dtypes.clear()
    model(batch)  # no autocast: the hooks do nothing
    assert set(dtypes.values()) == {torch.float32}


def test_indexed_device_gives_cuda_an_index_and_leaves_the_rest(monkeypatch):
    from dlrm_platform.train.perf import indexed_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert indexed_device("cuda") == torch.device("cuda", 1)
    assert indexed_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert indexed_device("cpu") == torch.device("cpu")
