"""The chaos count itself: a lost, a repeated and a foreign batch each show up (no Ray)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import scenarios
from dlrm_platform.ingest.batching import packed_digest
from dlrm_platform.train.checkpoint import PROGRESS_FILE, TrainProgress


def _end_checkpoint(storage: Path, epoch: int, digests: list[str]) -> None:
    path = storage / "run" / f"checkpoint_e{epoch:03d}_s{10 * (epoch + 1):08d}_end"
    path.mkdir(parents=True)
    progress = TrainProgress(epoch=epoch, epoch_complete=True, trained_in_epoch=digests)
    (path / PROGRESS_FILE).write_text(json.dumps(asdict(progress)))


def test_exactly_once_counts_samples_lost_and_trained_twice(tmp_path: Path):
    batches = scenarios.packed_batches(4, seed=1)
    d = [packed_digest(b) for b in batches]
    assert len(set(d)) == 4
    _end_checkpoint(tmp_path, 0, d)  # epoch 0: each once
    _end_checkpoint(tmp_path, 1, [d[0], d[1], d[1], d[3]])  # epoch 1: d[2] lost, d[1] twice
    lost, twice, checked = scenarios.exactly_once(tmp_path, batches, epochs=3)  # epoch 2 never ended
    assert checked == [0, 1]
    assert lost == scenarios.BATCH + 4 * scenarios.BATCH
    assert twice == scenarios.BATCH
    assert scenarios.exactly_once(tmp_path, batches, epochs=1) == (0, 0, [0])
