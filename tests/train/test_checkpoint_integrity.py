"""Checkpoint integrity: a failed write is an error naming the path, never a silent corrupt checkpoint;
a truncated, damaged or unfinished checkpoint is detected on load and the previous intact one is used."""

from __future__ import annotations

import json
import resource
import signal
import types
from pathlib import Path

import pytest
import torch

from dlrm_platform.train.batches import unpack_batch
from dlrm_platform.train import checkpoint as ckpt
from dlrm_platform.train.checkpoint import (
    CheckpointCorruptError,
    CheckpointWriteError,
    TrainProgress,
    check_checkpoint_storage,
    estimate_checkpoint_bytes,
    load_checkpoint,
    save_checkpoint,
    usable_checkpoint,
    verify_checkpoint,
)
from dlrm_platform.train.lockstep import StepBatch
from dlrm_platform.train.loop import Worker
from dlrm_platform.train.model import build_dense_optimizer, build_sharded_model
from dlrm_platform.train.mlflow_logger import NullTracker


def _worker(job) -> Worker:
    model = build_sharded_model(job, torch.device("cpu"))
    return Worker(job, model, build_dense_optimizer(model, job.train), torch.device("cpu"), 0, 1, NullTracker())


def _batches(packed_batch, n: int, start: int = 0) -> list[StepBatch]:
    return [StepBatch(unpack_batch(packed_batch(24, seed=s), ["uc", "hist", "ic"], 3), 24, 24, 0.0)
            for s in range(start, start + n)]


@pytest.fixture
def run_dir(tiny_job, packed_batch, gloo_group, tmp_path) -> tuple[Path, Worker, list[StepBatch]]:
    """A run directory with two checkpoints (after 1 and after 2 steps), as Worker.checkpoint names them;
    returns it, the worker (trained 2 steps) and the batches to continue with."""
    worker = _worker(tiny_job())
    batches = _batches(packed_batch, 4)
    root = tmp_path / "run"
    for step in (1, 2):
        worker.train_step(batches[step - 1])
        save_checkpoint(root / f"checkpoint_e000_s{step:08d}", worker.model, worker.dense_optimizer,
                        TrainProgress(global_step=step, samples=24 * step))
    return root, worker, batches[2:]


def _newest(root: Path) -> Path:
    return root / "checkpoint_e000_s00000002"


def _distcp(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def test_every_file_is_in_the_manifest_written_last(run_dir) -> None:
    root, _, _ = run_dir
    path = _newest(root)
    manifest = json.loads((path / "manifest-rank0.json").read_text())
    assert manifest["world_size"] == 1
    files = {p.name for p in path.iterdir() if p.is_file() and not p.name.startswith("manifest-")}
    assert set(manifest["files"]) == files and {".metadata", "progress.json"} <= files
    assert verify_checkpoint(path).global_step == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest", "missing_file", "empty_manifest"])
def test_damaged_checkpoint_is_detected_and_the_previous_one_used(run_dir, tiny_job, damage) -> None:
    root, trained, rest = run_dir
    path = _newest(root)
    data = _distcp(path)
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "no_manifest":  # the write was cut before the manifest
        (path / "manifest-rank0.json").unlink()
    elif damage == "missing_file":
        (path / "progress.json").unlink()
    else:
        (path / "manifest-rank0.json").write_text("{")
    with pytest.raises(CheckpointCorruptError, match=str(path)):
        verify_checkpoint(path)
    restored = _worker(tiny_job(seed=99))
    with pytest.raises(CheckpointCorruptError):
        load_checkpoint(path, restored.model, restored.dense_optimizer)

    previous = usable_checkpoint(path)
    assert previous == str(root / "checkpoint_e000_s00000001")
    progress = load_checkpoint(previous, restored.model, restored.dense_optimizer)
    assert progress.global_step == 1
    # Restored from the previous checkpoint: replaying step 2 gives the trained model's step 2 exactly.
    reference = _worker(tiny_job())
    load_checkpoint(previous, reference.model, reference.dense_optimizer)
    for b in rest:
        assert restored.train_step(b) == pytest.approx(reference.train_step(b), rel=1e-6)


def test_an_intact_checkpoint_is_used_as_is(run_dir) -> None:
    root, _, _ = run_dir
    assert usable_checkpoint(_newest(root)) == str(_newest(root))


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(run_dir) -> None:
    root, _, _ = run_dir
    for p in root.iterdir():
        (p / "manifest-rank0.json").unlink()
    with pytest.raises(CheckpointCorruptError, match="no intact checkpoint") as err:
        usable_checkpoint(_newest(root))
    assert "checkpoint_e000_s00000001" in str(err.value) and "checkpoint_e000_s00000002" in str(err.value)


def test_a_missing_rank_is_detected(run_dir) -> None:
    root, _, _ = run_dir
    path = _newest(root)
    manifest = json.loads((path / "manifest-rank0.json").read_text())
    manifest["world_size"] = 2  # rank 1's upload never arrived
    (path / "manifest-rank0.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorruptError, match="written by 2 ranks"):
        verify_checkpoint(path)


def test_write_failure_mid_file_is_an_error_naming_the_path(tiny_job, gloo_group, tmp_path) -> None:
    """A real failed write (the file-size limit: EFBIG, as ENOSPC on a full disk): never a silent checkpoint."""
    worker = _worker(tiny_job())
    target = tmp_path / "ck"
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(CheckpointWriteError, match=str(target)) as err:
            save_checkpoint(target, worker.model, worker.dense_optimizer, TrainProgress())
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert "MiB free" in str(err.value)
    assert not (target / "manifest-rank0.json").exists()
    with pytest.raises(CheckpointCorruptError):
        verify_checkpoint(target)


def test_unwritable_directory_is_an_error_naming_the_path(tiny_job, gloo_group, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    worker = _worker(tiny_job())
    with pytest.raises(CheckpointWriteError, match=str(blocker / "ck")):
        save_checkpoint(blocker / "ck", worker.model, worker.dense_optimizer, TrainProgress())


def test_storage_is_checked_before_training(tiny_job, tmp_path) -> None:
    check_checkpoint_storage(str(tmp_path / "storage"))
    assert (tmp_path / "storage").is_dir() and not list((tmp_path / "storage").iterdir())  # probe removed
    check_checkpoint_storage("s3://bucket/prefix")  # left to Ray
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointWriteError, match=f"{tmp_path / 'a-file' / 'storage'} is not writable"):
        check_checkpoint_storage(str(tmp_path / "a-file" / "storage"))
    with pytest.raises(CheckpointWriteError, match="MiB free, the job's checkpoints need about"):
        check_checkpoint_storage(str(tmp_path / "storage"), need_bytes=2**62)
    job = tiny_job()
    assert estimate_checkpoint_bytes(job) > 3 * 4 * sum(job.ingest.table_size(f) for f in job.data.columns.sparse_features)


def test_failed_upload_to_storage_names_the_path(tiny_job, gloo_group, monkeypatch, tmp_path) -> None:
    import ray.train

    worker = _worker(tiny_job())

    def report(*args, **kwargs):
        raise OSError(28, "No space left on device")

    storage = types.SimpleNamespace(experiment_fs_path=str(tmp_path / "ray_results" / "run"))
    monkeypatch.setattr(ray.train, "report", report)
    monkeypatch.setattr(ray.train, "get_context", lambda: types.SimpleNamespace(get_storage=lambda: storage))
    with pytest.raises(CheckpointWriteError, match="No space left on device") as err:
        worker.checkpoint(worker.report(0))
    assert f"{storage.experiment_fs_path}/checkpoint_e000_s00000000" in str(err.value)


def test_names_order_newest_last() -> None:
    names = ["checkpoint_e001_s00000010", "checkpoint_e000_s00000010_end", "checkpoint_e001_s00000003",
             "checkpoint_e000_s00000010", "other"]
    ordered = sorted((n for n in names if ckpt._order(Path(n))), key=lambda n: ckpt._order(Path(n)))
    assert ordered == ["checkpoint_e000_s00000010", "checkpoint_e000_s00000010_end", "checkpoint_e001_s00000003",
                       "checkpoint_e001_s00000010"]
