"""The DLRM of a job, sharded with TorchRec.

Three steps, each a small function, composed by :func:`build_sharded_model`::

    build_dlrm(job)                 DLRMTrain on the meta device (no memory yet)
    apply_optimizer_in_backward     row-wise Adagrad fused into the embedding backward
    DistributedModelParallel        shard the tables (plan from resolve_sharding), materialise
                                    parameters, wrap the dense part in DDP (with > 1 worker)

plus :func:`build_dense_optimizer` for the MLPs. Embedding tables never get a
dense gradient: every sharding this module picks by itself uses fbgemm's
fused kernel, which updates the touched rows inside the backward pass.

Shapes, for a batch of ``B`` samples with ``D`` dense features and ``F``
sparse features of embedding dim ``E``::

    dense_features  [B, D] -> bottom MLP -> [B, E]
    sparse_features KJT(F keys, stride B) -> pooled embeddings [B, F, E]
    interaction (pairwise dots of the F + 1 vectors) -> top MLP -> logits [B]
"""

from __future__ import annotations

import logging
import os
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.model_parallel import (
    DefaultDataParallelWrapper,
    DistributedModelParallel,
    get_default_sharders,
)
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, ParameterConstraints, TopologyFactory, TrainerConfig
from torchrec.distributed.types import ShardingEnv, ShardingPlan, ShardingType
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_platform.config import JobConfig, TrainConfig

__all__ = [
    "CPU_SHARDING_1_WORKER",
    "DLRMTrain",
    "DataParallelOnlyWhenDistributed",
    "build_dense_optimizer",
    "build_dlrm",
    "build_sharded_model",
    "dummy_batch",
    "embedding_bag_configs",
    "resolve_sharding",
    "sharding_plan",
    "table_name",
]

log = logging.getLogger(__name__)

ShardingName = Literal["table_wise", "data_parallel", "column_wise", "table_column_wise"]

# One worker on CPU: table_wise (fbgemm's fused kernel, row-wise Adagrad in
# backward) against data_parallel (torchrec's DENSE kernel: a dense gradient of
# every table, i.e. what this platform never wants). Measured with the demo
# model (7 tables of 50k x 16, history ~60 ids/sample, batch 1024, 1 thread),
# median of 40 steps: 4-6 ms/step vs 35 ms/step on a quiet machine, 6-27 vs
# 54-100 ms/step with the 2 cores shared by other jobs.
CPU_SHARDING_1_WORKER: ShardingName = "table_wise"

ADAGRAD_EPS = 1e-8


def table_name(feature: str) -> str:
    """The embedding table that holds ``feature``'s ids (one table per feature)."""
    return f"t_{feature}"


class DLRMTrain(nn.Module):
    """A DLRM plus its loss, as torchrec's ``DLRMTrain`` but with a summed loss.

    ``forward(batch) -> (loss_sum, logits)``:

    * ``loss_sum`` []: binary cross-entropy with logits, *summed* over the
      batch, so that the train loop can weight batches of different sizes on
      different workers exactly (it divides by the global sample count).
    * ``logits`` [B], detached.
    """

    def __init__(self, dlrm_module: DLRM) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss_sum = self.loss_fn(logits, batch.labels.float())
        return loss_sum, logits.detach()


def embedding_bag_configs(job: JobConfig) -> list[EmbeddingBagConfig]:
    """One table per sparse feature, in KJT key order, sized by ``ingest.table_size``."""
    return [
        EmbeddingBagConfig(
            name=table_name(feature),
            embedding_dim=job.train.embedding_dim,
            num_embeddings=job.ingest.table_size(feature),
            feature_names=[feature],
        )
        for feature in job.data.columns.sparse_features
    ]


def build_dlrm(job: JobConfig, device: torch.device | str = "meta") -> DLRMTrain:
    """The unsharded DLRM of ``job``; on ``meta`` by default (materialised by DMP)."""
    device = torch.device(device)
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(job), device=device)
    dlrm = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=len(job.data.columns.dense_columns),
        dense_arch_layer_sizes=list(job.train.bottom_mlp),
        over_arch_layer_sizes=list(job.train.top_mlp),
        dense_device=device,
    )
    return DLRMTrain(dlrm)


def resolve_sharding(train: TrainConfig, world_size: int, device_type: str) -> ShardingName | None:
    """The sharding type for every table, or None for the planner's own choice.

    ``auto``: the planner on GPU; on CPU ``table_wise`` (fused kernel; with
    several workers each table lives on one worker and lookups are an
    all-to-all). An explicit choice is used as given.
    """
    if train.sharding != "auto":
        return train.sharding
    if device_type == "cuda":
        return None
    return "table_wise" if world_size > 1 else CPU_SHARDING_1_WORKER


def _local_world_size(device: torch.device, world_size: int) -> int:
    """Workers on this node: Ray Train's (and torchrun's) ``LOCAL_WORLD_SIZE``, else a guess.

    The guess (every GPU of the node on CUDA, everything local on CPU) is
    what the planner's topology used before; under Ray each GPU worker sees
    only its own GPU, so the device count alone would say 1.
    """
    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return int(torch.cuda.device_count()) if device.type == "cuda" else world_size


def sharding_plan(
    model: DLRMTrain,
    job: JobConfig,
    device: torch.device,
    world_size: int,
    sharders: list,
) -> ShardingPlan:
    """Plan every table with the sharding of :func:`resolve_sharding` (collective when distributed)."""
    sharding = resolve_sharding(job.train, world_size, device.type)
    constraints = None
    if sharding is not None:
        kernel = (
            EmbeddingComputeKernel.DENSE.value
            if sharding == ShardingType.DATA_PARALLEL.value
            else EmbeddingComputeKernel.FUSED.value
        )
        constraints = {
            table_name(f): ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel])
            for f in job.data.columns.sparse_features
        }
    local_world_size = _local_world_size(device, world_size)
    topology = TopologyFactory.create_topology(
        TrainerConfig(world_size=world_size, local_world_size=max(1, min(local_world_size, world_size))),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=job.ingest.batch_size,
        storage_reservation=FixedPercentageStorageReservation(percentage=0.05),
        constraints=constraints,
        debug=False,
    )
    if dist.is_initialized() and world_size > 1:
        return planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return planner.plan(model, sharders)


def build_sharded_model(job: JobConfig, device: torch.device) -> DistributedModelParallel:
    """Build the DLRM on meta, fuse row-wise Adagrad into the embedding backward, shard it.

    Needs an initialised default process group (Ray Train's TorchTrainer
    creates one: gloo on CPU, nccl on GPU). The returned module's
    ``fused_optimizer`` holds the embedding optimizer state.
    """
    torch.manual_seed(job.train.seed)
    model = build_dlrm(job, "meta")
    apply_optimizer_in_backward(
        RowWiseAdagrad,
        model.model.sparse_arch.parameters(),
        {"lr": job.train.embedding_learning_rate, "eps": ADAGRAD_EPS},
    )
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    sharders = get_default_sharders()
    plan = sharding_plan(model, job, device, world_size, sharders)
    log.info("sharding plan: %s", {k: {t: p.sharding_type for t, p in v.items()} for k, v in plan.plan.items()})
    return DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders,
                                    data_parallel_wrapper=DataParallelOnlyWhenDistributed())


class DataParallelOnlyWhenDistributed(DefaultDataParallelWrapper):
    """TorchRec's DDP wrapping of the dense part, skipped in a world of one.

    With one worker DDP has nothing to average, yet it still copies every
    dense gradient into its buckets and runs a (gloo) all-reduce per step:
    ~4% of a demo-model step on CPU, measured. Parameter names and state
    dicts are the same either way (DMP unwraps DDP for them).
    """

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        if env.world_size > 1:
            super().wrap(dmp, env, device)


def build_dense_optimizer(model: nn.Module, train: TrainConfig) -> KeyedOptimizerWrapper:
    """The optimizer of every parameter not updated in backward (the MLPs).

    PyTorch's fused kernels where they exist for the parameters' device
    (Adagrad: CPU; Adam: CPU and CUDA): one kernel per parameter instead of
    a chain of elementwise ops; same update, same state dict (Adagrad on the
    Criteo MLPs: 0.26 vs 0.61 ms per step, measured).
    """
    params = dict(in_backward_optimizer_filter(model.named_parameters()))

    def make(p: list[torch.Tensor]) -> torch.optim.Optimizer:
        devices = {t.device.type for t in p}
        if train.dense_optimizer == "adagrad":
            return torch.optim.Adagrad(p, lr=train.learning_rate, eps=ADAGRAD_EPS, fused=devices == {"cpu"} or None)
        if train.dense_optimizer == "adam":
            return torch.optim.Adam(p, lr=train.learning_rate, fused=devices <= {"cpu", "cuda"} or None)
        return torch.optim.SGD(p, lr=train.learning_rate)

    return KeyedOptimizerWrapper(params, make)


def dummy_batch(sparse_features: list[str], num_dense: int, device: torch.device | str = "cpu") -> Batch:
    """A one-sample batch (zeros, id 0 in every table) for a zero-weight lockstep step."""
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(sparse_features),
        values=torch.zeros(len(sparse_features), dtype=torch.int64),
        lengths=torch.ones(len(sparse_features), dtype=torch.int32),
    )
    batch = Batch(
        dense_features=torch.zeros(1, num_dense),
        sparse_features=kjt,
        labels=torch.zeros(1),
    )
    return batch.to(torch.device(device))
