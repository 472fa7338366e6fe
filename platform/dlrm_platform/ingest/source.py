"""Parquet dataset source: find a dataset's shards and check them against the columns the job config declares.

Any dataset laid out as ``data.path/<split>/*.parquet`` can be trained on by
declaring its columns in ``data.columns``; nothing here is specific to the
generator or the Criteo converter.

Validation reads every footer (schema, row count), then decodes the declared
columns of every shard one row group at a time, so that a corrupt or
truncated shard is found before Ray starts rather than as a crashed read task
in the middle of an epoch. Such a shard fails the job or is skipped, as
``data.on_bad_shard`` says; either way it is reported
(:attr:`DatasetFiles.bad_shards`). A column that is missing or of the wrong
type is a config error, never skipped.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_platform.config import DataConfig, DatasetSchema
from dlrm_platform.errors import UserError

__all__ = [
    "COLUMN_KINDS",
    "BadShard",
    "DatasetFiles",
    "DatasetNotFoundError",
    "DatasetSchemaError",
    "declared_columns",
    "list_split_files",
    "validate_dataset",
]

log = logging.getLogger(__name__)


class DatasetNotFoundError(UserError):
    """The dataset directory, a split directory, or its Parquet files do not exist."""


class DatasetSchemaError(UserError):
    """A file lacks a declared column, holds it with the wrong type, or cannot be read."""


@dataclass(frozen=True)
class BadShard:
    """A shard that cannot be read, and why (the reader's error)."""

    path: Path
    reason: str

    def describe(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class DatasetFiles:
    """The shards of a validated dataset, sorted by path, and their row counts (from the footers).

    ``bad_shards``: unreadable shards left out (``data.on_bad_shard: skip``); empty otherwise.
    """

    path: Path
    train: list[Path]
    eval: list[Path]
    train_rows: int
    eval_rows: int
    bad_shards: list[BadShard] = field(default_factory=list)


def _unwrap(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_number(t: pa.DataType) -> bool:
    t = _unwrap(t)
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(_unwrap(t))


def _is_label(t: pa.DataType) -> bool:
    return _is_number(t) or pa.types.is_boolean(_unwrap(t))


def _is_integer_list(t: pa.DataType) -> bool:
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return is_list and _is_integer(t.value_type)


def _is_scalar(t: pa.DataType) -> bool:
    return not pa.types.is_nested(_unwrap(t))


# kind -> (accepted types in words, predicate)
COLUMN_KINDS: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "label": ("integer, float or bool", _is_label),
    "session_key": ("a scalar (not a list or struct)", _is_scalar),
    "dense": ("integer or float", _is_number),
    "categorical": ("integer", _is_integer),
    "multi_hot": ("list of integer", _is_integer_list),
}


def declared_columns(schema: DatasetSchema) -> list[tuple[str, str, str]]:
    """``(column, kind, config field)`` for every column ``schema`` declares, in pipeline order."""
    out = [(schema.label, "label", "data.columns.label")]
    if schema.session_key:
        out.append((schema.session_key, "session_key", "data.columns.session_key"))
    for side in ("user", "item"):
        cols = getattr(schema, side)
        for kind in ("dense", "categorical", "multi_hot"):
            out += [(c, kind, f"data.columns.{side}.{kind}") for c in getattr(cols, kind)]
    return out


def _how_to_create(data: DataConfig) -> str:
    if data.synthetic is not None:
        return "generate it with `dlrm-platform gen-data CONFIG` (this config has a data.synthetic section)"
    return (
        "create it with `dlrm-platform convert-criteo INPUT " + str(data.path) + "` for a Criteo TSV, "
        "with `dlrm-platform gen-data CONFIG` for synthetic data (needs a data.synthetic section), "
        f"or put your own Parquet files under {data.split_dir(data.train_split)}/ and "
        f"{data.split_dir(data.eval_split)}/ and declare their columns in data.columns"
    )


def list_split_files(data: DataConfig, split: str) -> list[Path]:
    """Every ``*.parquet`` under ``data.path/split`` (recursively, skipping ``_``/``.`` names), sorted.

    Raises :class:`DatasetNotFoundError` when the directory or its files are missing.
    """
    if not data.path.is_dir():
        raise DatasetNotFoundError(f"dataset directory {data.path} does not exist; {_how_to_create(data)}")
    split_dir = data.split_dir(split)
    if not split_dir.is_dir():
        raise DatasetNotFoundError(
            f"dataset {data.path} has no {split!r} split (expected directory {split_dir}); {_how_to_create(data)}"
        )
    files = sorted(
        p
        for p in split_dir.rglob("*.parquet")
        if p.is_file() and not any(part.startswith(("_", ".")) for part in p.relative_to(split_dir).parts)
    )
    if not files:
        raise DatasetNotFoundError(f"{split_dir} holds no .parquet files; {_how_to_create(data)}")
    return files


class _Unreadable(Exception):
    """Internal: the shard cannot be read; the message says why."""


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _read_check(path: Path, columns: list[str], num_rows: int) -> None:
    """Decode ``columns`` of every row group of ``path``; raise ``_Unreadable`` unless all ``num_rows`` rows come back.

    Memory is bounded by one row group. Any error of the Parquet reader on a
    file whose footer was readable means corrupt or truncated data.
    """
    try:
        f = pq.ParquetFile(path)
        rows = 0
        for i in range(f.num_row_groups):
            rows += f.read_row_group(i, columns=columns).num_rows
    except Exception as err:  # noqa: BLE001 - whatever the reader raises on a corrupt file, the shard is bad
        raise _Unreadable(f"cannot read its data ({type(err).__name__}: {_reason(err)})") from None
    if rows != num_rows:
        raise _Unreadable(f"its footer promises {num_rows} rows but {rows} could be read")


def _check_file(path: Path, expected: list[tuple[str, str, str]]) -> tuple[int, list[tuple[str, str, str, str]]]:
    """Row count of ``path`` and its problems as ``(column, config field, expected, found)``.

    Raises ``_Unreadable`` when the footer cannot be read.
    """
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except Exception as err:  # noqa: BLE001 - not Parquet, truncated, corrupt footer: the shard is bad
        kind = "empty file" if path.stat().st_size == 0 else f"{type(err).__name__}: {_reason(err)}"
        raise _Unreadable(f"not a readable Parquet file ({kind})") from None
    problems = []
    for column, kind, where in expected:
        words, accepts = COLUMN_KINDS[kind]
        idx = schema.get_field_index(column)
        if idx < 0:
            problems.append((column, where, words, "missing"))
        elif not accepts(schema.field(idx).type):
            problems.append((column, where, words, f"type {schema.field(idx).type}"))
    return meta.num_rows, problems


def _format_problems(path: Path, problems: dict[tuple[str, str, str, str], list[Path]]) -> str:
    lines = []
    for (column, where, words, found), files in problems.items():
        shown = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more files" if len(files) > 3 else "")
        what = "is missing from" if found == "missing" else f"has {found} in"
        lines.append(f"column {column!r} ({where}, expected {words}) {what} {shown}")
    return (
        f"dataset {path} does not match data.columns in the job config:\n  "
        + "\n  ".join(lines)
        + "\ndeclare the columns the files hold (a generated or converted dataset has them in schema.yaml)"
    )


def _format_bad_shards(data: DataConfig, bad: list[BadShard]) -> str:
    shown = "\n  ".join(b.describe() for b in bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
    return (
        f"dataset {data.path}: {len(bad)} Parquet shard(s) cannot be read:\n  {shown}\n"
        "replace or remove them, or set data.on_bad_shard: skip to train without them (they are reported)"
    )


def validate_dataset(data: DataConfig, *, check_data: bool = True) -> DatasetFiles:
    """Check every shard against ``data.columns``; return the train and eval file lists.

    Every footer is read; with ``check_data`` every shard's declared columns are
    decoded too. Raises :class:`DatasetNotFoundError` (missing directory, split
    or files, with how to create them) or :class:`DatasetSchemaError` (naming
    each missing or mistyped column, the type expected and the files
    concerned; or, with ``data.on_bad_shard: fail``, each unreadable shard and
    why). With ``skip``, unreadable shards are left out and listed in
    ``bad_shards``; a split left with no shard is still an error.
    """
    expected = declared_columns(data.columns)
    columns = [c for c, _, _ in expected]
    files = {split: list_split_files(data, split) for split in (data.train_split, data.eval_split)}
    rows: dict[str, int] = {}
    problems: dict[tuple[str, str, str, str], list[Path]] = defaultdict(list)
    bad: list[BadShard] = []
    good: dict[str, list[Path]] = {}
    for split, paths in files.items():
        rows[split], good[split] = 0, []
        for p in paths:
            try:
                n, found = _check_file(p, expected)
                if not found and check_data:
                    _read_check(p, columns, n)
            except _Unreadable as err:
                bad.append(BadShard(p, str(err)))
                continue
            rows[split] += n
            good[split].append(p)
            for problem in found:
                problems[problem].append(p)
    if problems:
        raise DatasetSchemaError(_format_problems(data.path, problems))
    if bad and data.on_bad_shard == "fail":
        raise DatasetSchemaError(_format_bad_shards(data, bad))
    for split, paths in good.items():
        if not paths:
            raise DatasetSchemaError(
                f"dataset {data.path}: no readable shard left in the {split!r} split after skipping "
                f"{len(bad)} unreadable one(s) (data.on_bad_shard: skip):\n  " + "\n  ".join(b.describe() for b in bad)
            )
    if bad:
        log.warning("skipping %d unreadable Parquet shard(s) (data.on_bad_shard: skip):\n  %s",
                    len(bad), "\n  ".join(b.describe() for b in bad))
    return DatasetFiles(
        path=data.path,
        train=good[data.train_split],
        eval=good[data.eval_split],
        train_rows=rows[data.train_split],
        eval_rows=rows[data.eval_split],
        bad_shards=bad,
    )
