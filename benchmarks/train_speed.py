"""DLRM training speed: the platform's trainer against the reference and stock TorchRec, side by side.

    .venv/bin/python benchmarks/train_speed.py [--quick] [--json PATH] [--hash-size N] [--batch-size B]
        [--threads T] [--rounds R] [--steps S] [--session-samples N] [--auc-sessions N] [--no-auc]
        [--no-sessions] [--demo-summary PATH] [--device cpu|cuda]

Every variant trains the same DLRM on the same batches in this process; the
variants take turns (a few steps each, order rotated every round) and the
figure of a variant is the median over rounds of its samples/s, so that the
noise of a shared machine hits every variant alike.

Criteo Kaggle shape (``configs/criteo_kaggle.yaml``: 13 dense, 26 sparse
features, every table ``--hash-size`` rows, embedding dim 16, bottom MLP
512-256-64-16, top MLP 512-256-1; ids Zipf-distributed):

* ``reference``         DLRM as facebookresearch/dlrm's ``dlrm_s_pytorch.py`` builds it (a list of
                        ``nn.EmbeddingBag``, MLPs, dot interaction, BCE, SGD), fp32, with *dense*
                        embedding gradients: every step materialises and applies a gradient the
                        size of every table (the issue's reference)
* ``reference_sparse``  (context) the same with ``sparse=True``, which is dlrm_s_pytorch's own default
* ``torchrec``          stock TorchRec as its DLRM example trains it (torchrec_dlrm/dlrm_main.py):
                        ``torchrec.models.dlrm.DLRMTrain``, row-wise Adagrad fused into the
                        backward, the planner's sharding, ``DistributedModelParallel``, Adagrad
                        for the MLPs, ``TrainPipelineSparseDist``, fp32
* ``ours``              the platform's trainer, dedup off: the Criteo job config, its sharded
                        model and ``Worker.train_step``, fed by ``lockstep_batches`` from packed
                        Arrow batches (it pays its own unpacking, overlapped by the read-ahead
                        thread; the others get ready-made tensors); precision ``auto``
* ``dense_fp32``/``dense_bf16``  (breakdown) the MLPs and interaction alone, forward + backward +
                        Adagrad, on the same dense inputs and fixed embeddings

Session data (the synthetic generator's schema, ``configs/demo.yaml``, with
the Criteo MLPs; ``--session-samples`` samples, exactly 8 per session,
random row order; converted to the session-dedup format and cut into IKJT
batches by the dedup pipeline's operators):

* ``torchrec_sessions`` stock TorchRec (as above) on the same samples, each dedup batch expanded
                        to the plain batch of the same samples
* ``ours_sessions``     the platform's trainer, dedup off, on those plain batches
* ``ours_dedup``        the platform's trainer with ``ingest.dedup: true`` (the dedup-aware
                        DLRM, user side once per user row) on the IKJT batches
* ``ours_no_user_lookups``, ``ours_user_once``  breakdown and bound: ``ours_sessions`` with every
                        user bag empty (the naive Amdahl bound divides all of that work by the
                        dedup factor), and with each user row's bags in its first sample only
                        (ids pooled once, the same rows updated: what deduplicating the lookups
                        can save at most, since the optimizer's work per distinct row stays)

AUC: the demo model on the demo's synthetic data (``--auc-sessions``
sessions), trained once in fp32 and once in bf16 from the same initial
weights for the same steps through the platform's trainer, held-out AUC of
each; the same again with the Criteo MLPs (where ``auto`` picks bf16).

``--json PATH`` writes reference, torchrec, ours, ours_dedup (samples/s),
ratio_ours_vs_reference, ratio_ours_vs_torchrec, ratio_ours_dedup_vs_torchrec
(ours_dedup / torchrec_sessions: the same samples), plus every other figure.
``--demo-summary`` adds the data-wait fraction from a ``dlrm-platform run
configs/demo.yaml --summary-json`` file. All variants run with ``--threads``
intra-op threads (default 1: a worker with ``cpus_per_worker: 1``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROCESS_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

TARGETS = {"ratio_ours_vs_reference": 5.0, "ratio_ours_vs_torchrec": 1.3, "ratio_ours_dedup_vs_torchrec": 2.5}
AUC_TOLERANCE = 0.005
SAMPLES_PER_SESSION = 8
CRITEO_MLPS = ([512, 256, 64, 16], [512, 256, 1])
JSON_KEYS = ("reference", "torchrec", "ours", "ours_dedup", "ratio_ours_vs_reference", "ratio_ours_vs_torchrec",
             "ratio_ours_dedup_vs_torchrec")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- setup


def init_process_group(device) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


def criteo_job(hash_size: int, batch_size: int):
    from dlrm_platform.config import load_job_config

    return load_job_config(ROOT / "configs" / "criteo_kaggle.yaml", [
        "data.path=/nonexistent/criteo_kaggle", f"ingest.hash_size={hash_size}", f"ingest.batch_size={batch_size}",
        "train.precision=auto"])


def session_job(workdir: Path, samples: int, batch_size: int, dedup: bool, mlps=CRITEO_MLPS):
    from dlrm_platform.config import load_job_config

    mlp_overrides = [f"train.bottom_mlp={mlps[0]}", f"train.top_mlp={mlps[1]}"] if mlps else []
    return load_job_config(ROOT / "configs" / "demo.yaml", [
        *mlp_overrides,
        f"data.path={workdir / 'sessions'}",
        f"data.synthetic.num_sessions={max(2, samples // SAMPLES_PER_SESSION)}",
        "data.synthetic.samples_per_session.distribution=fixed",
        f"data.synthetic.samples_per_session.mean={SAMPLES_PER_SESSION}",
        f"data.synthetic.samples_per_session.max={SAMPLES_PER_SESSION}",
        f"ingest.dedup={'true' if dedup else 'false'}", f"ingest.batch_size={batch_size}", "train.precision=auto"])


def without_user_lookups(batch, user_features: list[str]):
    """The same plain batch with every user-side bag empty: the step minus its user embedding work."""
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    by_key = kjt.to_dict()
    lengths = [torch.zeros_like(by_key[k].lengths()) if k in user_features else by_key[k].lengths() for k in kjt.keys()]
    values = [by_key[k].values() for k in kjt.keys() if k not in user_features]
    return Batch(batch.dense_features, KeyedJaggedTensor.from_lengths_sync(kjt.keys(), torch.cat(values),
                                                                           torch.cat(lengths)), batch.labels)


def pack_plain(batch) -> pa.Table:
    """A torchrec Batch as one packed row of the plain contract (ingest/batching.py)."""
    from dlrm_platform.ingest.batching import PACKED_SCHEMA

    def one(arr: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.LargeListArray.from_arrays(pa.array([0, len(arr)], pa.int64()), pa.array(arr, typ))

    kjt = batch.sparse_features
    return pa.Table.from_arrays([
        pa.array([int(batch.labels.numel())], pa.int32()),
        one(batch.labels.float().numpy(), pa.float32()),
        one(batch.dense_features.float().reshape(-1).numpy(), pa.float32()),
        one(kjt.lengths().to(torch_int32()).numpy(), pa.int32()),
        one(kjt.values().long().numpy(), pa.int64()),
    ], schema=PACKED_SCHEMA)


def torch_int32():
    import torch

    return torch.int32


def criteo_batches(job, num_batches: int, seed: int = 0) -> list[pa.Table]:
    """Packed batches of the Criteo shape: log1p of heavy-tailed dense values, Zipf ids hashed into the tables."""
    from dlrm_platform.ingest.batching import pack_table

    cols = job.data.columns
    rng = np.random.default_rng(seed)
    b, h = job.ingest.batch_size, job.ingest.hash_size
    out = []
    for _ in range(num_batches):
        data: dict[str, Any] = {"label": (rng.random(b) < 0.25).astype(np.float32)}
        for c in cols.dense_columns:
            data[c] = np.log1p(rng.lognormal(1.0, 1.5, b)).astype(np.float32)
        for c in cols.sparse_features:
            data[c] = ((rng.zipf(1.1, b).astype(np.uint64) * np.uint64(0x9E3779B1)) % np.uint64(h)).astype(np.int64)
        out.append(pack_table(pa.table(data), cols.dense_columns, cols.sparse_features, [], "label"))
    return out


# --------------------------------------------------------------------------- the variants


class Variant:
    """A trainer taking steps on a list of batches; ``run(indices)`` trains on those batches."""

    name = "?"
    what = ""

    def run(self, indices: list[int]) -> int:  # returns samples trained on
        raise NotImplementedError

    def release(self) -> None:
        """Free what a variant holds between its turns (e.g. dense gradients)."""


class Reference(Variant):
    """facebookresearch/dlrm's DLRM_Net (dot interaction, sigmoid top, BCE) trained with SGD, fp32."""

    def __init__(self, job, batches: list, device, sparse: bool, shared_tables=None) -> None:
        import torch
        from torch import nn

        self.torch, self.device = torch, device
        self.name = "reference_sparse" if sparse else "reference"
        self.what = ("nn.EmbeddingBag sparse=True (dlrm_s_pytorch's default), SGD, fp32" if sparse else
                     "nn.EmbeddingBag with dense gradients, SGD, fp32")
        tr, cols = job.train, job.data.columns
        m = tr.embedding_dim
        emb = []
        for i, f in enumerate(cols.sparse_features):
            n = job.ingest.table_size(f)
            if shared_tables is not None:  # the same storage as another reference variant's tables (saves memory)
                weight = shared_tables[i].weight.data
            else:  # dlrm_s_pytorch's initialisation
                weight = torch.empty(n, m, device=device).uniform_(-math.sqrt(1 / n), math.sqrt(1 / n))
            emb.append(nn.EmbeddingBag(n, m, mode="sum", sparse=sparse, _weight=weight))
        self.emb_l = nn.ModuleList(emb)
        num_f = len(cols.sparse_features)
        self.bot_l = self._mlp([len(cols.dense_columns), *tr.bottom_mlp], sigmoid_last=False).to(device)
        self.top_l = self._mlp([m + (num_f + 1) * num_f // 2, *tr.top_mlp], sigmoid_last=True).to(device)
        li, lj = torch.tril_indices(num_f + 1, num_f + 1, offset=-1)
        self.li, self.lj = li.to(device), lj.to(device)
        self.loss_fn = nn.BCELoss(reduction="mean")
        self.opt = torch.optim.SGD([*self.emb_l.parameters(), *self.bot_l.parameters(), *self.top_l.parameters()],
                                   lr=tr.learning_rate)
        # The reference's input: dense [B, 13], per table (indices, offsets), labels [B, 1].
        self.inputs = []
        for b in batches:
            by_key = b.sparse_features.to_dict()
            tables = [(by_key[f].values().to(device), by_key[f].offsets()[:-1].to(device))
                      for f in cols.sparse_features]
            self.inputs.append((b.dense_features.to(device), tables, b.labels.to(device).view(-1, 1)))

    @staticmethod
    def _mlp(sizes: list[int], sigmoid_last: bool):
        from torch import nn

        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            lin = nn.Linear(a, b)
            nn.init.normal_(lin.weight, 0.0, math.sqrt(2 / (a + b)))
            nn.init.normal_(lin.bias, 0.0, math.sqrt(1 / b))
            layers += [lin, nn.Sigmoid() if sigmoid_last and i == len(sizes) - 2 else nn.ReLU()]
        return nn.Sequential(*layers)

    def forward(self, dense, tables):
        torch = self.torch
        x = self.bot_l(dense)
        ly = [bag(idx, off) for bag, (idx, off) in zip(self.emb_l, tables, strict=True)]
        t = torch.cat([x, *ly], dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
        return self.top_l(r)

    def run(self, indices: list[int]) -> int:
        n = 0
        for i in indices:
            dense, tables, labels = self.inputs[i]
            self.opt.zero_grad()
            loss = self.loss_fn(self.forward(dense, tables), labels)
            loss.backward()
            self.opt.step()
            n += labels.shape[0]
        return n

    def release(self) -> None:
        self.opt.zero_grad(set_to_none=True)


class StockTorchRec(Variant):
    """torchrec_dlrm/dlrm_main.py's model, optimizers, sharding and TrainPipelineSparseDist."""

    def __init__(self, job, batches: list, device, name: str = "torchrec") -> None:
        import torch
        import torch.distributed as dist
        from torchrec import EmbeddingBagCollection
        from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
        from torchrec.models.dlrm import DLRM, DLRMTrain
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        from dlrm_platform.train.model import embedding_bag_configs

        self.name, self.torch, self.device = name, torch, device
        self.what = "DMP (planner's sharding), fused row-wise Adagrad, TrainPipelineSparseDist, fp32"
        tr = job.train
        model = DLRMTrain(DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=embedding_bag_configs(job),
                                                            device=torch.device("meta")),
            dense_in_features=len(job.data.columns.dense_columns),
            dense_arch_layer_sizes=list(tr.bottom_mlp),
            over_arch_layer_sizes=list(tr.top_mlp),
            dense_device=device,
        ))
        apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(),
                                    {"lr": tr.embedding_learning_rate})
        planner = EmbeddingShardingPlanner(
            topology=Topology(local_world_size=1, world_size=dist.get_world_size(), compute_device=device.type),
            batch_size=job.ingest.batch_size,
            storage_reservation=HeuristicalStorageReservation(percentage=0.05),
        )
        plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
        self.plan = {t: (p.sharding_type, p.compute_kernel) for v in plan.plan.values() for t, p in v.items()}
        self.model = DistributedModelParallel(module=model, device=device, plan=plan)
        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(self.model.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=tr.learning_rate))
        self.optimizer = CombinedOptimizer([self.model.fused_optimizer, dense])
        self.pipeline = TrainPipelineSparseDist(self.model, self.optimizer, device)
        self.batches = batches
        self._queue: list[int] = []
        self._stream = self._endless()

    def _endless(self) -> Iterator[Any]:
        while True:
            # The pipeline reads one batch ahead of the step it trains: when the queue is empty it gets a
            # batch of the same size that it will train on in the next turn.
            yield self.batches[self._queue.pop(0) if self._queue else 0]

    def run(self, indices: list[int]) -> int:
        self._queue.extend(indices)
        for _ in indices:
            self.pipeline.progress(self._stream)  # zero_grad, forward, backward, optimizer step
        return sum(int(self.batches[i].labels.numel()) for i in indices)


class Ours(Variant):
    """The platform's trainer step on packed batches: lockstep_batches (read-ahead) + Worker.train_step."""

    def __init__(self, job, packed: list[pa.Table], device, name: str = "ours") -> None:
        import torch

        from dlrm_platform.train.dedup_model import build_job_model
        from dlrm_platform.train.loop import Worker
        from dlrm_platform.train.model import build_dense_optimizer
        from dlrm_platform.train.mlflow_logger import NullTracker

        self.name, self.job, self.device, self.packed = name, job, device, packed
        self.model = build_job_model(job, device)
        self.worker = Worker(job, self.model, build_dense_optimizer(self.model, job.train), device, 0, 1,
                             NullTracker())
        dedup = "dedup on (user side once per user row)" if job.dedup_enabled else "dedup off"
        self.what = (f"platform trainer, {dedup}, {self.worker.precision.name}, fused row-wise Adagrad, "
                     f"read-ahead unpacking")
        self.torch = torch

    def run(self, indices: list[int]) -> int:
        from dlrm_platform.train.lockstep import lockstep_batches

        n = 0
        for step in lockstep_batches(_Shard([self.packed[i] for i in indices]), self.job, self.device):
            self.worker.train_step(step)
            n += step.num_samples
        return n


class _Shard:
    """A Ray DataIterator stand-in over packed tables (what streaming_split hands a worker)."""

    def __init__(self, tables: list[pa.Table]) -> None:
        self.tables = tables

    def iter_batches(self, *, batch_size: int, batch_format: str, prefetch_batches: int):
        return iter(self.tables)


class DenseOnly(Variant):
    """Breakdown: bottom MLP, interaction, top MLP forward + backward + Adagrad, on fixed embeddings."""

    def __init__(self, job, batches: list, device, bf16: bool) -> None:
        import torch
        from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch

        self.torch, self.device, self.bf16 = torch, device, bf16
        self.name = "dense_bf16" if bf16 else "dense_fp32"
        self.what = "breakdown: MLPs + interaction only, " + ("bf16 autocast" if bf16 else "fp32")
        tr, cols = job.train, job.data.columns
        f, e = len(cols.sparse_features), tr.embedding_dim
        torch.manual_seed(0)
        self.dense = DenseArch(len(cols.dense_columns), list(tr.bottom_mlp), device=device)
        self.inter = InteractionArch(f)
        self.over = OverArch(e + (f + 1) * f // 2, list(tr.top_mlp), device=device)
        params = [*self.dense.parameters(), *self.over.parameters()]
        self.opt = torch.optim.Adagrad(params, lr=tr.learning_rate)
        self.inputs = [(b.dense_features.to(device), torch.randn(b.labels.numel(), f, e, device=device),
                        b.labels.to(device)) for b in batches]

    def run(self, indices: list[int]) -> int:
        torch = self.torch
        n = 0
        for i in indices:
            x, emb, y = self.inputs[i]
            emb.requires_grad_(True)
            self.opt.zero_grad()
            ctx = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
            with ctx:
                logits = self.over(self.inter(self.dense(x), emb)).squeeze(-1)
            torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), y, reduction="sum").backward()
            self.opt.step()
            emb.grad = None
            n += y.numel()
        return n


# --------------------------------------------------------------------------- measurement


@dataclass
class Timing:
    """Per round: samples per wall-clock second, and per CPU-second of this process (all its threads)."""

    samples_per_s: list[float] = field(default_factory=list)
    samples_per_cpu_s: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_per_s) if self.samples_per_s else 0.0

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.samples_per_cpu_s) if self.samples_per_cpu_s else 0.0


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(variants: list[Variant], num_batches: int, rounds: int, steps: int, device,
            warmup: int = 2) -> dict[str, Timing]:
    """Interleaved: every round, each variant trains ``steps`` batches (same ones for all); order rotates."""
    timings = {v.name: Timing() for v in variants}
    for v in variants:
        v.run([i % num_batches for i in range(warmup)])
        sync(device)
        v.release()
    for r in range(rounds):
        indices = [(r * steps + i) % num_batches for i in range(steps)]
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            sync(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            n = v.run(indices)
            sync(device)
            timings[v.name].samples_per_s.append(n / (time.perf_counter() - start))
            timings[v.name].samples_per_cpu_s.append(n / max(time.process_time() - cpu_start, 1e-9))
            v.release()
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {t.samples_per_s[-1]:,.0f}/s ({t.samples_per_cpu_s[-1]:,.0f}/cpu-s)" for k, t in timings.items()))
    return timings


# --------------------------------------------------------------------------- session data


def session_batches(workdir: Path, samples: int, batch_size: int) -> tuple[list[pa.Table], list[Any], list[Any]]:
    """Dedup-packed IKJT batches (full ones) of a synthetic session dataset, their plain expansions, and the
    expansions with each user row's bags in its first sample only (``DedupBatch.expand_user_bags_once``)."""
    from dlrm_platform.ingest import dedup_convert, dedup_operators, dedup_sessions
    from dlrm_platform.train.batches import unpack_dedup_batch
    from dlrm_platform.ingest.synthetic_data import generate_dataset
    from dlrm_platform.ingest.transforms import TransformSpec

    job = session_job(workdir, samples, batch_size, dedup=True)  # the MLPs play no part in the batches
    data = job.data
    data = data.model_copy(update={"synthetic": data.synthetic.model_copy(update={"rows_per_shard": 1_000_000})})
    generate_dataset(data, overwrite=True, progress=False)
    files = sorted(str(p) for p in (data.path / "train").glob("*.parquet"))
    ddir = workdir / "sessions-dedup"
    shutil.rmtree(ddir, ignore_errors=True)
    cols = job.data.columns
    dedup_convert.convert_split_local(files, cols, ddir)
    spec = TransformSpec.from_config(cols, job.ingest, workdir / "quarantine")
    packed: list[pa.Table] = []
    for users in sorted((ddir / "users").glob("part-*.parquet")):
        block = dedup_sessions.read_session_shard(str(users), str(ddir / "samples" / users.name), cols, spec.quarantine_dir)
        for fn in (dedup_operators.parse, dedup_operators.dense_transform, dedup_operators.sparse_transform):
            block = fn(block, spec)
        rows = dedup_operators.batch(block, spec, batch_size)
        packed += [rows.slice(i, 1) for i in range(rows.num_rows)]
    full = [p for p in packed if int(p.column("num_samples")[0].as_py()) == batch_size] or packed
    batches = [unpack_dedup_batch(p, cols.user_sparse_features, cols.item_sparse_features, len(cols.user.dense),
                                  len(cols.item.dense)) for p in full]
    return full, [b.expand() for b in batches], [b.expand_user_bags_once() for b in batches]


# --------------------------------------------------------------------------- AUC


def auc_check(workdir: Path, sessions: int, batch_size: int, device, mlps=None, epochs: int = 1,
              seeds: tuple[int, ...] = (0, 1, 2), learning_rates: tuple[float, float] | None = None) -> dict[str, Any]:
    """The demo job (or its data with other MLPs) trained in fp32 and in bf16, same steps, same data order.

    For every seed (initial weights) one fp32 and one bf16 run from the same weights; the figures are
    means over seeds and the mean of the paired differences. Two fp32 runs that differ only in their
    initial weights land ``auc_noise_floor`` apart: the resolution of any single comparison.
    """
    import torch

    from dlrm_platform.config import load_job_config
    from dlrm_platform.ingest import transforms
    from dlrm_platform.ingest.synthetic_data import generate_dataset
    from dlrm_platform.ingest.transforms import TransformSpec
    from dlrm_platform.train.dedup_model import build_job_model
    from dlrm_platform.train.loop import Worker, lockstep_batches
    from dlrm_platform.train.eval_metrics import auc
    from dlrm_platform.train.model import build_dense_optimizer
    from dlrm_platform.train.perf import Precision
    from dlrm_platform.train.mlflow_logger import NullTracker

    overrides = [f"data.path={workdir / 'demo'}", f"data.synthetic.num_sessions={sessions}",
                 f"ingest.batch_size={batch_size}", "ingest.dedup=false"]
    if mlps:
        overrides += [f"train.bottom_mlp={mlps[0]}", f"train.top_mlp={mlps[1]}"]
    if learning_rates:
        overrides += [f"train.learning_rate={learning_rates[0]}", f"train.embedding_learning_rate={learning_rates[1]}"]
    job = load_job_config(ROOT / "configs" / "demo.yaml", overrides)
    if not (job.data.path / "_SUCCESS").exists():
        generate_dataset(job.data, overwrite=True, progress=False)
    spec = TransformSpec.from_config(job.data.columns, job.ingest, workdir / "quarantine")

    def packed(split: str) -> list[pa.Table]:
        out = []
        for f in sorted((job.data.path / split).glob("*.parquet")):
            t = pq.read_table(f, columns=job.data.columns.columns)
            for fn in (transforms.parse, transforms.dense_transform, transforms.sparse_transform):
                t = fn(t, spec)
            out += [transforms.batch(t.slice(lo, batch_size), spec) for lo in range(0, t.num_rows, batch_size)]
        return out

    train, held_out = packed("train"), packed("eval")
    by_seed: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for seed, name in itertools.product(seeds, ("fp32", "bf16")):
        run_job = job.model_copy(update={"train": job.train.model_copy(update={"seed": job.train.seed + seed})})
        model = build_job_model(run_job, device)  # seeded by train.seed: the same initial weights per seed
        worker = Worker(run_job, model, build_dense_optimizer(model, job.train), device, 0, 1, NullTracker(),
                        precision=Precision(name, name, "AUC check"))
        steps = 0
        for _ in range(epochs):
            for step in lockstep_batches(_Shard(train), job, device):
                worker.train_step(step)
                steps += 1
        scores, labels = [], []
        model.eval()
        with torch.no_grad():
            for step in lockstep_batches(_Shard(held_out), job, device):
                with worker.autocast():
                    _, logits = model(step.batch)
                scores.append(logits.float().cpu().numpy())
                labels.append(step.batch.labels.cpu().numpy())
        by_seed[name].append(auc(np.concatenate(scores), np.concatenate(labels)))
        log(f"  seed {seed} {name}: AUC {by_seed[name][-1]:.4f} after {steps} steps")
        del worker, model
    diffs = [b - f for f, b in zip(by_seed["fp32"], by_seed["bf16"], strict=True)]
    out: dict[str, Any] = {
        "auc_fp32": float(np.mean(by_seed["fp32"])), "auc_bf16": float(np.mean(by_seed["bf16"])),
        "auc_diff": float(np.mean(diffs)), "auc_seeds": list(seeds), "auc_fp32_by_seed": by_seed["fp32"],
        "auc_bf16_by_seed": by_seed["bf16"], "auc_diff_by_seed": diffs, "auc_steps": steps,
    }
    if len(seeds) > 1:
        out["auc_noise_floor"] = float(np.max(by_seed["fp32"]) - np.min(by_seed["fp32"]))
    out["auc_train_samples"] = sum(int(t.column("num_samples")[0].as_py()) for t in train)
    out["auc_eval_samples"] = sum(int(t.column("num_samples")[0].as_py()) for t in held_out)
    return out


# --------------------------------------------------------------------------- report


def fmt_rows(rows: list[tuple[str, str]], timings: dict[str, Timing], bases: list[str], batch: int) -> str:
    """One line per variant: wall-clock samples/s, samples per CPU-second, ms/step, ratios (wall | CPU time)."""
    header = ("variant", "samples/s", "samples/cpu-s", "ms/step", *[f"vs {b} (wall | cpu)" for b in bases], "what")
    lines = []
    for name, what in rows:
        if name not in timings:
            continue
        t = timings[name]
        ratios = [f"{t.median / timings[b].median:.2f}x | {t.median_cpu / timings[b].median_cpu:.2f}x" for b in bases]
        lines.append((name, f"{t.median:,.0f}", f"{t.median_cpu:,.0f}", f"{1000 * batch / t.median:,.1f}", *ratios,
                      what))
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([fmt(header), *[fmt(l) for l in lines]])


def paired(timings: dict[str, Timing], a: str, b: str, cpu: bool = False) -> float:
    """Median over rounds of a's samples/s over b's in the same round (robust to load that drifts)."""
    key = "samples_per_cpu_s" if cpu else "samples_per_s"
    return statistics.median(x / y for x, y in zip(getattr(timings[a], key), getattr(timings[b], key), strict=True))


def record(result: dict[str, Any], timings: dict[str, Timing], suffix: str = "") -> None:
    """Median samples/s (wall) under the variant's name, samples per CPU-second and every round's figures."""
    for name, t in timings.items():
        result[f"{name}{suffix}"] = t.median
        result[f"cpu_{name}{suffix}"] = t.median_cpu
        result.setdefault("rounds_samples_per_s", {})[f"{name}{suffix}"] = t.samples_per_s
        result.setdefault("rounds_samples_per_cpu_s", {})[f"{name}{suffix}"] = t.samples_per_cpu_s


def amdahl(share: float, gain: float) -> float:
    return 1.0 / ((1.0 - share) + share / gain) if gain > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller tables, data and fewer rounds (~2-3 minutes)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the figures as JSON")
    p.add_argument("--hash-size", type=int, help="rows of every Criteo table (default 1,000,000 as "
                   "configs/criteo_kaggle.yaml; --quick 100,000)")
    p.add_argument("--batch-size", type=int, help="samples per step for every variant (default 2048; --quick 1024)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every variant (default 1)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 7; --quick 3)")
    p.add_argument("--steps", type=int, help="steps per variant per round (default 3; --quick 2)")
    p.add_argument("--batches", type=int, default=8, help="distinct Criteo batches cycled through (default 8)")
    p.add_argument("--session-samples", type=int, help="samples of the session dataset (default 40,000; "
                   "--quick 16,000)")
    p.add_argument("--auc-sessions", type=int, help="sessions of the demo data for the AUC check (default 20,000 "
                   "as the demo; --quick 4,000)")
    p.add_argument("--auc-batch-size", type=int, default=1024, help="batch size of the AUC check (the demo's)")
    p.add_argument("--auc-seeds", type=int, default=3, help="initial weights per precision in the AUC check "
                   "(default 3: the mean of paired differences, and the fp32 seed-to-seed spread)")
    p.add_argument("--no-auc", action="store_true", help="skip the bf16 vs fp32 AUC check")
    p.add_argument("--no-auc-criteo-mlps", action="store_true", help="skip the AUC check with the Criteo MLPs")
    p.add_argument("--no-sessions", action="store_true", help="skip the session data (ours_dedup)")
    p.add_argument("--session-mlps", default="criteo,demo", help="MLPs of the session runs: criteo (the JSON's "
                   "ours_dedup) and/or demo (64-16 / 64-1, where the user side is most of the step)")
    p.add_argument("--no-reference-sparse", action="store_true", help="skip the reference_sparse context row")
    p.add_argument("--demo-summary", type=Path, help="a `dlrm-platform run --summary-json` file: report its "
                   "data-wait fraction")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every variant trains")
    p.add_argument("--workdir", type=Path, help="keep generated data here (default: a temporary directory)")
    args = p.parse_args(argv)
    hash_size = args.hash_size or (100_000 if args.quick else 1_000_000)
    batch_size = args.batch_size or (1024 if args.quick else 2048)
    rounds = args.rounds or (3 if args.quick else 7)
    steps = args.steps or (2 if args.quick else 3)
    session_samples = args.session_samples or (16_000 if args.quick else 40_000)
    auc_sessions = args.auc_sessions or (4_000 if args.quick else 20_000)

    import logging
    import warnings

    import torch

    from dlrm_platform.train.batches import unpack_batch
    from dlrm_platform.train.perf import cpu_flags, indexed_device

    for category in (FutureWarning, UserWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.ERROR)

    torch.set_num_threads(args.threads)
    device = indexed_device(args.device)  # "cuda" -> "cuda:0": set_device rejects a device without an index
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_process_group(device)
    started = time.perf_counter()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlrm-train-speed-"))
    result: dict[str, Any] = {
        "device": str(device), "threads": args.threads, "batch_size": batch_size, "hash_size": hash_size,
        "rounds": rounds, "steps_per_round": steps,
        "cpu_native_bf16": sorted(f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in cpu_flags()),
    }
    report: list[str] = []
    try:
        # ------------------------------------------------------------- Criteo Kaggle shape
        job = criteo_job(hash_size, batch_size)
        log(f"Criteo shape: {len(job.data.columns.sparse_features)} tables x {hash_size:,} rows, batch {batch_size}")
        packed = criteo_batches(job, args.batches)
        cols = job.data.columns
        batches = [unpack_batch(t, cols.sparse_features, len(cols.dense_columns)) for t in packed]
        log("building the variants")
        ref = Reference(job, batches, device, sparse=False)
        variants: list[Variant] = [ref]
        if not args.no_reference_sparse:
            variants.append(Reference(job, batches, device, sparse=True, shared_tables=list(ref.emb_l)))
        stock = StockTorchRec(job, [b.to(device) for b in batches], device)
        ours = Ours(job, packed, device)
        variants += [stock, ours, DenseOnly(job, batches, device, bf16=False), DenseOnly(job, batches, device, True)]
        log(f"ours: {ours.worker.precision.describe()}")
        log(f"measuring: {rounds} rounds x {steps} steps per variant, interleaved")
        t = measure(variants, len(batches), rounds, steps, device)
        record(result, t)
        result["ours_precision"] = ours.worker.precision.name
        result["ours_precision_reason"] = ours.worker.precision.reason
        result["torchrec_plan"] = sorted({f"{s}/{k}" for s, k in stock.plan.values()})
        for base in ("reference", "reference_sparse", "torchrec"):
            if base in t:
                result[f"ratio_ours_vs_{base}"] = t["ours"].median / t[base].median
                result[f"paired_ratio_ours_vs_{base}"] = paired(t, "ours", base)
                result[f"cpu_ratio_ours_vs_{base}"] = t["ours"].median_cpu / t[base].median_cpu
        # Breakdown: share of the MLP part in the stock step and what bf16 gains on it (CPU time: steadier).
        dense_share = min(1.0, t["torchrec"].median_cpu / t["dense_fp32"].median_cpu)
        dense_gain = t["dense_bf16"].median_cpu / t["dense_fp32"].median_cpu
        result.update({
            "torchrec_dense_share": dense_share, "dense_bf16_gain": dense_gain,
            "bound_ours_vs_torchrec_bf16_only": amdahl(dense_share, dense_gain),
            "reference_embedding_share": max(0.0, 1.0 - t["reference"].median_cpu / t["dense_fp32"].median_cpu),
        })
        del variants, ref, stock, ours
        report.append(
            f"Criteo Kaggle shape: 13 dense, 26 sparse x {hash_size:,} rows, dim 16, MLPs 512-256-64-16 / 512-256-1; "
            f"batch {batch_size}, {args.threads} thread(s), {device}; median of {rounds} interleaved rounds x "
            f"{steps} steps")
        report.append(fmt_rows([
            ("reference", "nn.EmbeddingBag, dense gradients, SGD, fp32"),
            ("reference_sparse", "nn.EmbeddingBag sparse=True (dlrm_s_pytorch default), SGD, fp32"),
            ("torchrec", "stock TorchRec: DMP planner, fused row-wise Adagrad, TrainPipelineSparseDist, fp32"),
            ("ours", f"platform trainer: {result['ours_precision']}, fused row-wise Adagrad, read-ahead"),
            ("dense_fp32", "breakdown: MLPs + interaction alone, fp32"),
            ("dense_bf16", "breakdown: MLPs + interaction alone, bf16 autocast"),
        ], t, ["reference", "torchrec"], batch_size))
        report.append(
            f"breakdown (CPU time): the MLPs + interaction are {dense_share:.0%} of the stock TorchRec step; bf16 makes "
            f"them {dense_gain:.2f}x faster, which bounds bf16 alone at "
            f"{result['bound_ours_vs_torchrec_bf16_only']:.2f}x over stock TorchRec; the reference spends "
            f"~{result['reference_embedding_share']:.0%} of its step outside the MLPs (its dense embedding gradients "
            f"are {len(cols.sparse_features) * hash_size * 16 * 4 / 1e9:.2f} GB per step)")

        # ------------------------------------------------------------- session data, dedup
        if not args.no_sessions:
            log(f"session data: {session_samples:,} samples, {SAMPLES_PER_SESSION} per session")
            dedup_packed, expanded, once = session_batches(workdir, session_samples, batch_size)
            factor = float(np.mean([int(p.column("num_samples")[0].as_py()) / int(p.column("num_users")[0].as_py())
                                    for p in dedup_packed]))
            result["session_dedup_factor"] = factor
            result["session_batches"] = len(dedup_packed)
            for mlps_name in args.session_mlps.split(","):
                mlps = {"criteo": CRITEO_MLPS, "demo": None}[mlps_name]
                suffix = "" if mlps_name == "criteo" else f"_{mlps_name}_mlps"
                sjob = session_job(workdir, session_samples, batch_size, dedup=True, mlps=mlps)
                plain_job = session_job(workdir, session_samples, batch_size, dedup=False, mlps=mlps)
                svariants: list[Variant] = [
                    StockTorchRec(plain_job, [b.to(device) for b in expanded], device, name="torchrec_sessions"),
                    Ours(plain_job, [pack_plain(b) for b in expanded], device, name="ours_sessions"),
                    Ours(sjob, dedup_packed, device, name="ours_dedup"),
                    Ours(plain_job, [pack_plain(without_user_lookups(b, plain_job.data.columns.user_sparse_features))
                                     for b in expanded], device, name="ours_no_user_lookups"),
                    Ours(plain_job, [pack_plain(b) for b in once], device, name="ours_user_once"),
                ]
                log(f"session data, {mlps_name} MLPs: {svariants[2].worker.precision.describe()}; "
                    f"{len(dedup_packed)} batches, dedup factor {factor:.2f}")
                st = measure(svariants, len(dedup_packed), rounds, steps, device)
                record(result, st, suffix)
                result[f"ours_dedup_precision{suffix}"] = svariants[2].worker.precision.name
                for a, b, key in (("ours_dedup", "torchrec_sessions", "ours_dedup_vs_torchrec"),
                                  ("ours_sessions", "torchrec_sessions", "ours_sessions_vs_torchrec"),
                                  ("ours_dedup", "ours_sessions", "ours_dedup_vs_ours_sessions")):
                    result[f"ratio_{key}{suffix}"] = st[a].median / st[b].median
                    result[f"paired_ratio_{key}{suffix}"] = paired(st, a, b)
                    result[f"cpu_ratio_{key}{suffix}"] = st[a].median_cpu / st[b].median_cpu
                # The most deduplicating lookups can save. Naive (Amdahl): the user-lookup share s of the plain
                # step, all of it divided by f samples per user row. Measured: the plain step with each user
                # row's bags pooled once (ours_user_once): the optimizer still updates every distinct row, and
                # that part does not shrink with f. The user-only MLP slices add little (first-layer user columns).
                share = max(0.0, 1.0 - st["ours_sessions"].median_cpu / st["ours_no_user_lookups"].median_cpu)
                result[f"user_lookup_share{suffix}"] = share
                result[f"dedup_lookup_bound_amdahl{suffix}"] = amdahl(share, factor)
                bound = st["ours_sessions"].median_cpu and st["ours_user_once"].median_cpu / st["ours_sessions"].median_cpu
                result[f"dedup_lookup_bound{suffix}"] = bound
                result[f"ours_dedup_vs_bound{suffix}"] = result[f"cpu_ratio_ours_dedup_vs_ours_sessions{suffix}"] / bound
                result[f"bound_ours_dedup_vs_torchrec{suffix}"] = (
                    result[f"cpu_ratio_ours_sessions_vs_torchrec{suffix}"] * bound)
                del svariants
                bottom, top = plain_job.train.bottom_mlp, plain_job.train.top_mlp
                report.append("")
                report.append(
                    f"Session data (the generator's schema: 7 sparse incl. a 20-100 id history, 6 dense; "
                    f"{SAMPLES_PER_SESSION} samples/session, {factor:.2f} samples per user row per batch), "
                    f"MLPs {'-'.join(map(str, bottom))} / {'-'.join(map(str, top))} ({mlps_name}), the same samples "
                    f"for all, batch {batch_size}")
                report.append(fmt_rows([
                    ("torchrec_sessions", "stock TorchRec (as above) on the expanded batches"),
                    ("ours_sessions", f"platform trainer, dedup off, {result.get('ours_dedup_precision' + suffix)}"),
                    ("ours_dedup", "platform trainer, dedup on: IKJT batches, user side once per user row"),
                    ("ours_no_user_lookups", "breakdown: ours_sessions with every user-side bag empty"),
                    ("ours_user_once", "bound: ours_sessions with each user row's bags in its first sample only"),
                ], st, ["torchrec_sessions", "ours_sessions"], batch_size))
                report.append(
                    f"breakdown (CPU time): user-side lookups are {share:.0%} of the plain step; dividing all of it by "
                    f"{factor:.1f} samples per user row would gain {result[f'dedup_lookup_bound_amdahl{suffix}']:.2f}x "
                    f"(Amdahl), but pooling each user row once (same rows updated) gains "
                    f"{result[f'dedup_lookup_bound{suffix}']:.2f}x: the bound. ours_dedup "
                    f"{result[f'cpu_ratio_ours_dedup_vs_ours_sessions{suffix}']:.2f}x = "
                    f"{result[f'ours_dedup_vs_bound{suffix}']:.2f} of it (~{result[f'bound_ours_dedup_vs_torchrec{suffix}']:.2f}x "
                    f"stock TorchRec at the bound)")
        else:
            result.update({"ours_dedup": None, "ratio_ours_dedup_vs_torchrec": None})

        # ------------------------------------------------------------- AUC
        if not args.no_auc:
            log(f"AUC: demo model, {auc_sessions:,} sessions, fp32 vs bf16")
            a = auc_check(workdir, auc_sessions, args.auc_batch_size, device, seeds=tuple(range(args.auc_seeds)))
            result.update(a)
            report.append("")
            report.append(
                f"AUC, demo model on the demo data ({a['auc_train_samples']:,} train / {a['auc_eval_samples']:,} "
                f"held-out samples, {a['auc_steps']} steps per run, mean of seeds {a['auc_seeds']}): "
                f"fp32 {a['auc_fp32']:.4f}, bf16 {a['auc_bf16']:.4f}, difference {a['auc_diff']:+.4f} "
                f"(per seed {', '.join(f'{d:+.4f}' for d in a['auc_diff_by_seed'])}); fp32 seed-to-seed spread "
                f"{a.get('auc_noise_floor', float('nan')):.4f}")
            if not args.no_auc_criteo_mlps:
                log("AUC: Criteo MLPs on the demo data, fp32 vs bf16")
                lrs = (job.train.learning_rate, job.train.embedding_learning_rate)  # criteo_kaggle.yaml's
                c = auc_check(workdir, auc_sessions, args.auc_batch_size, device, mlps=CRITEO_MLPS,
                              seeds=tuple(range(args.auc_seeds)), learning_rates=lrs)
                result["auc_learning_rates_criteo_mlps"] = list(lrs)
                result.update({f"{k}_criteo_mlps": v for k, v in c.items()})
                report.append(
                    f"AUC, Criteo MLPs and learning rates (criteo_kaggle.yaml) on the same data (auto picks bf16 "
                    f"here; {c['auc_steps']} steps per run): "
                    f"fp32 {c['auc_fp32']:.4f}, bf16 {c['auc_bf16']:.4f}, difference {c['auc_diff']:+.4f} "
                    f"(per seed {', '.join(f'{d:+.4f}' for d in c['auc_diff_by_seed'])}); fp32 seed-to-seed spread "
                    f"{c.get('auc_noise_floor', float('nan')):.4f}")

        if args.demo_summary:
            summary = json.loads(args.demo_summary.read_text())
            result["demo_data_wait_fraction"] = summary.get("data_wait_fraction")
            result["demo_samples_per_s"] = summary.get("samples_per_s")
            report.append("")
            report.append(f"demo run ({args.demo_summary}): data-wait fraction {summary.get('data_wait_fraction'):.3f},"
                          f" {summary.get('samples_per_s', 0):,.0f} samples/s")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    result["seconds"] = time.perf_counter() - started
    result["seconds_with_imports"] = time.perf_counter() - PROCESS_START
    report.append("")
    report.append("targets:")
    for key, target in TARGETS.items():
        v = result.get(key)
        status = "n/a" if v is None else ("met" if v >= target else "NOT met")
        pv, cv = result.get("paired_" + key), result.get("cpu_" + key)
        notes = "" if pv is None else f"; per-round paired {pv:.2f}; CPU time {cv:.2f}"
        report.append(f"  {key} >= {target}: {'-' if v is None else f'{v:.2f}'} ({status}{notes})")
    for suffix in ("", "_criteo_mlps"):
        if f"auc_diff{suffix}" in result:
            d = result[f"auc_diff{suffix}"]
            report.append(f"  |auc_bf16 - auc_fp32|{suffix} <= {AUC_TOLERANCE}: {abs(d):.4f} "
                          f"({'met' if abs(d) <= AUC_TOLERANCE else 'NOT met'})")
    report.append(f"({result['seconds_with_imports']:.0f} s)")
    print("\n".join(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=float))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
