"""The dedup-aware DLRM (RecD): the user side computed once per unique user row, then expanded.

It is *the same model* as the plain TorchRec ``DLRM`` of :mod:`.model` (same
parameters, same function, loss and gradients equal up to float rounding);
only the order of computation differs. With ``U`` unique user rows for ``B``
samples (``Fu`` user and ``Fi`` item sparse features, ``Du``/``Di`` user/item
dense columns, embedding dim ``E``)::

    per user row (U)                                 per sample (B)
    ----------------                                 --------------
    e_u = user EBC(user KJT)   [U, Fu, E]            e_i = item EBC(item KJT)      [B, Fi, E]
      (ids + pooled history: the big lookups)
    h_u = x_u @ W1[:, :Du]^T   [U, H1]               h = x_i @ W1[:, Du:]^T + b1 + h_u[inv]
      (user columns of the bottom MLP's 1st layer)     d = rest of bottom MLP(relu(h))   [B, E]
    p_uu = <e_u[a], e_u[b]>, a < b  [U, Fu(Fu-1)/2]  V = [d, e_u[inv], e_i]; the other pairwise dots
    z_u = p_uu @ T1[:, uu]^T   [U, H]                z = [d, p_rest] @ T1[:, rest]^T + c1 + z_u[inv]
      (user slice of the top MLP's 1st layer)          logit = rest of top MLP(relu(z))

``inv`` is the batch's inverse index (:mod:`dlrm_platform.ingest.dedup_batching`);
expansion is ``index_select`` whose backward sums the gradients of a user
row's samples, so the user side's backward (embedding rows, fused optimizer
update, the ``W1``/``T1`` user columns) also runs once per user row.

Why the bottom MLP is not fully deduplicated: the plain DLRM feeds *all*
dense columns (user and item) through one bottom MLP, so after its first
layer every unit mixes user and item inputs; only the first layer's user
columns are a function of the user alone. A separate user tower would be a
different model, and this one must be the plain model (equivalence test). On
this model the dominant deduplicated work is the user embedding lookups, above
all the pooled history (~60 ids per sample on the synthetic data), with their
backward and row-wise Adagrad update. When there are no item dense columns
the whole bottom MLP runs per user row.

Parameters keep the plain model's module paths for the MLPs
(``model.dense_arch``, ``model.over_arch``); the embedding tables (one per
feature, named ``t_<feature>``) are split into ``model.user_ebc`` and
``model.item_ebc``. :func:`dedup_state_dict_from_plain` maps a plain state dict
onto this model (and :func:`plain_state_dict_from_dedup` back), so one set
of weights runs through both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.models.dlrm import DenseArch, OverArch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_platform.config import DatasetSchema, JobConfig
from dlrm_platform.ingest.batching import unpack_batch
from dlrm_platform.ingest.dedup_batching import DedupBatch, dummy_dedup_batch, is_dedup_packed, unpack_dedup_batch
from dlrm_platform.train import model as plain_model

__all__ = [
    "DedupDLRM",
    "DedupDLRMTrain",
    "batch_codec",
    "build_dedup_dlrm",
    "build_job_model",
    "build_sharded_dedup_model",
    "dedup_state_dict_from_plain",
    "plain_state_dict_from_dedup",
]

log = logging.getLogger(__name__)

_PLAIN_EBC = "model.sparse_arch.embedding_bag_collection."
_USER_EBC = "model.user_ebc."
_ITEM_EBC = "model.item_ebc."


class DedupDLRM(nn.Module):
    """DLRM over a dedup batch; see the module docstring for what runs per user row.

    Args:
        user_ebc / item_ebc: the tables of the user / item sparse features (either may be None when
            that side has no sparse feature); all tables share one embedding dim.
        num_user_dense / num_item_dense: ``Du`` / ``Di``.
        dense_arch_layer_sizes / over_arch_layer_sizes: as ``torchrec.models.dlrm.DLRM``'s.
    """

    def __init__(
        self,
        user_ebc: EmbeddingBagCollection | None,
        item_ebc: EmbeddingBagCollection | None,
        num_user_dense: int,
        num_item_dense: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        if user_ebc is None and item_ebc is None:
            raise ValueError("at least one embedding bag collection is required")
        if num_user_dense + num_item_dense < 1:
            raise ValueError("at least one dense column is required")
        if len(over_arch_layer_sizes) < 2:
            raise ValueError("over_arch_layer_sizes needs at least two layers (as torchrec's DLRM)")
        self.user_ebc = user_ebc
        self.item_ebc = item_ebc
        self.user_keys = _feature_names(user_ebc)
        self.item_keys = _feature_names(item_ebc)
        dims = {c.embedding_dim for ebc in (user_ebc, item_ebc) if ebc is not None for c in ebc.embedding_bag_configs()}
        if len(dims) != 1:
            raise ValueError(f"all tables must share one embedding dim, got {sorted(dims)}")
        self.E = dims.pop()
        if dense_arch_layer_sizes[-1] != self.E:
            raise ValueError(f"the bottom MLP must end in the embedding dim {self.E}")
        self.Du, self.Di = num_user_dense, num_item_dense
        self.Fu, self.Fi = len(self.user_keys), len(self.item_keys)
        self.dense_arch = DenseArch(self.Du + self.Di, list(dense_arch_layer_sizes), device=dense_device)
        num_pairs = (self.Fu + self.Fi + 1) * (self.Fu + self.Fi) // 2
        self.over_arch = OverArch(self.E + num_pairs, list(over_arch_layer_sizes), device=dense_device)

        # Pairs (i < j) of V = [d, e_u(Fu), e_i(Fi)] in torchrec's order (triu, row-major).
        tri = torch.triu_indices(self.Fu + self.Fi + 1, self.Fu + self.Fi + 1, offset=1)
        is_user = (tri[0] >= 1) & (tri[1] <= self.Fu)  # both ends user embeddings
        rest = (~is_user).nonzero().squeeze(1)
        uu = is_user.nonzero().squeeze(1)
        self.register_buffer("pair_rest_i", tri[0][rest], persistent=False)
        self.register_buffer("pair_rest_j", tri[1][rest], persistent=False)
        self.register_buffer("pair_uu_i", tri[0][uu] - 1, persistent=False)
        self.register_buffer("pair_uu_j", tri[1][uu] - 1, persistent=False)
        # Columns of the top MLP's first layer: [d (E), pairs]; split into per-sample and per-user ones.
        self.register_buffer("top_cols_rest", torch.cat([torch.arange(self.E), self.E + rest]), persistent=False)
        self.register_buffer("top_cols_uu", self.E + uu, persistent=False)

    # ------------------------------------------------------------------ pieces

    @staticmethod
    def _pooled(ebc: nn.Module, kjt: KeyedJaggedTensor, keys: list[str], rows: int, dim: int) -> torch.Tensor:
        kt = ebc(kjt)
        if list(kt.keys()) == keys:
            values = kt.values()
        else:  # a sharded collection may order its outputs differently
            by_key = kt.to_dict()
            values = torch.cat([by_key[k] for k in keys], dim=1)
        return values.reshape(rows, len(keys), dim)

    def _bottom(self, user_dense: torch.Tensor, item_dense: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        mlp = self.dense_arch.model._mlp
        if self.Di == 0:  # the whole bottom MLP is a function of the user: run it per user row
            return self.dense_arch(user_dense).index_select(0, inverse)
        first = mlp[0]
        w, b = first._linear.weight, first._linear.bias
        h = F.linear(item_dense, w[:, self.Du :], b)
        if self.Du:
            h = h + F.linear(user_dense, w[:, : self.Du]).index_select(0, inverse)
        h = first._activation_fn(h)
        for layer in mlp[1:]:
            h = layer(h)
        return h

    def forward(
        self,
        user_dense: torch.Tensor,
        user_sparse: KeyedJaggedTensor | None,
        inverse: torch.Tensor,
        item_dense: torch.Tensor,
        item_sparse: KeyedJaggedTensor | None,
    ) -> torch.Tensor:
        """Logits [B, 1] of the samples; ``inverse`` [B] maps each sample to its user row."""
        num_users, num_samples = user_dense.shape[0], inverse.shape[0]
        d = self._bottom(user_dense, item_dense, inverse)  # [B, E]
        parts = [d.unsqueeze(1)]
        e_u = None
        if self.user_ebc is not None:
            e_u = self._pooled(self.user_ebc, user_sparse, self.user_keys, num_users, self.E)  # [U, Fu, E]
            parts.append(e_u.index_select(0, inverse))
        if self.item_ebc is not None:
            parts.append(self._pooled(self.item_ebc, item_sparse, self.item_keys, num_samples, self.E))
        v = torch.cat(parts, dim=1)  # [B, F + 1, E]
        inter = torch.bmm(v, v.transpose(1, 2))
        top_in = torch.cat([d, inter[:, self.pair_rest_i, self.pair_rest_j]], dim=1)

        mlp = self.over_arch.model[0]._mlp
        first = mlp[0]
        w, b = first._linear.weight, first._linear.bias
        z = F.linear(top_in, w.index_select(1, self.top_cols_rest), b)
        if self.pair_uu_i.numel():
            inter_u = torch.bmm(e_u, e_u.transpose(1, 2))[:, self.pair_uu_i, self.pair_uu_j]  # [U, P_uu]
            z = z + F.linear(inter_u, w.index_select(1, self.top_cols_uu)).index_select(0, inverse)
        h = first._activation_fn(z)
        for layer in mlp[1:]:
            h = layer(h)
        return self.over_arch.model[1](h)


def _feature_names(ebc: EmbeddingBagCollection | None) -> list[str]:
    if ebc is None:
        return []
    return [f for c in ebc.embedding_bag_configs() for f in c.feature_names]


class DedupDLRMTrain(nn.Module):
    """:class:`DedupDLRM` plus its loss: ``forward(batch) -> (loss_sum, logits)``, as ``model.DLRMTrain``."""

    def __init__(self, dlrm_module: DedupDLRM) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def forward(self, batch: DedupBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(
            batch.user_dense, batch.user_sparse, batch.inverse, batch.item_dense, batch.item_sparse
        ).squeeze(-1)
        loss_sum = self.loss_fn(logits, batch.labels.float())
        return loss_sum, logits.detach()


def _side_configs(job: JobConfig) -> tuple[list[EmbeddingBagConfig], list[EmbeddingBagConfig]]:
    configs = {c.feature_names[0]: c for c in plain_model.embedding_bag_configs(job)}
    cols = job.data.columns
    return [configs[f] for f in cols.user_sparse_features], [configs[f] for f in cols.item_sparse_features]


def build_dedup_dlrm(job: JobConfig, device: torch.device | str = "meta") -> DedupDLRMTrain:
    """The unsharded dedup DLRM of ``job`` (same tables and MLPs as ``model.build_dlrm``)."""
    device = torch.device(device)
    user_cfgs, item_cfgs = _side_configs(job)
    cols: DatasetSchema = job.data.columns
    return DedupDLRMTrain(
        DedupDLRM(
            user_ebc=EmbeddingBagCollection(tables=user_cfgs, device=device) if user_cfgs else None,
            item_ebc=EmbeddingBagCollection(tables=item_cfgs, device=device) if item_cfgs else None,
            num_user_dense=len(cols.user.dense),
            num_item_dense=len(cols.item.dense),
            dense_arch_layer_sizes=job.train.bottom_mlp,
            over_arch_layer_sizes=job.train.top_mlp,
            dense_device=device,
        )
    )


def _embedding_parameters(model: DedupDLRMTrain) -> list[nn.Parameter]:
    return [p for ebc in (model.model.user_ebc, model.model.item_ebc) if ebc is not None for p in ebc.parameters()]


def build_sharded_dedup_model(job: JobConfig, device: torch.device) -> DistributedModelParallel:
    """As ``model.build_sharded_model`` for the dedup model: fused row-wise Adagrad, same sharding plan."""
    torch.manual_seed(job.train.seed)
    model = build_dedup_dlrm(job, "meta")
    apply_optimizer_in_backward(
        RowWiseAdagrad,
        _embedding_parameters(model),
        {"lr": job.train.embedding_learning_rate, "eps": plain_model.ADAGRAD_EPS},
    )
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    sharders = get_default_sharders()
    plan = plain_model.sharding_plan(model, job, device, world_size, sharders)
    log.info("dedup model sharding plan: %s",
             {k: {t: p.sharding_type for t, p in v.items()} for k, v in plan.plan.items()})
    return DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)


def _remap(state: Mapping[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    out = {}
    for key, value in state.items():
        for old, new in mapping.items():
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def _table_prefixes(columns: DatasetSchema, src_user: str, src_item: str, dst_user: str,
                    dst_item: str) -> dict[str, str]:
    mapping = {}
    for f in columns.user_sparse_features:
        mapping[f"{src_user}embedding_bags.{plain_model.table_name(f)}."] = f"{dst_user}embedding_bags.{plain_model.table_name(f)}."
    for f in columns.item_sparse_features:
        mapping[f"{src_item}embedding_bags.{plain_model.table_name(f)}."] = f"{dst_item}embedding_bags.{plain_model.table_name(f)}."
    return mapping


def dedup_state_dict_from_plain(state: Mapping[str, Any], columns: DatasetSchema) -> dict[str, Any]:
    """A ``DLRMTrain`` state dict renamed for :class:`DedupDLRMTrain` (the MLP keys are already shared)."""
    return _remap(state, _table_prefixes(columns, _PLAIN_EBC, _PLAIN_EBC, _USER_EBC, _ITEM_EBC))


def plain_state_dict_from_dedup(state: Mapping[str, Any], columns: DatasetSchema) -> dict[str, Any]:
    """The inverse of :func:`dedup_state_dict_from_plain`."""
    return _remap(state, _table_prefixes(columns, _USER_EBC, _ITEM_EBC, _PLAIN_EBC, _PLAIN_EBC))


# --------------------------------------------------------------------------- hooks for the train loop


def build_job_model(job: JobConfig, device: torch.device) -> DistributedModelParallel:
    """The sharded model the job trains: the dedup DLRM when ``job.dedup_enabled``, else the plain one."""
    if job.dedup_enabled:
        return build_sharded_dedup_model(job, device)
    return plain_model.build_sharded_model(job, device)


def batch_codec(job: JobConfig, device: torch.device) -> tuple[Callable[[pa.Table], Any], Any]:
    """``(unpack, dummy)`` for the job's packed batches: ``unpack(table)`` gives the batch the job's
    model takes, already on ``device``; ``dummy`` is a one-sample batch for zero-weight lockstep steps."""
    cols = job.data.columns
    if job.dedup_enabled:
        user_f, item_f = cols.user_sparse_features, cols.item_sparse_features
        du, di = len(cols.user.dense), len(cols.item.dense)

        def unpack_dedup(table: pa.Table) -> DedupBatch:
            if not is_dedup_packed(table):
                raise ValueError("ingest.dedup is on but the batch is a plain packed batch (no inverse column)")
            return unpack_dedup_batch(table, user_f, item_f, du, di).to(device)

        return unpack_dedup, dummy_dedup_batch(user_f, item_f, du, di, device)
    sparse, num_dense = cols.sparse_features, len(cols.dense_columns)

    def unpack_plain(table: pa.Table) -> Any:
        return unpack_batch(table, sparse, num_dense).to(device)

    return unpack_plain, plain_model.dummy_batch(sparse, num_dense, device)
