"""How a training worker uses its hardware: numeric precision and CPU threads.

Both are decided once per worker, before the model is built, logged in the
run log with the reason, and reported with the epoch metrics.

Precision (``train.precision``)::

    fp32   everything in float32
    bf16   torch.autocast(bfloat16) around forward: the MLP layers run in
           bf16; the embedding tables, their fused row-wise Adagrad update
           (fbgemm), the loss and two fp32 islands stay float32 (below)
    auto   CPU: bf16 when the CPU has native bf16 instructions (AVX512-BF16
                or AMX, read from /proc/cpuinfo) *and* the MLPs are big
                enough to gain (>= BF16_MIN_DENSE_MACS multiply-adds per
                sample), else fp32
           GPU: on Ampere and newer, TF32 for the fp32 matmuls, and bf16 only
                when the MLPs do enough work per step to gain from it
                (>= GPU_BF16_MIN_STEP_MACS forward multiply-adds: per-sample
                MACs x batch size); before Ampere fp32

Why the size rule on GPU (measured on an H100, torch 2.11, stock TorchRec
vs this trainer, Criteo Kaggle model, ~475k MACs/sample): bf16 autocast ran
the step at 0.83x of fp32 at batch 2048 (1G MACs per step) and only equal at
16384 (7.8G): at these sizes the casts and extra kernels cost what the
tensor cores save. The threshold sits at twice the largest size measured,
where bf16 only tied; larger MLPs or batches (where tensor-core throughput
dominates) get bf16.

Why the size rule on CPU (measured on this repo's 2-core AVX512-BF16 machine,
no AMX, 1 thread, steps interleaved with fp32, medians): autocast casts the
weights and activations of every layer; on narrow layers the casts and
oneDNN's bf16 path for small matrices cost more than the GEMMs save.
Demo model (MLPs 64-16 / 64-1, ~4k MACs/sample): bf16 0.80-0.85x of fp32;
MLPs 128-64-16 / 128-64-1 (~24k): 0.82x; 256-64-16 / 256-128-1 (~63k): 1.69x;
the Criteo Kaggle model (512-256-64-16 / 512-256-1, ~480k): 2.4-2.5x.
``benchmarks/train_speed.py`` re-measures the last one.

fp32 islands (:func:`install_fp32_islands`): inside the bf16 forward, the
pairwise-dot interaction and every Linear layer narrower than
``FP32_ISLAND_MAX_OUT`` outputs (the logit layer, the bottom MLP's last
layer) run in fp32. Both are cheap, both were measured no faster in bf16
(a 256->1 layer 20x slower, the interaction's small batched matmuls 1.3-3x
slower) and both sit where bf16's 8-bit mantissa hurts: the dot products
are the model's feature crosses and the logit feeds the loss directly.

Threads: intra-op threads = the CPUs Ray assigned to this worker (floored,
at least 1), capped at the CPUs this process may run on divided by the
workers on the node, so that workers sharing a node never oversubscribe
it even when the cluster declares more logical CPUs than there are cores;
one inter-op thread (the step has no inter-op parallelism to exploit).
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are set to the same count for
libraries initialised later.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from dlrm_platform.config import JobConfig

__all__ = [
    "BF16_MIN_DENSE_MACS",
    "GPU_BF16_MIN_STEP_MACS",
    "FP32_ISLAND_MAX_OUT",
    "Precision",
    "ThreadPlan",
    "apply_precision",
    "configure_threads",
    "cpu_flags",
    "cpu_has_native_bf16",
    "dense_macs_per_sample",
    "install_fp32_islands",
    "mlp_macs",
    "plan_threads",
    "ray_assigned_cpus",
    "resolve_precision",
    "visible_cpus",
]

log = logging.getLogger(__name__)

# Multiply-adds per sample of the MLPs (forward) from which bf16 autocast pays on a CPU (see the docstring).
BF16_MIN_DENSE_MACS = 40_000

# Forward multiply-adds of the MLPs per step (per sample x batch size) from which bf16 autocast is chosen on a GPU.
GPU_BF16_MIN_STEP_MACS = 16_000_000_000

# Linear layers with fewer outputs than this stay fp32 inside the bf16 forward (see the docstring).
FP32_ISLAND_MAX_OUT = 32

# /proc/cpuinfo flags of native bf16 arithmetic: AVX512-BF16 (dot products) and AMX tiles.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

PrecisionName = Literal["fp32", "bf16"]


# --------------------------------------------------------------------------- precision


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags (Linux ``/proc/cpuinfo``); empty where that file does not exist."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU computes in bf16 natively (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    return any(f in flags for f in NATIVE_BF16_FLAGS)


def mlp_macs(in_features: int, layer_sizes: Sequence[int]) -> int:
    """Forward multiply-adds per sample of an MLP with these layer sizes (biases not counted)."""
    return sum(a * b for a, b in zip([in_features, *layer_sizes[:-1]], layer_sizes, strict=True))


def dense_macs_per_sample(job: JobConfig) -> int:
    """Forward multiply-adds per sample of the bottom and top MLPs (the part autocast moves to bf16)."""
    train = job.train
    num_dense = len(job.data.columns.dense_columns)
    num_sparse = len(job.data.columns.sparse_features)
    top_in = train.embedding_dim + (num_sparse + 1) * num_sparse // 2
    return mlp_macs(num_dense, train.bottom_mlp) + mlp_macs(top_in, train.top_mlp)


@dataclass(frozen=True)
class Precision:
    """The precision a worker trains in, and why."""

    name: PrecisionName
    requested: str  # train.precision as configured
    reason: str
    tf32: bool = False  # GPU only: TF32 for the matmuls left in fp32

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.name == "bf16" else None

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        """The context the forward pass runs in."""
        if self.name == "bf16":
            return torch.autocast(device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def describe(self) -> str:
        extra = " + TF32 matmuls" if self.tf32 else ""
        return f"precision {self.name}{extra} (train.precision={self.requested}): {self.reason}"


def resolve_precision(
    job: JobConfig,
    device: torch.device | str,
    *,
    flags: Iterable[str] | None = None,
    cuda_bf16: bool | None = None,
) -> Precision:
    """The precision ``job`` trains in on ``device`` (see the module docstring).

    ``flags`` (CPU feature flags) and ``cuda_bf16`` (whether the GPU supports
    bf16) default to the machine's own; tests pass them explicitly.
    """
    device = torch.device(device)
    requested = job.train.precision
    if device.type == "cuda":
        if cuda_bf16 is None:
            cuda_bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if requested == "fp32":
            return Precision("fp32", requested, "requested")
        if requested == "bf16":
            why = "requested" if cuda_bf16 else "requested, although this GPU has no native bf16 (emulated, slow)"
            return Precision("bf16", requested, why, tf32=cuda_bf16)
        if not cuda_bf16:
            return Precision("fp32", requested, "the GPU has no native bf16 (before Ampere; no TF32 either)")
        step = dense_macs_per_sample(job) * job.ingest.batch_size
        if step >= GPU_BF16_MIN_STEP_MACS:
            return Precision("bf16", requested, (
                f"the GPU supports bf16 and the MLPs do {step / 1e9:.1f}G multiply-adds per step "
                f"(>= {GPU_BF16_MIN_STEP_MACS / 1e9:.0f}G)"), tf32=True)
        return Precision("fp32", requested, (
            f"the MLPs do {step / 1e9:.2f}G multiply-adds per step (< {GPU_BF16_MIN_STEP_MACS / 1e9:.0f}G): "
            f"measured slower in bf16 than in fp32 on an H100 below that"), tf32=True)

    native = cpu_has_native_bf16(flags)
    macs = dense_macs_per_sample(job)
    if requested == "fp32":
        return Precision("fp32", requested, "requested")
    if requested == "bf16":
        why = "requested" if native else "requested, although this CPU has no AVX512-BF16/AMX (emulated, slow)"
        return Precision("bf16", requested, why)
    if not native:
        return Precision("fp32", requested, "this CPU has neither AVX512-BF16 nor AMX")
    if macs < BF16_MIN_DENSE_MACS:
        return Precision("fp32", requested, (
            f"the CPU has native bf16 but the MLPs are too small to gain from it ({macs:,} multiply-adds per "
            f"sample < {BF16_MIN_DENSE_MACS:,}; measured slower in bf16 below that)"))
    have = sorted(f for f in NATIVE_BF16_FLAGS if f in frozenset(cpu_flags() if flags is None else flags))
    return Precision("bf16", requested, (
        f"the CPU has native bf16 ({', '.join(have)}) and the MLPs do {macs:,} multiply-adds per sample "
        f"(>= {BF16_MIN_DENSE_MACS:,})"))


_ISLAND_ATTR = "_dlrm_fp32_island"


def _is_island(module: torch.nn.Module) -> bool:
    from torchrec.models.dlrm import InteractionArch

    if isinstance(module, InteractionArch):
        return True
    return isinstance(module, torch.nn.Linear) and module.out_features < FP32_ISLAND_MAX_OUT


def install_fp32_islands(model: torch.nn.Module, device_type: str) -> list[str]:
    """Make the interaction and the narrow Linear layers of ``model`` run in fp32 under autocast.

    Forward hooks: before such a module, autocast is switched off and its
    floating-point inputs are cast to fp32; after it, autocast is restored.
    Without autocast the hooks do nothing. Idempotent; parameters and state
    dicts are untouched. Returns the names of the modules it applies to.
    """
    names = []
    for name, module in model.named_modules():
        if not _is_island(module):
            continue
        names.append(name)
        if getattr(module, _ISLAND_ATTR, None) is not None:
            continue
        stack: list[bool] = []  # per call: whether this call switched autocast off (calls may nest)

        def before(mod, args, kwargs, stack=stack):
            if not torch.is_autocast_enabled(device_type):
                stack.append(False)
                return None
            stack.append(True)
            torch.set_autocast_enabled(device_type, False)
            cast = lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

        def after(mod, args, output, stack=stack):
            if stack.pop():
                torch.set_autocast_enabled(device_type, True)

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after)
        setattr(module, _ISLAND_ATTR, device_type)
    return names


def apply_precision(precision: Precision, device: torch.device | str) -> None:
    """Process-wide settings that go with ``precision`` (TF32 on CUDA). Autocast itself is per step."""
    if torch.device(device).type == "cuda" and precision.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# --------------------------------------------------------------------------- threads


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with an explicit index: ``cuda`` becomes ``cuda:<current>``.

    ``torch.cuda.set_device(torch.device("cuda"))`` raises ValueError (no
    index); Ray Train's ``get_device()`` and a user's ``--device cuda`` can
    both hand over that form. CPU devices come back unchanged.
    """
    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


def visible_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ray_assigned_cpus() -> float | None:
    """The CPUs Ray assigned to the calling task or actor; None outside a Ray worker."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        return ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # not in a Ray worker, or an API change: fall back to the config
        return None


@dataclass(frozen=True)
class ThreadPlan:
    """Threads for one worker and the figures they were derived from."""

    intra_op: int
    inter_op: int
    assigned_cpus: float | None  # what Ray gave the worker (None: unknown)
    visible_cpus: int  # CPUs of this process's affinity mask
    local_workers: int  # training workers on this node
    reason: str

    def describe(self) -> str:
        return f"threads: {self.intra_op} intra-op, {self.inter_op} inter-op ({self.reason})"


def plan_threads(assigned_cpus: float | None, visible: int, local_workers: int = 1) -> ThreadPlan:
    """Intra-op threads = floor(assigned CPUs), at least 1, at most ``visible // local_workers``."""
    local_workers = max(1, local_workers)
    share = max(1, visible // local_workers)
    if assigned_cpus is None:
        intra, why = share, f"no CPU assignment known: {visible} visible CPUs / {local_workers} worker(s) on the node"
    else:
        intra = max(1, math.floor(assigned_cpus + 1e-9))
        why = f"Ray assigned {assigned_cpus:g} CPU(s)"
        if intra > share:
            why += f", capped at {visible} visible CPUs / {local_workers} worker(s) on the node"
            intra = share
    return ThreadPlan(intra, 1, assigned_cpus, visible, local_workers, why)


def configure_threads(plan: ThreadPlan) -> ThreadPlan:
    """Apply ``plan`` to torch (and the OpenMP/MKL env); return what torch reports afterwards.

    ``torch.set_num_interop_threads`` only works before the first inter-op
    parallel work of the process; if that has happened, the inter-op count
    stays as it is and the returned plan says so.
    """
    torch.set_num_threads(plan.intra_op)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(plan.intra_op)
    reason = plan.reason
    if torch.get_num_interop_threads() != plan.inter_op:
        try:
            torch.set_num_interop_threads(plan.inter_op)
        except RuntimeError:
            reason += "; inter-op pool already started, left as is"
    return ThreadPlan(torch.get_num_threads(), torch.get_num_interop_threads(), plan.assigned_cpus,
                      plan.visible_cpus, plan.local_workers, reason)
