"""RecD conversion: flat row-per-sample Parquet -> the session-dedup format (:mod:`.dedup_storage`).

The converter (:func:`convert_to_dedup`, ``dlrm-platform dedup-convert``) is a
Ray Data job: read the flat files -> give missing keys their own session ->
``sort`` by session key (range-partitioned, so all rows of a key land in one
block) -> one task per block writes its ``users``/``samples`` pair. Splits of
up to :data:`LOCAL_MAX_ROWS` rows are converted in-process by default (same
code per block, same output), where the sort's task overhead would dominate.
A job with ``ingest.dedup`` on converts its flat dataset on first use into
``<data.path>.dedup`` and reuses it while the source files are unchanged
(:func:`ensure_dedup_dataset`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlrm_platform.config import DatasetSchema, JobConfig, revalidate
from dlrm_platform.errors import UserError
from dlrm_platform.ingest import transforms
from dlrm_platform.ingest._mix import mix64
from dlrm_platform.ingest.dedup_storage import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    SAMPLES_DIR,
    USERS_DIR,
    DedupDataset,
    column_array,
    default_dedup_dir,
    item_columns,
    key_array,
    require_key,
    user_columns,
    write_shard,
)
from dlrm_platform.ingest.layout import is_complete, mark_complete, write_schema_yaml

__all__ = [
    "DEFAULT_ROWS_PER_SHARD",
    "LOCAL_MAX_ROWS",
    "ConversionReport",
    "SplitReport",
    "convert_split_local",
    "convert_table",
    "convert_to_dedup",
    "dedup_job_shards",
    "ensure_dedup_dataset",
    "source_fingerprint",
]

log = logging.getLogger(__name__)

DEFAULT_ROWS_PER_SHARD = 50_000
LOCAL_MAX_ROWS = 2_000_000  # convert_to_dedup(engine="auto"): up to this many rows per split, in-process


def _same_as_previous(col: pa.Array) -> np.ndarray:
    """bool [n]: row i equals row i-1 (row 0: False); nulls equal nulls, NaN equals NaN."""
    n = len(col)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        col = col.fill_null(pa.scalar([], t)) if col.null_count else col
        lengths = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.asarray(col.offsets, dtype=np.int64)
        offsets = offsets - offsets[0]
        flat = col.flatten().to_numpy(zero_copy_only=False)
        cand = np.flatnonzero(lengths[1:] == lengths[:-1]) + 1  # rows whose length matches the previous
        if len(cand):
            lens = lengths[cand]
            total = int(lens.sum())
            if total:
                starts_i, starts_p = offsets[cand], offsets[cand - 1]
                within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
                diff = flat[np.repeat(starts_i, lens) + within] != flat[np.repeat(starts_p, lens) + within]
                mism = np.bincount(np.repeat(np.arange(len(cand)), lens), weights=diff, minlength=len(cand))
            else:
                mism = np.zeros(len(cand))
            out[cand] = mism == 0
        return out
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    values = col.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(t):
        values = np.asarray(values, dtype=np.float64)
        eq = (values[1:] == values[:-1]) | (np.isnan(values[1:]) & np.isnan(values[:-1]))
    else:
        eq = values[1:] == values[:-1]
    eq = np.where(valid[1:] & valid[:-1], eq, ~valid[1:] & ~valid[:-1])
    out[1:] = eq
    return out


def _with_session_keys(table: pa.Table, key: str) -> tuple[pa.Table, int]:
    """Integer keys, a fresh own-session key for every missing one; returns (table, number missing)."""
    col = table.column(key)
    missing = int(col.null_count)
    keys = transforms.session_keys(col)  # same rule as the plain parse: missing key -> its own session
    return table.set_column(table.schema.get_field_index(key), key, keys), missing


def convert_table(table: pa.Table, columns: DatasetSchema) -> tuple[pa.Table, pa.Table, dict[str, int]]:
    """Split flat rows (any order, keys already non-null) into the ``users`` and ``samples`` tables.

    Returns both sorted by key plus counts (``sessions``, ``samples``, ``split_sessions``).
    Rows of one key whose user-side columns differ become separate sessions (fresh keys).
    """
    key = require_key(columns)
    keys = key_array(table.column(key))
    if len(keys) and not np.all(keys[1:] >= keys[:-1]):
        order = np.argsort(keys, kind="stable")
        table, keys = table.take(pa.array(order)), keys[order]
    table = table.combine_chunks()
    ucols = user_columns(columns)
    starts, same = _run_starts(table, keys, ucols)
    split = int((starts & same).sum())
    if split:
        # Some key's rows disagree on user features: bring equal features together (sort by a row
        # hash within the key), then every remaining run of a key beyond its first is a new session.
        order = np.lexsort((_row_hash(table, ucols), keys))
        table, keys = table.take(pa.array(order)).combine_chunks(), keys[order]
        starts, same = _run_starts(table, keys, ucols)
        variants = starts & same
        split = int(variants.sum())
        run = np.cumsum(starts) - 1
        run_key = keys[starts].copy()
        run_key[run[variants]] = transforms.fresh_session_keys(split)
        keys = run_key[run]
        order = np.argsort(keys, kind="stable")
        table, keys = table.take(pa.array(order)), keys[order]
        starts = np.ones(len(keys), dtype=bool)
        starts[1:] = keys[1:] != keys[:-1]
    table = table.set_column(table.schema.get_field_index(key), key, pa.array(keys, pa.int64()))
    users = table.select([key, *ucols]).filter(pa.array(starts))
    samples = table.select([key, *item_columns(columns)])
    return users, samples, {"sessions": users.num_rows, "samples": samples.num_rows, "split_sessions": split}


def _run_starts(table: pa.Table, keys: np.ndarray, ucols: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(row starts a run of equal key and user features, row has the previous row's key); rows sorted by key."""
    same = np.zeros(len(keys), dtype=bool)
    same[1:] = keys[1:] == keys[:-1]
    same_user = np.ones(len(keys), dtype=bool)
    for name in ucols:
        same_user &= _same_as_previous(column_array(table.column(name)))
    return ~same | ~same_user, same



def _row_hash(table: pa.Table, names: Sequence[str]) -> np.ndarray:
    """uint64 [n]: a hash of each row's values in ``names`` (equal rows, equal hashes; nulls and NaN included)."""
    n = table.num_rows
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in names:
            col = column_array(table.column(name))
            if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                col = col.fill_null(pa.scalar([], col.type)) if col.null_count else col
                lengths = col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
                flat = pc.fill_null(col.flatten(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
                pos = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
                elem = mix64(flat.astype(np.uint64) + mix64(pos.astype(np.uint64) + np.uint64(1)))
                sums = np.zeros(n, dtype=np.uint64)
                np.add.at(sums, np.repeat(np.arange(n), lengths), elem)
                v = mix64(sums + lengths.astype(np.uint64))
            else:
                valid = col.is_valid().to_numpy(zero_copy_only=False)
                vals = col.to_numpy(zero_copy_only=False)
                if pa.types.is_floating(col.type):
                    vals = np.asarray(vals, dtype=np.float64)
                    vals = np.where(np.isnan(vals), np.float64(np.nan), vals)
                    bits = vals.view(np.uint64)
                else:
                    bits = np.asarray(vals).astype(np.int64).view(np.uint64)
                v = np.where(valid, mix64(bits), np.uint64(0x5BD1E995))
            h = mix64(h * np.uint64(0x100000001B3) + v)
    return h


def _convert_block(block: pa.Table, columns: DatasetSchema, out_dir: str, rows_per_shard: int) -> pa.Table:
    """Ray Data task of the converter: one sorted block -> shard pairs under ``out_dir`` (temporary names)."""
    columns = revalidate(columns)  # crossed a Ray boundary
    key = require_key(columns)
    rows: list[dict[str, Any]] = []
    if block.num_rows:
        users, samples, counts = convert_table(block, columns)
        # Cut into shards of about rows_per_shard samples, only between sessions.
        skeys = key_array(samples.column(key))
        ukeys = key_array(users.column(key))
        bounds_u = [0]
        bounds_s = [0]
        while bounds_s[-1] < len(skeys):
            target = bounds_s[-1] + rows_per_shard
            if target >= len(skeys):
                bounds_s.append(len(skeys))
                bounds_u.append(len(ukeys))
                break
            cut_key = skeys[target]
            s_end = int(np.searchsorted(skeys, cut_key, side="left"))
            if s_end <= bounds_s[-1]:  # one session longer than a shard: keep it whole
                s_end = int(np.searchsorted(skeys, cut_key, side="right"))
            bounds_s.append(s_end)
            bounds_u.append(int(np.searchsorted(ukeys, skeys[s_end - 1], side="right")))
        for i in range(len(bounds_s) - 1):
            u = users.slice(bounds_u[i], bounds_u[i + 1] - bounds_u[i])
            s = samples.slice(bounds_s[i], bounds_s[i + 1] - bounds_s[i])
            name = f"tmp-{uuid.uuid4().hex}"
            upath, spath = write_shard(u, s, Path(out_dir), name, key)
            first = key_array(u.column(key))[:1]
            rows.append({
                "name": name,
                "first_key": int(first[0]) if len(first) else 0,
                "sessions": u.num_rows,
                "samples": s.num_rows,
                "split_sessions": counts["split_sessions"] if i == 0 else 0,
                "users_bytes": upath.stat().st_size,
                "samples_bytes": spath.stat().st_size,
            })
    schema = pa.schema([("name", pa.string()), ("first_key", pa.int64()), ("sessions", pa.int64()),
                        ("samples", pa.int64()), ("split_sessions", pa.int64()),
                        ("users_bytes", pa.int64()), ("samples_bytes", pa.int64())])
    return pa.Table.from_pylist(rows, schema=schema)


def _assign_keys(block: pa.Table, key: str) -> pa.Table:
    """Converter step 1: integer keys, a missing key becomes its own session; flags those rows."""
    missing = pc.is_null(block.column(key))
    table, _ = _with_session_keys(block, key)
    return table.append_column("_missing_key", missing)


@dataclass
class SplitReport:
    """What the converter wrote for one split."""

    shards: int = 0
    sessions: int = 0
    samples: int = 0
    missing_session_keys: int = 0
    split_sessions: int = 0
    users_bytes: int = 0
    samples_bytes: int = 0
    source_bytes: int = 0
    engine: str = "ray"

    @property
    def bytes(self) -> int:
        return self.users_bytes + self.samples_bytes


@dataclass
class ConversionReport:
    """What :func:`convert_to_dedup` did; written into ``dedup.json``."""

    path: str
    splits: dict[str, SplitReport] = field(default_factory=dict)
    seconds: float = 0.0
    reused: bool = False
    engines: dict[str, str] = field(default_factory=dict)

    @property
    def source_bytes(self) -> int:
        return sum(s.source_bytes for s in self.splits.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())

    @property
    def storage_ratio(self) -> float:
        return self.source_bytes / self.bytes if self.bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "splits": {k: asdict(v) for k, v in self.splits.items()},
            "seconds": self.seconds,
            "reused": self.reused,
            "engines": self.engines,
            "source_bytes": self.source_bytes,
            "bytes": self.bytes,
            "storage_ratio": self.storage_ratio,
        }


def source_fingerprint(columns: DatasetSchema, splits: dict[str, Sequence[str | Path]]) -> str:
    """Identifies a conversion's input: the columns, and every file's path, size and mtime."""
    h = hashlib.sha256()
    h.update(f"{FORMAT_NAME}/{FORMAT_VERSION}\n".encode())
    h.update(columns.model_dump_json().encode())
    for split in sorted(splits):
        for f in sorted(str(Path(p).resolve()) for p in splits[split]):
            st = os.stat(f)
            h.update(f"{split}\t{f}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _ray_convert_split(files: Sequence[str], columns: DatasetSchema, out_dir: Path, rows_per_shard: int,
                       report: SplitReport) -> None:
    import ray

    key = require_key(columns)
    if not files:
        raise UserError(f"no Parquet files to convert into {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    total_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    num_shards = max(1, -(-total_rows // rows_per_shard))
    ds = ray.data.read_parquet([str(f) for f in files], columns=columns.columns)
    ds = ds.map_batches(_assign_keys, fn_kwargs={"key": key}, batch_format="pyarrow", batch_size=None)
    # The sort makes one range partition per input block: fix their number to the shards wanted.
    ds = ds.repartition(num_shards).sort(key)
    stats = ds.map_batches(
        _convert_block_with_missing,
        fn_kwargs={"columns": columns, "out_dir": str(out_dir),
                   "rows_per_shard": rows_per_shard},
        batch_format="pyarrow",
        batch_size=None,
    ).take_all()
    _finalize_split(out_dir, stats, files, columns, report)


def _finalize_split(out_dir: Path, stats: list[dict[str, Any]], files: Sequence[str], columns: DatasetSchema,
                    report: SplitReport) -> None:
    """Name the shard pairs ``part-K`` in key order, drop strays, fill ``report``."""
    key = require_key(columns)
    # Exactly the shards the final output names survive; a retried task's files are removed.
    stats = sorted(stats, key=lambda r: (r["first_key"], r["name"]))
    keep = {r["name"] for r in stats}
    for sub in (USERS_DIR, SAMPLES_DIR):
        for p in (out_dir / sub).glob("tmp-*.parquet"):
            if p.stem not in keep:
                p.unlink()
    for i, r in enumerate(stats):
        for sub in (USERS_DIR, SAMPLES_DIR):
            (out_dir / sub / f"{r['name']}.parquet").rename(out_dir / sub / f"part-{i:05d}.parquet")
        report.sessions += r["sessions"]
        report.samples += r["samples"]
        report.split_sessions += r["split_sessions"]
        report.missing_session_keys += r["missing"]
        report.users_bytes += r["users_bytes"]
        report.samples_bytes += r["samples_bytes"]
    report.shards = len(stats)
    if not stats and files:  # an empty split still gets one (empty) pair, so its schema can be read back
        empty = pq.read_schema(files[0]).empty_table().select(columns.columns)
        users, samples, _ = convert_table(empty, columns)
        write_shard(users, samples, out_dir, "part-00000", key)
        report.shards = 1
    report.source_bytes = sum(Path(f).stat().st_size for f in files)


def convert_split_local(files: Sequence[str | Path], columns: DatasetSchema, out_dir: Path,
                        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD) -> SplitReport:
    """The converter of one split in this process, without Ray (small data: tests, benchmarks).

    Same output as :func:`convert_to_dedup`'s Ray job; the whole split is held in memory.
    """
    key = require_key(columns)
    files = [str(f) for f in files]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = pa.concat_tables([pq.read_table(f, columns=columns.columns) for f in files])
    table = _assign_keys(table, key)
    stats = _convert_block_with_missing(table, columns, str(out_dir), rows_per_shard).to_pylist()
    report = SplitReport(engine="local")
    _finalize_split(out_dir, stats, files, columns, report)
    return report


def _convert_block_with_missing(block: pa.Table, columns: DatasetSchema, out_dir: str, rows_per_shard: int) -> pa.Table:
    """:func:`_convert_block`, also counting the rows whose key was missing (flag column from ``_assign_keys``)."""
    flags = block.column("_missing_key").to_numpy(zero_copy_only=False) if block.num_rows else np.zeros(0, bool)
    block = block.drop_columns(["_missing_key"])
    out = _convert_block(block, columns, out_dir, rows_per_shard)
    missing = [0] * out.num_rows
    if out.num_rows:
        missing[0] = int(flags.sum())
    return out.append_column("missing", pa.array(missing, pa.int64()))


def convert_to_dedup(
    columns: DatasetSchema,
    splits: dict[str, Sequence[str | Path]],
    out_dir: Path,
    *,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    overwrite: bool = False,
    engine: str = "auto",
) -> ConversionReport:
    """Convert flat Parquet files (one list per split) into the dedup format under ``out_dir``.

    ``engine``: ``ray`` runs the Ray Data job (needs a running Ray; scales out),
    ``local`` converts in this process (the split must fit in memory), ``auto``
    picks ``local`` up to :data:`LOCAL_MAX_ROWS` rows per split, where Ray
    Data's sort costs more in task overhead than the work itself (measured on
    2 cores: ~10 s local vs ~1-3 min Ray for the demo's 160k rows), else
    ``ray``. Both write the same format. Writes into a temporary sibling
    directory and renames it into place at the end, so a crash or a
    concurrent reader never sees half a dataset.
    """
    if engine not in ("auto", "ray", "local"):
        raise ValueError(f"engine must be auto, ray or local, got {engine!r}")
    require_key(columns)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        if is_complete(out_dir):
            raise UserError(f"{out_dir} already holds a complete dataset; pass --overwrite to replace it")
        if any(out_dir.iterdir()):
            raise UserError(f"refusing to write into {out_dir}: it is not empty and not a dedup dataset")
    if out_dir.exists() and overwrite and any(out_dir.iterdir()) and not (out_dir / MANIFEST_FILE).exists():
        raise UserError(f"refusing to overwrite {out_dir}: it does not hold a dedup dataset ({MANIFEST_FILE} missing)")
    started = time.perf_counter()
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    report = ConversionReport(path=str(out_dir))
    try:
        for split, files in splits.items():
            files = [str(f) for f in files]
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
            if engine == "local" or (engine == "auto" and rows <= LOCAL_MAX_ROWS):
                if not files:
                    raise UserError(f"no Parquet files to convert for split {split!r}")
                report.splits[split] = convert_split_local(files, columns, tmp / split, rows_per_shard)
            else:
                report.splits[split] = SplitReport()
                _ray_convert_split(files, columns, tmp / split, rows_per_shard, report.splits[split])
            report.engines[split] = report.splits[split].engine
        report.seconds = time.perf_counter() - started
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "session_key": columns.session_key,
            "columns": json.loads(columns.model_dump_json()),
            "source_fingerprint": source_fingerprint(columns, splits),
            "source_files": {s: [str(Path(f).resolve()) for f in fs] for s, fs in splits.items()},
            "report": report.to_dict(),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        write_schema_yaml(tmp, columns, header=f"Written by `dlrm-platform dedup-convert` ({FORMAT_NAME} v{FORMAT_VERSION}).")
        mark_complete(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


# --------------------------------------------------------------------------- reading the format



def ensure_dedup_dataset(job: JobConfig, train_files: Sequence[str | Path], eval_files: Sequence[str | Path],
                         out_dir: Path | None = None) -> tuple[DedupDataset, ConversionReport | None]:
    """The dedup copy of the job's flat dataset: reused when its source fingerprint matches, else converted.

    Returns the dataset and, when this call converted, the report. Needs Ray.
    """
    columns = job.data.columns
    out_dir = Path(out_dir) if out_dir else default_dedup_dir(job.data.path)
    splits = {job.data.train_split: list(train_files), job.data.eval_split: list(eval_files)}
    fingerprint = source_fingerprint(columns, splits)
    # Jobs started together on the same data (the job service runs several at once) would each
    # convert and replace the directory under the others' readers: one converts, the rest reuse.
    with _conversion_lock(out_dir):
        if is_complete(out_dir) and (out_dir / MANIFEST_FILE).is_file():
            try:
                ds = DedupDataset.open(out_dir)
                if ds.manifest.get("source_fingerprint") == fingerprint:
                    log.info("reusing the dedup dataset %s", out_dir)
                    return ds, None
            except UserError:
                pass
            log.info("the dedup dataset %s is stale: converting again", out_dir)
        log.info("converting %s into the dedup format at %s", job.data.path, out_dir)
        report = convert_to_dedup(columns, splits, out_dir, overwrite=True)
        return DedupDataset.open(out_dir), report


@contextlib.contextmanager
def _conversion_lock(out_dir: Path) -> Iterator[None]:
    """An exclusive lock (``flock`` on a sibling file) held while a dedup copy is checked and written."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(f".{out_dir.name}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# =========================================================================== session blocks


def dedup_job_shards(job: JobConfig, train_files: Sequence[str | Path],
                     eval_files: Sequence[str | Path]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The train and eval shard pairs of the dedup copy of the job's data (converted on first use)."""
    dataset, report = ensure_dedup_dataset(job, train_files, eval_files)
    if report is not None:
        train = report.splits.get(job.data.train_split)
        log.info("dedup conversion: %.1f s, storage %.2fx smaller (%s)", report.seconds, report.storage_ratio,
                 "" if train is None else f"train: {train.samples} samples in {train.sessions} sessions, "
                 f"{train.missing_session_keys} without a session key")
    return dataset.shards(job.data.train_split), dataset.shards(job.data.eval_split)
