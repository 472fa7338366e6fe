"""Packed batches as tensors: the trainer's side of the packed-batch contract.

The Ray Data pipeline packs batches with :mod:`dlrm_platform.ingest.batching`
(plain) and :mod:`dlrm_platform.ingest.dedup_batching` (IKJT); both are numpy and
Arrow only, so that Ray Data workers never import torch. This module turns a
packed Arrow row into tensors (one copy per buffer):

    unpack_batch(row)        -> torchrec Batch       dense [B, D], KJT stride B, labels [B]
    unpack_dedup_batch(row)  -> DedupBatch           user rows [U, ...], inverse [B], item side [B, ...]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from dlrm_platform.ingest.batching import _row_values

__all__ = ["DedupBatch", "dummy_dedup_batch", "embedding_expansion_index", "unpack_batch", "unpack_dedup_batch"]


def unpack_batch(table: pa.Table, sparse_features: Sequence[str], num_dense: int, row: int = 0) -> Batch:
    """Turn packed row ``row`` of ``table`` into a TorchRec ``Batch`` (see module docstring)."""
    b = int(table.column("num_samples")[row].as_py())
    labels = torch.from_numpy(_row_values(table, "labels", row).copy())
    dense = torch.from_numpy(_row_values(table, "dense", row).copy()).view(b, num_dense)
    lengths = torch.from_numpy(_row_values(table, "lengths", row).copy())
    values = torch.from_numpy(_row_values(table, "values", row).copy())
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(sparse_features), values=values, lengths=lengths)
    return Batch(dense_features=dense, sparse_features=kjt, labels=labels)


def _gather_jagged(lengths: torch.Tensor, values: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``index`` of a jagged tensor: (lengths[index], their values concatenated)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.to(torch.int64), 0, out=offsets[1:])
    new_lengths = lengths[index]
    total = int(new_lengths.sum())
    if total == 0:
        return new_lengths, values[:0]
    starts = offsets[:-1][index]
    new_offsets = torch.cumsum(new_lengths.to(torch.int64), 0) - new_lengths
    pos = torch.repeat_interleave(starts - new_offsets, new_lengths.to(torch.int64), output_size=total)
    pos = pos + torch.arange(total, device=values.device)
    return new_lengths, values[pos]


def _padded_kjt(user: KeyedJaggedTensor, item: KeyedJaggedTensor, num_users: int, num_samples: int) -> KeyedJaggedTensor:
    """User and item features in one KJT of stride B: user features padded with B - U empty bags."""
    fu = len(user.keys())
    user_lengths = user.lengths().to(torch.int32).view(fu, num_users)
    if num_samples > num_users:
        user_lengths = torch.nn.functional.pad(user_lengths, (0, num_samples - num_users))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[*user.keys(), *item.keys()],
        values=torch.cat([user.values().to(torch.int64), item.values().to(torch.int64)]),
        lengths=torch.cat([user_lengths.reshape(-1), item.lengths().to(torch.int32)]),
    )


def embedding_expansion_index(inverse: torch.Tensor, num_user_features: int, num_item_features: int) -> torch.Tensor:
    """int64 [B * F]: for each sample and feature (user features first), the row of the pooled embeddings
    viewed as ``[B * F, E]`` it reads: a user feature of sample ``b`` reads user row ``inverse[b]`` (the
    first ``U`` rows of the padded collection's output), an item feature its own row.

    One gather with it replaces slicing the user and item blocks, expanding the user block and
    concatenating them again (whose backward allocates and fills the whole gradient twice).
    """
    num_features = num_user_features + num_item_features
    feature = torch.arange(num_features, device=inverse.device)
    sample = torch.arange(inverse.numel(), device=inverse.device)
    rows = torch.where(feature < num_user_features, inverse.to(torch.int64).unsqueeze(1), sample.unsqueeze(1))
    return (rows * num_features + feature).reshape(-1)


@dataclass
class DedupBatch(Pipelineable):
    """A dedup batch as tensors: ``U`` user rows, ``B`` samples (see the module docstring).

    user_dense  float32 [U, Du]       user_sparse  KJT, user keys, stride U
    inverse     int64   [B]           user row of each sample
    item_dense  float32 [B, Di]       item_sparse  KJT, item keys, stride B
    labels      float32 [B]
    packed_bytes: size of the packed Arrow row it came from (0 when built otherwise)
    sparse_features: derived, what the model's one embedding collection takes: every key (user,
        then item) at stride B, each user feature's U user rows followed by B - U empty bags::

            u_cat_0    [17] [4] [9] [] []        <- U = 3 user rows, then empty bags (no lookup)
            u_history  [3,1,4] [1,5] [] [] []
            i_cat_0    [5] [8] [2] [5] [7]       <- per sample

    expansion_index: derived, int64 [B * F], :func:`embedding_expansion_index` (built with the
        batch, on the read-ahead thread, not in the training step)
    """

    user_dense: torch.Tensor
    user_sparse: KeyedJaggedTensor
    inverse: torch.Tensor
    item_dense: torch.Tensor
    item_sparse: KeyedJaggedTensor
    labels: torch.Tensor
    packed_bytes: int = 0
    sparse_features: KeyedJaggedTensor | None = None
    expansion_index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.sparse_features is None:
            self.sparse_features = _padded_kjt(self.user_sparse, self.item_sparse, self.num_users, self.num_samples)
        if self.expansion_index is None:
            self.expansion_index = embedding_expansion_index(self.inverse, len(self.user_sparse.keys()),
                                                             len(self.item_sparse.keys()))

    @property
    def num_samples(self) -> int:
        return int(self.inverse.numel())

    @property
    def num_users(self) -> int:
        return int(self.user_dense.shape[0])

    @property
    def dedup_factor(self) -> float:
        """Samples per unique user row."""
        return self.num_samples / max(self.num_users, 1)

    def to(self, device: torch.device, non_blocking: bool = False) -> DedupBatch:
        return DedupBatch(
            user_dense=self.user_dense.to(device=device, non_blocking=non_blocking),
            user_sparse=self.user_sparse.to(device=device, non_blocking=non_blocking),
            inverse=self.inverse.to(device=device, non_blocking=non_blocking),
            item_dense=self.item_dense.to(device=device, non_blocking=non_blocking),
            item_sparse=self.item_sparse.to(device=device, non_blocking=non_blocking),
            labels=self.labels.to(device=device, non_blocking=non_blocking),
            packed_bytes=self.packed_bytes,
            sparse_features=self.sparse_features.to(device=device, non_blocking=non_blocking),
            expansion_index=self.expansion_index.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        for t in (self.user_dense, self.inverse, self.item_dense, self.labels, self.expansion_index):
            t.record_stream(stream)
        self.user_sparse.record_stream(stream)
        self.item_sparse.record_stream(stream)
        self.sparse_features.record_stream(stream)

    def pin_memory(self) -> DedupBatch:
        return DedupBatch(
            user_dense=self.user_dense.pin_memory(),
            user_sparse=self.user_sparse.pin_memory(),
            inverse=self.inverse.pin_memory(),
            item_dense=self.item_dense.pin_memory(),
            item_sparse=self.item_sparse.pin_memory(),
            labels=self.labels.pin_memory(),
            packed_bytes=self.packed_bytes,
            sparse_features=self.sparse_features.pin_memory(),
            expansion_index=self.expansion_index.pin_memory(),
        )

    def expand(self) -> Batch:
        """The plain ``Batch`` of the same samples: every user row copied to each of its samples."""
        return self._expanded(self.inverse)

    def expand_user_bags_once(self) -> Batch:
        """As :meth:`expand`, but each user row's sparse bags go to its first sample only (the others' are empty).

        The plain model then pools each user row's ids once and updates the same embedding rows, as the
        dedup model does: benchmarks measure with it what deduplicating the lookups can save at most
        (the optimizer's work per distinct row stays; only the repeated ids go).
        """
        inv = self.inverse.to(torch.int64)
        first = torch.full((self.num_users,), inv.numel(), dtype=torch.int64, device=inv.device)
        first.scatter_reduce_(0, inv, torch.arange(inv.numel(), device=inv.device), reduce="amin")
        order = torch.argsort(first)  # user rows in the order of their first samples
        return self._expanded(inv, bags=(order, first[order]))

    def _expanded(self, inv: torch.Tensor, bags: tuple[torch.Tensor, torch.Tensor] | None = None) -> Batch:
        """Plain batch; ``bags``: (user rows, the samples they go to) instead of every row to every sample."""
        dense = torch.cat([self.user_dense[inv], self.item_dense], dim=1)
        lengths, values = [], []
        user, item = self.user_sparse, self.item_sparse
        stride_u = self.num_users
        user_lengths, user_values = user.lengths(), user.values()
        offsets = user.offset_per_key()
        for k in range(len(user.keys())):
            lk = user_lengths[k * stride_u : (k + 1) * stride_u]
            vk = user_values[offsets[k] : offsets[k + 1]]
            if bags is None:
                gl, gv = _gather_jagged(lk, vk, inv)
            else:
                rows, samples = bags
                sl, gv = _gather_jagged(lk, vk, rows)
                gl = torch.zeros(inv.numel(), dtype=lk.dtype, device=lk.device)
                gl[samples] = sl
            lengths.append(gl)
            values.append(gv)
        lengths.append(item.lengths())
        values.append(item.values())
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[*user.keys(), *item.keys()],
            values=torch.cat([t.to(torch.int64) for t in values]),
            lengths=torch.cat([t.to(torch.int32) for t in lengths]),
        )
        return Batch(dense_features=dense, sparse_features=kjt, labels=self.labels)


def unpack_dedup_batch(
    table: pa.Table,
    user_sparse_features: Sequence[str],
    item_sparse_features: Sequence[str],
    num_user_dense: int,
    num_item_dense: int,
    row: int = 0,
) -> DedupBatch:
    """Packed dedup row ``row`` of ``table`` as a :class:`DedupBatch` (one copy per buffer)."""
    b = int(table.column("num_samples")[row].as_py())
    u = int(table.column("num_users")[row].as_py())

    def col(name: str) -> torch.Tensor:
        return torch.from_numpy(_row_values(table, name, row).copy())

    # Not synced (per-key lengths computed when asked): the model reads only the padded KJT built from
    # them (``sparse_features``, synced here, off the training thread); syncing these too cost ~25% of the unpack.
    user_kjt = KeyedJaggedTensor(keys=list(user_sparse_features), values=col("user_values"), lengths=col("user_lengths"))
    item_kjt = KeyedJaggedTensor(keys=list(item_sparse_features), values=col("values"), lengths=col("lengths"))
    return DedupBatch(
        user_dense=col("user_dense").view(u, num_user_dense),
        user_sparse=user_kjt,
        inverse=col("inverse").to(torch.int64),
        item_dense=col("dense").view(b, num_item_dense),
        item_sparse=item_kjt,
        labels=col("labels"),
        packed_bytes=int(table.slice(row, 1).nbytes) if table.num_rows > 1 else int(table.nbytes),
    )


def dummy_dedup_batch(
    user_sparse_features: Sequence[str],
    item_sparse_features: Sequence[str],
    num_user_dense: int,
    num_item_dense: int,
    device: torch.device | str = "cpu",
) -> DedupBatch:
    """A one-sample, one-user batch (zeros, id 0 in every table) for a zero-weight lockstep step."""

    def kjt(keys: Sequence[str]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(
            keys=list(keys),
            values=torch.zeros(len(keys), dtype=torch.int64),
            lengths=torch.ones(len(keys), dtype=torch.int32),
        )

    return DedupBatch(
        user_dense=torch.zeros(1, num_user_dense),
        user_sparse=kjt(user_sparse_features),
        inverse=torch.zeros(1, dtype=torch.int64),
        item_dense=torch.zeros(1, num_item_dense),
        item_sparse=kjt(item_sparse_features),
        labels=torch.zeros(1),
    ).to(torch.device(device))
