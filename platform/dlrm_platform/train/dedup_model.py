"""The dedup-aware DLRM (RecD): the user side computed once per unique user row, then expanded.

It is *the same model* as the plain TorchRec ``DLRM`` of :mod:`.model`: the
same modules under the same names (``model.sparse_arch``, ``model.dense_arch``,
``model.inter_arch``, ``model.over_arch``), so a plain state dict loads as is
and the loss and gradients match up to float rounding; only what is computed
per user row instead of per sample differs. With ``U`` unique user rows for
``B`` samples (``Fu``/``Fi`` user/item sparse features, ``Du``/``Di`` dense
columns, embedding dim ``E``, ``inv`` the batch's inverse index)::

    always, per user row (U)                      per sample (B)
    ------------------------                      --------------
    e_u = pooled user embeddings   [U, Fu, E]     e_i = pooled item embeddings      [B, Fi, E]
      (ids and the pooled history: one lookup, one backward scatter and one
       row-wise Adagrad update per user row instead of per sample)

    MLP path "expand" (U = B: nothing to save)    MLP path "split" (U < B: the default rule)
    d = bottom([x_u[inv], x_i])                   h_u = x_u W1[:, :Du]^T per user row, added to
    V = [d, e_u[inv], e_i]                          x_i W1[:, Du:]^T + b1 per sample; rest of bottom
    top(interactions(V)), as torchrec             p_uu = user-user dots per user row, times the
                                                    top MLP's first-layer user columns per user row,
                                                    added to the per-sample part; rest of top MLP

Both paths compute the plain model's function; expansion is ``index_select``,
whose backward sums a user row's samples, so the user side's backward also
runs once per user row.

Which MLP path runs is decided per batch (:meth:`DedupDLRM.takes_split`):
the split saves ``(B - U) * (Du * H1 + P_uu * H_top)`` multiply-adds of the
forward (about 3x that with the backward) but costs ~20 small extra
operators and runs the first layers on sliced (copied, and under bf16
autocast re-cast) weights, so by default it runs only where it saves at least
:data:`MLP_SPLIT_MIN_MACS` forward multiply-adds per batch (what those operators
cost) and :data:`MLP_SPLIT_MIN_SHARE` of the batch's MLP multiply-adds. In the plain
DLRM the bottom MLP takes *all* dense columns (user and item), so after its
first layer every unit mixes both sides: only the first layer's user columns
and the user-user pairs' slice of the top MLP's first layer are functions of
the user alone. On the demo model (Du = 3, H1 = 64, 6 user-user pairs,
H_top = 64) that is ~12% of the MLP work at 8 samples per session but only
0.5M multiply-adds per batch of 1024 (expand taken: the split measured 4-5%
slower, fp32, one core; break-even near 4M, 5% faster at 8M); with the Criteo
MLPs (512-256-64-16 / 512-256-1) it is ~1.3% (expand taken: the split measured
~10% slower there in bf16, 2% faster in fp32 at batch 2048). The bulk of the user-side work is the
embedding side (the ~60-id history per sample); ``benchmarks/dedup.py`` and
``benchmarks/train_speed.py`` measure the user-side share of the plain step
and the speed-up it bounds.

Embeddings: one ``EmbeddingBagCollection`` with the plain model's tables
(``t_<feature>``), fed one KJT of stride ``B`` whose user features hold the
``U`` user rows followed by ``B - U`` empty bags
(:attr:`~dlrm_platform.train.batches.DedupBatch.sparse_features`):
empty bags cost no lookup, and one sharded module keeps
DistributedModelParallel's per-step overhead that of the plain model
(two collections, user and item, were measured slower: two input and output
dists per step).
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
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch, SparseArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_platform.config import DatasetSchema, JobConfig
from dlrm_platform.ingest.dedup_batching import is_dedup_packed
from dlrm_platform.train import model as plain_model
from dlrm_platform.train.batches import (
    DedupBatch,
    dummy_dedup_batch,
    embedding_expansion_index,
    unpack_batch,
    unpack_dedup_batch,
)
from dlrm_platform.train.perf import mlp_macs

__all__ = [
    "MLP_SPLIT_MIN_MACS",
    "MLP_SPLIT_MIN_SHARE",
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

# What the MLP split must save to be taken (see the module docstring): a share of the batch's MLP forward
# multiply-adds, and at least as many as its ~20 extra small operators cost (break-even measured on one CPU
# core, fp32: 4M forward multiply-adds saved per batch; the demo's 0.5-1M made the step 4-5% slower).
MLP_SPLIT_MIN_SHARE = 0.05
MLP_SPLIT_MIN_MACS = 4_000_000


class DedupDLRM(nn.Module):
    """DLRM over a dedup batch; see the module docstring for what runs per user row.

    Args:
        embedding_bag_collection: the tables of every sparse feature, user features first (as the plain model's).
        user_features: names of the user-side sparse features (the first ``Fu`` keys).
        num_user_dense / num_item_dense: ``Du`` / ``Di``.
        dense_arch_layer_sizes / over_arch_layer_sizes: as ``torchrec.models.dlrm.DLRM``'s.
        mlp_split_min_macs: take the split MLP path on batches where it saves at least this many
            forward multiply-adds (0: always, ``float('inf')``: never); ``None`` (default): where it saves
            at least :data:`MLP_SPLIT_MIN_MACS` and :data:`MLP_SPLIT_MIN_SHARE` of the batch's MLP
            forward multiply-adds.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        user_features: Sequence[str],
        num_user_dense: int,
        num_item_dense: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        dense_device: torch.device | None = None,
        mlp_split_min_macs: float | None = None,
    ) -> None:
        super().__init__()
        if num_user_dense + num_item_dense < 1:
            raise ValueError("at least one dense column is required")
        if len(over_arch_layer_sizes) < 2:
            raise ValueError("over_arch_layer_sizes needs at least two layers (as torchrec's DLRM)")
        self.sparse_arch = SparseArch(embedding_bag_collection)
        keys = self.sparse_arch.sparse_feature_names
        self.keys = list(keys)
        self.Fu = len(user_features)
        if self.keys[: self.Fu] != list(user_features):
            raise ValueError(f"the tables must list the user features {list(user_features)} first, got {self.keys}")
        self.F, self.E = len(self.keys), self.sparse_arch.D
        self.Fi = self.F - self.Fu
        if dense_arch_layer_sizes[-1] != self.E:
            raise ValueError(f"the bottom MLP must end in the embedding dim {self.E}")
        self.Du, self.Di = num_user_dense, num_item_dense
        self.dense_arch = DenseArch(self.Du + self.Di, list(dense_arch_layer_sizes), device=dense_device)
        self.inter_arch = InteractionArch(num_sparse_features=self.F)
        num_pairs = (self.F + 1) * self.F // 2
        self.over_arch = OverArch(self.E + num_pairs, list(over_arch_layer_sizes), device=dense_device)
        self.mlp_split_min_macs = mlp_split_min_macs

        # Pairs (i < j) of V = [d, e_u(Fu), e_i(Fi)] in torchrec's order (triu, row-major).
        tri = torch.triu_indices(self.F + 1, self.F + 1, offset=1)
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
        bottom_macs = mlp_macs(self.Du + self.Di, dense_arch_layer_sizes)
        self.mlp_macs_per_sample = bottom_macs + mlp_macs(self.E + num_pairs, over_arch_layer_sizes)
        # What the split computes per user row instead of per sample: the whole bottom MLP when it sees
        # only user columns, else its first layer's user columns; and the user-user pairs' slice of the
        # top MLP's first layer.
        user_bottom = bottom_macs if self.Di == 0 else self.Du * dense_arch_layer_sizes[0]
        self._split_macs_per_sample = user_bottom + len(uu) * over_arch_layer_sizes[0]

    # ------------------------------------------------------------------ pieces

    def split_saves_macs(self, num_samples: int, num_users: int) -> int:
        """Forward multiply-adds the split MLP path saves on a batch of this shape."""
        return (num_samples - num_users) * self._split_macs_per_sample

    def takes_split(self, num_samples: int, num_users: int) -> bool:
        """Whether a batch of this shape runs the split MLP path (see the module docstring)."""
        saves = self.split_saves_macs(num_samples, num_users)
        if self.mlp_split_min_macs is None:
            return (saves > 0 and saves >= MLP_SPLIT_MIN_MACS
                    and saves >= MLP_SPLIT_MIN_SHARE * num_samples * self.mlp_macs_per_sample)
        return saves >= self.mlp_split_min_macs

    def _embeddings(self, sparse: KeyedJaggedTensor, num_samples: int) -> torch.Tensor:
        kt = self.sparse_arch.embedding_bag_collection(sparse)
        if list(kt.keys()) == self.keys:
            values = kt.values()
        else:  # a sharded collection may order its outputs differently
            by_key = kt.to_dict()
            values = torch.cat([by_key[k] for k in self.keys], dim=1)
        return values.reshape(num_samples, self.F, self.E)

    def _bottom_split(self, user_dense: torch.Tensor, item_dense: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
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

    def _top_split(self, d: torch.Tensor, e_u: torch.Tensor, e: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        """``e_u`` [U, Fu, E] the user rows' embeddings, ``e`` [B, F, E] every sample's (user rows expanded)."""
        v = torch.cat([d.unsqueeze(1), e], dim=1)  # [B, F + 1, E]
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

    def forward(
        self,
        user_dense: torch.Tensor,
        inverse: torch.Tensor,
        item_dense: torch.Tensor,
        sparse: KeyedJaggedTensor,
        expansion_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, 1]. ``sparse``: every feature at stride B, user features in their first U bags;
        ``expansion_index`` [B * F]: :func:`~dlrm_platform.train.batches.embedding_expansion_index`
        (computed here when not given)."""
        num_users, num_samples = user_dense.shape[0], inverse.shape[0]
        pooled = self._embeddings(sparse, num_samples)  # [B, F, E]: user features in the first U rows
        if expansion_index is None:
            expansion_index = embedding_expansion_index(inverse, self.Fu, self.Fi)
        # [B, F, E]: the user rows' embeddings expanded to their samples, next to each sample's item embeddings
        e = pooled.reshape(num_samples * self.F, self.E).index_select(0, expansion_index).view(
            num_samples, self.F, self.E)
        if self.takes_split(num_samples, num_users):
            d = self._bottom_split(user_dense, item_dense, inverse)
            return self._top_split(d, pooled[:num_users, : self.Fu], e, inverse)
        d = self.dense_arch(torch.cat([user_dense.index_select(0, inverse), item_dense], dim=1))
        return self.over_arch(self.inter_arch(d, e))


class DedupDLRMTrain(nn.Module):
    """:class:`DedupDLRM` plus its loss: ``forward(batch) -> (loss_sum, logits)``, as ``model.DLRMTrain``."""

    def __init__(self, dlrm_module: DedupDLRM) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def forward(self, batch: DedupBatch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch.user_dense, batch.inverse, batch.item_dense, batch.sparse_features,
                            batch.expansion_index).squeeze(-1)
        loss_sum = self.loss_fn(logits, batch.labels.float())
        return loss_sum, logits.detach()


def build_dedup_dlrm(job: JobConfig, device: torch.device | str = "meta",
                     mlp_split_min_macs: float | None = None) -> DedupDLRMTrain:
    """The unsharded dedup DLRM of ``job``: the tables and MLPs of ``model.build_dlrm``."""
    device = torch.device(device)
    cols: DatasetSchema = job.data.columns
    return DedupDLRMTrain(
        DedupDLRM(
            EmbeddingBagCollection(tables=plain_model.embedding_bag_configs(job), device=device),
            user_features=cols.user_sparse_features,
            num_user_dense=len(cols.user.dense),
            num_item_dense=len(cols.item.dense),
            dense_arch_layer_sizes=job.train.bottom_mlp,
            over_arch_layer_sizes=job.train.top_mlp,
            dense_device=device,
            mlp_split_min_macs=mlp_split_min_macs,
        )
    )


def build_sharded_dedup_model(job: JobConfig, device: torch.device,
                              mlp_split_min_macs: float | None = None) -> DistributedModelParallel:
    """As ``model.build_sharded_model`` for the dedup model: fused row-wise Adagrad, the same sharding plan
    and the same data-parallel wrapping (none in a world of one)."""
    torch.manual_seed(job.train.seed)
    model = build_dedup_dlrm(job, "meta", mlp_split_min_macs)
    apply_optimizer_in_backward(
        RowWiseAdagrad,
        model.model.sparse_arch.parameters(),
        {"lr": job.train.embedding_learning_rate, "eps": plain_model.ADAGRAD_EPS},
    )
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    sharders = get_default_sharders()
    plan = plain_model.sharding_plan(model, job, device, world_size, sharders)
    log.info("dedup model sharding plan: %s",
             {k: {t: p.sharding_type for t, p in v.items()} for k, v in plan.plan.items()})
    return DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders,
                                    data_parallel_wrapper=plain_model.DataParallelOnlyWhenDistributed())


def dedup_state_dict_from_plain(state: Mapping[str, Any], columns: DatasetSchema | None = None) -> dict[str, Any]:
    """A ``DLRMTrain`` state dict for :class:`DedupDLRMTrain`: the same names, so a copy (kept as the one
    place that would map names if the two models' layouts ever diverged)."""
    return dict(state)


def plain_state_dict_from_dedup(state: Mapping[str, Any], columns: DatasetSchema | None = None) -> dict[str, Any]:
    """The inverse of :func:`dedup_state_dict_from_plain`."""
    return dict(state)


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
