"""Training checkpoints: sharded model + both optimizers with torch.distributed.checkpoint.

A checkpoint directory holds::

    .metadata, __<rank>_0.distcp   DCP files: {"model", "fused_optim", "dense_optim"}
                                   (table-wise shards are ShardedTensors; every rank
                                   writes its own shards, rank 0 the metadata)
    progress.json                  TrainProgress, written by rank 0
    manifest-rank<r>.json          written last by each rank: size and CRC-32 of every file
                                   that rank wrote (rank 0's also records the world size)

Under Ray Train every rank saves into its own local directory and reports it;
Ray merges the per-rank directories into one checkpoint in storage, which
every rank then loads from on restore. :func:`save_checkpoint` and
:func:`load_checkpoint` are collectives: every rank must call them.

A checkpoint is used only if every rank's manifest is there and every file
matches it (:func:`verify_checkpoint`): a write cut short (disk full, a killed
process, a failed upload) or a file damaged later is detected, and
:func:`usable_checkpoint` falls back to the newest intact checkpoint beside
it. A write that fails raises :class:`CheckpointWriteError` naming the path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from dlrm_platform.errors import UserError

if TYPE_CHECKING:  # the job's driver checks storage with this module and need not load TorchRec (seconds)
    from torchrec.optim.keyed import KeyedOptimizer

__all__ = [
    "PROGRESS_FILE",
    "CheckpointCorruptError",
    "CheckpointWriteError",
    "TrainProgress",
    "check_checkpoint_storage",
    "estimate_checkpoint_bytes",
    "load_checkpoint",
    "read_progress",
    "save_checkpoint",
    "usable_checkpoint",
    "verify_checkpoint",
]

log = logging.getLogger(__name__)

PROGRESS_FILE = "progress.json"
MANIFEST_PREFIX = "manifest-rank"
_MANIFEST_RE = re.compile(r"^manifest-rank(\d+)\.json$")
# Names Worker.checkpoint gives (train/loop.py): checkpoint_e<epoch>_s<global step>[_end]
_CHECKPOINT_NAME_RE = re.compile(r"^checkpoint_e(\d+)_s(\d+)(_end)?$")


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (disk full, directory not writable...). Names the path."""


class CheckpointCorruptError(UserError):
    """A checkpoint is incomplete or damaged, and no intact one is beside it."""


@dataclass
class TrainProgress:
    """Where training stands: the data position and the running totals.

    ``epoch`` is the epoch the checkpoint was taken in; ``epoch_complete``
    says whether it was taken at that epoch's end. Ray Data's consumption is
    at-least-once (ARCHITECTURE.md, "At-least-once consumption"), and which
    batches a worker receives from the feed service is not deterministic, so
    the data position is recorded by content: ``trained_in_epoch`` holds the
    digests (``ingest.batching.packed_digest``) of every batch any worker
    trained in ``epoch`` so far; a run resumed mid-epoch skips exactly those
    (``train.feed.ShardFeeder``), and every sample of every epoch is trained
    once. Totals count every sample trained on. ``auc``/``logloss``: held-out, after
    the last evaluated epoch (the names :class:`~.result.TrainReport` gives them).
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
    auc: float | None = None
    logloss: float | None = None
    trained_in_epoch: list[str] = field(default_factory=list)  # digests of the batches `epoch` trained so far

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


def _rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _crc32(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name, flushed to disk, then renamed."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_manifest(path: Path, rank: int, world_size: int, files: list[str]) -> None:
    entries = {name: {"size": (path / name).stat().st_size, "crc32": _crc32(path / name)} for name in sorted(files)}
    manifest = {"rank": rank, "world_size": world_size, "files": entries}
    _write_durably(path / f"{MANIFEST_PREFIX}{rank}.json", json.dumps(manifest, indent=1).encode())


def save_checkpoint(path: str | Path, model: nn.Module, dense_optimizer: KeyedOptimizer,
                    progress: TrainProgress) -> None:
    """Save on every rank into ``path`` (a rank-local directory); rank 0 adds progress.json.

    Each rank writes its manifest last. Raises :class:`CheckpointWriteError`
    naming ``path`` when anything cannot be written (no space, no permission).
    """
    path = Path(path)
    rank, world_size = _rank_and_world()
    try:
        path.mkdir(parents=True, exist_ok=True)
        dcp.save(_state(model, dense_optimizer), checkpoint_id=str(path))
        if rank == 0:
            _write_durably(path / PROGRESS_FILE, json.dumps(asdict(progress), indent=2).encode())
        # The directory is this rank's own: every file in it is this rank's checkpoint.
        written = [p.name for p in path.iterdir()
                   if p.is_file() and not _MANIFEST_RE.match(p.name) and not p.name.endswith(".tmp")]
        _write_manifest(path, rank, world_size, written)
    except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
        free = _free_bytes(path)
        space = f"; {free / 2**20:.0f} MiB free there" if free is not None else ""
        raise CheckpointWriteError(
            f"cannot write the checkpoint to {path} (rank {rank}): {type(err).__name__}: {_short(err)}{space}"
        ) from err


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 500 else text[:497] + "..."


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


def verify_checkpoint(path: str | Path) -> TrainProgress:
    """Check ``path`` against its manifests; its progress if intact, else :class:`CheckpointCorruptError`."""
    path = Path(path)

    def bad(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"checkpoint {path} is incomplete or damaged: {why}")

    if not path.is_dir():
        raise bad("no such directory")
    manifests: dict[int, dict[str, Any]] = {}
    for p in path.iterdir():
        m = _MANIFEST_RE.match(p.name)
        if m:
            try:
                manifests[int(m.group(1))] = json.loads(p.read_text())
            except (OSError, ValueError) as err:
                raise bad(f"unreadable manifest {p.name} ({err})") from None
    if 0 not in manifests:
        raise bad(f"no {MANIFEST_PREFIX}0.json (each rank writes its manifest last: the write did not finish)")
    world_size = manifests[0].get("world_size")
    if not isinstance(world_size, int) or sorted(manifests) != list(range(world_size)):
        raise bad(f"manifests of ranks {sorted(manifests)} but the checkpoint was written by {world_size} ranks")
    if PROGRESS_FILE not in manifests[0].get("files", {}):
        raise bad(f"{PROGRESS_FILE} is not in rank 0's manifest")
    for rank, manifest in sorted(manifests.items()):
        for name, entry in manifest.get("files", {}).items():
            f = path / name
            if not f.is_file():
                raise bad(f"{name} (rank {rank}) is missing")
            size = f.stat().st_size
            if size != entry.get("size"):
                raise bad(f"{name} (rank {rank}) has {size} bytes, {entry.get('size')} were written")
            if _crc32(f) != entry.get("crc32"):
                raise bad(f"{name} (rank {rank}) does not match its checksum")
    try:
        return read_progress(path)
    except (OSError, ValueError, TypeError) as err:
        raise bad(f"{PROGRESS_FILE} unreadable ({err})") from None


def _order(p: Path) -> tuple[int, int, int] | None:
    m = _CHECKPOINT_NAME_RE.match(p.name)
    return (int(m.group(1)), int(m.group(2)), 1 if m.group(3) else 0) if m else None


def usable_checkpoint(path: str | Path) -> str:
    """``path`` if it is intact, else the newest intact checkpoint beside it (same run), logged.

    Raises :class:`CheckpointCorruptError` when none is intact: silently starting
    from zero would throw away the run's progress.
    """
    path = Path(path)
    try:
        verify_checkpoint(path)
        return str(path)
    except CheckpointCorruptError as err:
        problems = [str(err)]
    parent = path.parent
    siblings = [p for p in parent.iterdir() if p.is_dir() and p != path and _order(p) is not None] \
        if parent.is_dir() else []
    for candidate in sorted(siblings, key=_order, reverse=True):
        try:
            verify_checkpoint(candidate)
        except CheckpointCorruptError as err:
            problems.append(str(err))
            continue
        log.warning("%s; restoring the previous intact checkpoint %s instead", problems[0], candidate)
        return str(candidate)
    raise CheckpointCorruptError("no intact checkpoint to restore:\n  " + "\n  ".join(problems))


def estimate_checkpoint_bytes(job: Any, keep: int = 2) -> int:
    """Storage the job's checkpoints take: ``keep`` kept (trainer's CheckpointConfig) + one being written.

    The embedding tables dominate: fp32 rows plus the row-wise Adagrad state (one value per row); the
    MLPs are counted with two optimizer moments. A lower bound, good for refusing a full disk up front.
    """
    tables = sum(job.ingest.table_size(f) for f in job.data.columns.sparse_features)
    dim = job.train.embedding_dim
    widths = [len(job.data.columns.dense_columns), *job.train.bottom_mlp]
    mlp = sum(a * b for a, b in zip(widths, widths[1:]))
    interactions = len(job.data.columns.sparse_features) + 1
    top = [dim + interactions * (interactions - 1) // 2, *job.train.top_mlp]
    mlp += sum(a * b for a, b in zip(top, top[1:]))
    one = 4 * (tables * (dim + 1) + 3 * mlp)
    return (keep + 1) * one


def check_checkpoint_storage(storage_path: str, *, need_bytes: int = 0) -> None:
    """Before training: the checkpoint storage must be a writable directory with room for ``need_bytes``.

    URIs (``s3://...``) are left to Ray. Raises :class:`CheckpointWriteError` naming the path.
    """
    if "://" in storage_path:
        return
    path = Path(storage_path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        _write_durably(path / f".write-probe-{uuid.uuid4().hex[:8]}", b"ok")
        for probe in path.glob(".write-probe-*"):
            probe.unlink(missing_ok=True)
    except OSError as err:
        raise CheckpointWriteError(
            f"checkpoint storage {path} is not writable ({type(err).__name__}: {_short(err)}); "
            "set train.storage_path to a writable directory"
        ) from None
    free = _free_bytes(path)
    if free is not None and need_bytes and free < need_bytes:
        raise CheckpointWriteError(
            f"checkpoint storage {path} has {free / 2**20:.0f} MiB free, the job's checkpoints need about "
            f"{need_bytes / 2**20:.0f} MiB; free space there or set train.storage_path elsewhere"
        )


# progress.json written before TrainProgress took TrainReport's names: old name -> field
_RENAMED_PROGRESS_FIELDS = {"eval_auc": "auc", "eval_logloss": "logloss"}


def read_progress(path: str | Path) -> TrainProgress:
    """The checkpoint's progress.json; one written under the old field names (``eval_auc``...) reads the same."""
    fields = json.loads((Path(path) / PROGRESS_FILE).read_text())
    for old, new in _RENAMED_PROGRESS_FIELDS.items():
        if old in fields:
            fields.setdefault(new, fields.pop(old))
    return TrainProgress(**fields)


def load_checkpoint(path: str | Path, model: nn.Module, dense_optimizer: KeyedOptimizer) -> TrainProgress:
    """Restore model and both optimizers in place from ``path`` (every rank reads the same directory).

    Verifies the checkpoint first (:class:`CheckpointCorruptError` if it is not
    intact); pick it with :func:`usable_checkpoint` to fall back to an earlier one.
    """
    verify_checkpoint(path)
    # DCP loads into existing tensors: create the lazily-built optimizer state first.
    dense_optimizer.init_state()
    state = _state(model, dense_optimizer)
    dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    getattr(model, "fused_optimizer").load_state_dict(state["fused_optim"])
    dense_optimizer.load_state_dict(state["dense_optim"])
    return read_progress(path)
