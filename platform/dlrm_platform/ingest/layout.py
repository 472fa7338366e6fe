"""On-disk layout of a dataset directory, shared by the generator, the Criteo converter and the reader.

::

    DATASET/
      train/part-00000.parquet ...   one directory per split, any number of shards
      eval/part-00000.parquet ...
      schema.yaml                    the `columns:` block to paste under `data:` in a job config
      _SUCCESS                       written last: without it the directory is an unfinished write

Writers only ever delete files they could have written themselves, so pointing
``data.path`` at a directory holding other data fails instead of wiping it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from dlrm_platform.config import DatasetSchema
from dlrm_platform.errors import UserError

__all__ = [
    "PARQUET_COMPRESSION",
    "SCHEMA_FILE",
    "SUCCESS_FILE",
    "ShardedParquetWriter",
    "is_complete",
    "mark_complete",
    "prepare_output_dir",
    "schema_to_yaml",
    "shard_path",
    "write_schema_yaml",
]

SUCCESS_FILE = "_SUCCESS"
SCHEMA_FILE = "schema.yaml"
# zstd: markedly smaller than snappy on id-heavy columns and still fast; deterministic output.
PARQUET_COMPRESSION = "zstd"
_SHARD_GLOB = "part-*.parquet"


def shard_path(split_dir: Path, index: int) -> Path:
    """``split_dir/part-00042.parquet``."""
    return split_dir / f"part-{index:05d}.parquet"


def is_complete(path: Path) -> bool:
    """Whether a writer finished this dataset directory."""
    return (path / SUCCESS_FILE).is_file()


def mark_complete(path: Path) -> None:
    """Write the ``_SUCCESS`` marker; call after every other file is closed."""
    (path / SUCCESS_FILE).write_text("")


def prepare_output_dir(
    path: Path, splits: Sequence[str], owned_files: Iterable[str] = (), *, overwrite: bool, command: str
) -> None:
    """Make ``path`` ready for a fresh write of ``splits``.

    A finished dataset (``_SUCCESS`` present) is kept unless ``overwrite``; an
    unfinished one is cleared. Only shard files (``part-*.parquet``), the
    marker, ``schema.yaml`` and ``owned_files`` are removed: any other file in
    a split directory means the directory is not ours, and we refuse.
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} exists and is not a directory")
    if is_complete(path) and not overwrite:
        raise UserError(
            f"{path} already holds a complete dataset ({SUCCESS_FILE} present); `{command} --overwrite` replaces it"
        )
    foreign = [
        p for s in splits if (path / s).is_dir() for p in sorted((path / s).iterdir()) if not p.match(_SHARD_GLOB)
    ]
    if foreign:
        shown = ", ".join(str(p) for p in foreign[:5])
        raise UserError(
            f"refusing to write into {path}: its split directories hold files this command did not write "
            f"({shown}{', ...' if len(foreign) > 5 else ''}); choose another path or remove them"
        )
    (path / SUCCESS_FILE).unlink(missing_ok=True)  # first, so a crash below leaves it unfinished
    for s in splits:
        if (path / s).is_dir():
            shutil.rmtree(path / s)
    for name in (SCHEMA_FILE, *owned_files):
        (path / name).unlink(missing_ok=True)
    for s in splits:
        (path / s).mkdir(parents=True, exist_ok=True)


def schema_to_yaml(schema: DatasetSchema, header: str = "") -> str:
    """The ``columns:`` block of a job config that declares ``schema``, with an optional comment header."""
    block: dict[str, Any] = {"label": schema.label}
    if schema.session_key:
        block["session_key"] = schema.session_key
    for side in ("user", "item"):
        cols = getattr(schema, side).model_dump()
        cols = {kind: names for kind, names in cols.items() if names}
        if cols:
            block[side] = cols
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump({"columns": block}, sort_keys=False, default_flow_style=None, width=10_000)


def write_schema_yaml(path: Path, schema: DatasetSchema, header: str = "") -> Path:
    out = path / SCHEMA_FILE
    out.write_text(schema_to_yaml(schema, header))
    return out


class ShardedParquetWriter:
    """Streams tables into ``part-XXXXX.parquet`` shards of at most ``rows_per_shard`` rows.

    A split that receives no rows still gets one empty shard, so its schema
    can be read back. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, split_dir: Path, schema: pa.Schema, rows_per_shard: int) -> None:
        if rows_per_shard < 1:
            raise ValueError("rows_per_shard must be >= 1")
        self.split_dir = split_dir
        self.schema = schema
        self.rows_per_shard = rows_per_shard
        self.files: list[Path] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_shard = 0

    def _open_next(self) -> pq.ParquetWriter:
        path = shard_path(self.split_dir, len(self.files))
        self.files.append(path)
        self._rows_in_shard = 0
        self._writer = pq.ParquetWriter(path, self.schema, compression=PARQUET_COMPRESSION)
        return self._writer

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (same schema), starting new shards as they fill."""
        start = 0
        while start < table.num_rows:
            writer = self._writer
            if writer is None or self._rows_in_shard >= self.rows_per_shard:
                if writer is not None:
                    writer.close()
                writer = self._open_next()
            take = min(self.rows_per_shard - self._rows_in_shard, table.num_rows - start)
            writer.write_table(table.slice(start, take))
            self._rows_in_shard += take
            self.rows += take
            start += take

    def close(self) -> list[Path]:
        """Close the open shard; returns every shard written."""
        if self._writer is None and not self.files:
            self._open_next()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.files

    def __enter__(self) -> ShardedParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
