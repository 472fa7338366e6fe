"""Training checkpoints: sharded model + both optimizers with torch.distributed.checkpoint.

A checkpoint directory holds::

    .metadata, __<rank>_0.distcp   DCP files: {"model", "fused_optim", "dense_optim"}
                                   (table-wise shards are ShardedTensors; every rank
                                   writes its own shards, rank 0 the metadata)
    progress.json                  TrainProgress, written by rank 0

Under Ray Train every rank saves into its own local directory and reports it;
Ray merges the per-rank directories into one checkpoint in storage, which
every rank then loads from on restore. :func:`save_checkpoint` and
:func:`load_checkpoint` are collectives: every rank must call them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torchrec.optim.keyed import KeyedOptimizer

__all__ = ["PROGRESS_FILE", "TrainProgress", "load_checkpoint", "read_progress", "save_checkpoint"]

PROGRESS_FILE = "progress.json"


@dataclass
class TrainProgress:
    """Where training stands: the data position and the running totals.

    ``epoch`` is the epoch the checkpoint was taken in; ``epoch_complete``
    says whether it was taken at that epoch's end. Consumption is
    at-least-once (ARCHITECTURE.md, "At-least-once consumption"): resuming from a mid-epoch checkpoint replays
    that epoch from its start, because which rows a worker receives from
    ``streaming_split`` is not deterministic; ``samples_in_epoch`` records
    how many would be replayed. Totals count every sample trained on,
    replays included.
    """

    epoch: int = 0
    epoch_complete: bool = False
    step_in_epoch: int = 0
    samples_in_epoch: int = 0
    global_step: int = 0
    samples: int = 0
    train_time_s: float = 0.0
    wait_s: float = 0.0
    compute_s: float = 0.0
    eval_auc: float | None = None
    eval_logloss: float | None = None

    @property
    def next_epoch(self) -> int:
        """The epoch a run restored from this progress starts with."""
        return self.epoch + 1 if self.epoch_complete else self.epoch


def _state(model: nn.Module, dense_optimizer: KeyedOptimizer) -> dict[str, Any]:
    fused = getattr(model, "fused_optimizer")
    return {
        "model": model.state_dict(),
        "fused_optim": fused.state_dict(),
        "dense_optim": dense_optimizer.state_dict(),
    }


def save_checkpoint(path: str | Path, model: nn.Module, dense_optimizer: KeyedOptimizer,
                    progress: TrainProgress) -> None:
    """Save on every rank into ``path`` (a rank-local directory); rank 0 adds progress.json."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(_state(model, dense_optimizer), checkpoint_id=str(path))
    if not dist.is_initialized() or dist.get_rank() == 0:
        (path / PROGRESS_FILE).write_text(json.dumps(asdict(progress), indent=2))


def read_progress(path: str | Path) -> TrainProgress:
    return TrainProgress(**json.loads((Path(path) / PROGRESS_FILE).read_text()))


def load_checkpoint(path: str | Path, model: nn.Module, dense_optimizer: KeyedOptimizer) -> TrainProgress:
    """Restore model and both optimizers in place from ``path`` (every rank reads the same directory)."""
    # DCP loads into existing tensors: create the lazily-built optimizer state first.
    dense_optimizer.init_state()
    state = _state(model, dense_optimizer)
    dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    getattr(model, "fused_optimizer").load_state_dict(state["fused_optim"])
    dense_optimizer.load_state_dict(state["dense_optim"])
    return read_progress(path)
