"""Criteo TSV -> Parquet (`dlrm-platform convert-criteo`).

Input: the Criteo display-advertising format, plain or gzip, one sample per line::

    label \\t I1 .. I13 \\t C1 .. C26        label 0/1, I* decimal integers, C* hex (32-bit)

An empty field is a missing value. Real files strip trailing empty fields, so
a valid line may have fewer than 40 fields; the absent ones are missing.

Output (see :mod:`dlrm_platform.ingest.layout`)::

    OUTPUT_DIR/train/part-XXXXX.parquet, eval/part-XXXXX.parquet
        label         int64            0 or 1
        int_0..int_12 int64, nullable  I1..I13
        cat_0..cat_25 int64, nullable  C1..C26 parsed as unsigned 32-bit hex
    OUTPUT_DIR/schema.yaml, quarantine.jsonl, conversion_report.json, _SUCCESS

A line that is not in this format is *quarantined*: written to
``quarantine.jsonl`` as ``{"line": N, "reason": R, "detail": ..., "raw": ...}``
and counted by reason; conversion always goes on. Each line goes to eval with
probability ``eval_fraction``, decided by a hash of its line number and the
seed, so the split does not depend on batching.

Lines are parsed in batches: padded to 40 fields, split by Arrow's CSV
reader, validated and converted column-wise with Arrow compute. Lines failing
the vectorised checks are re-parsed one by one by :func:`parse_criteo_line`,
the reference definition of the format, which gives the reason.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dlrm_platform.config import DatasetSchema, SideColumns
from dlrm_platform.errors import UserError
from dlrm_platform.ingest._mix import hash_uniform, salt
from dlrm_platform.ingest.layout import ShardedParquetWriter, mark_complete, prepare_output_dir, write_schema_yaml

__all__ = [
    "ARROW_SCHEMA",
    "CATEGORICAL_COLUMNS",
    "DENSE_COLUMNS",
    "NUM_FIELDS",
    "QUARANTINE_FILE",
    "REPORT_FILE",
    "ConversionReport",
    "ParsedRow",
    "QuarantineReason",
    "Quarantined",
    "convert_criteo",
    "criteo_schema",
    "parse_criteo_line",
]

log = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
DENSE_COLUMNS = [f"int_{i}" for i in range(NUM_DENSE)]
CATEGORICAL_COLUMNS = [f"cat_{i}" for i in range(NUM_CATEGORICAL)]
ALL_COLUMNS = ["label", *DENSE_COLUMNS, *CATEGORICAL_COLUMNS]
ARROW_SCHEMA = pa.schema(
    [
        pa.field("label", pa.int64(), nullable=False),
        *(pa.field(c, pa.int64()) for c in DENSE_COLUMNS),
        *(pa.field(c, pa.int64()) for c in CATEGORICAL_COLUMNS),
    ]
)
QUARANTINE_FILE = "quarantine.jsonl"
REPORT_FILE = "conversion_report.json"
TRAIN_SPLIT, EVAL_SPLIT = "train", "eval"

QuarantineReason = Literal[
    "too_many_fields", "missing_label", "invalid_label", "invalid_dense", "invalid_categorical", "line_too_long"
]

_INT_RE = re.compile(r"-?[0-9]+")
_HEX_RE = re.compile(r"[0-9a-fA-F]{1,8}")
# The vectorised checks accept a subset of what parse_criteo_line accepts (<= 18 digits always fits int64);
# anything else takes the per-line path, so both paths agree on every line.
_FAST_INT_RE = r"^-?[0-9]{1,18}$"
_FAST_HEX_RE = r"^[0-9a-fA-F]{1,8}$"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# A valid line is at most ~560 characters (unless it pads integers with zeros); longer lines take the
# per-line path, so that Arrow's CSV reader never meets a row larger than its block ("straddling object").
_FAST_MAX_LINE = 4096
# Lines are read at most this many characters at a time: a longer one (a file without line breaks, a
# corrupt field) is quarantined as line_too_long with its first characters, never held whole in memory.
MAX_LINE_CHARS = 1 << 20
_RAW_KEPT_CHARS = 1000


class OverlongLine(str):
    """The first characters of a line longer than :data:`MAX_LINE_CHARS`; ``total_chars`` is its full length."""

    total_chars: int


@dataclass(frozen=True)
class ParsedRow:
    """One valid line: ``dense`` has 13 entries, ``categorical`` 26; ``None`` = missing."""

    label: int
    dense: tuple[int | None, ...]
    categorical: tuple[int | None, ...]


@dataclass(frozen=True)
class Quarantined:
    """A malformed line (1-based ``line_number``), why, and its text without the line ending."""

    line_number: int
    reason: QuarantineReason
    detail: str
    raw: str

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line_number, "reason": self.reason, "detail": self.detail, "raw": self.raw}


def _strip_line_ending(line: str) -> str:
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def _parse_int64(text: str) -> int | None:
    """A decimal 64-bit integer (leading zeros allowed, any length), else None.

    Never calls ``int()`` on more than 20 digits: Python refuses strings over
    4300 digits with a ValueError, which a huge field must not turn into a crash.
    """
    if not _INT_RE.fullmatch(text):
        return None
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
    digits = digits.lstrip("0") or "0"
    if len(digits) > 19:
        return None
    value = int(sign + digits)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def parse_criteo_line(line: str, line_number: int) -> ParsedRow | Quarantined:
    """Parse one line (line ending optional). The reference definition of a valid Criteo line."""
    raw = _strip_line_ending(line)
    fields = raw.split("\t")

    def bad(reason: QuarantineReason, detail: str) -> Quarantined:
        return Quarantined(line_number, reason, detail, raw)

    if len(fields) > NUM_FIELDS:
        return bad("too_many_fields", f"{len(fields)} tab-separated fields, at most {NUM_FIELDS} allowed")
    if fields[0] == "":
        return bad("missing_label", "the label (field 1) is empty")
    if fields[0] not in ("0", "1"):
        return bad("invalid_label", f"the label (field 1) is {fields[0]!r}, expected 0 or 1")
    fields += [""] * (NUM_FIELDS - len(fields))
    dense: list[int | None] = []
    for i, text in enumerate(fields[1 : 1 + NUM_DENSE]):
        if text == "":
            dense.append(None)
            continue
        value = _parse_int64(text)
        if value is None:
            return bad("invalid_dense", f"{DENSE_COLUMNS[i]} (field {i + 2}) is {text!r}, expected a 64-bit integer")
        dense.append(value)
    categorical: list[int | None] = []
    for i, text in enumerate(fields[1 + NUM_DENSE :]):
        if text == "":
            categorical.append(None)
        elif _HEX_RE.fullmatch(text):
            categorical.append(int(text, 16))
        else:
            where = f"{CATEGORICAL_COLUMNS[i]} (field {i + 2 + NUM_DENSE})"
            return bad("invalid_categorical", f"{where} is {text!r}, expected 1-8 hex digits")
    return ParsedRow(int(fields[0]), tuple(dense), tuple(categorical))


def criteo_schema() -> DatasetSchema:
    """The ``data.columns`` of a converted dataset: no sessions, every feature item-side."""
    return DatasetSchema(label="label", item=SideColumns(dense=DENSE_COLUMNS, categorical=CATEGORICAL_COLUMNS))


# --------------------------------------------------------------------------- batch parsing

_HEX_VALUE = np.zeros(256, dtype=np.int64)
for _c in "0123456789abcdef":
    _HEX_VALUE[ord(_c)] = _HEX_VALUE[ord(_c.upper())] = int(_c, 16)
_NIBBLE_SHIFT = np.arange(28, -1, -4, dtype=np.int64)


def _hex_to_int64(strings: pa.StringArray) -> pa.Array:
    """Validated 1-8 digit hex strings ("" = missing) -> int64 (nullable), without a per-value Python call."""
    if len(strings) == 0:
        return pa.array([], type=pa.int64())
    missing = pc.equal(strings, "").to_numpy(zero_copy_only=False)
    padded = pc.utf8_lpad(strings, width=8, padding="0")  # "" -> "00000000", decodes to 0, then masked
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset : padded.offset + len(padded) + 1]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(-1, 8)
    values = (_HEX_VALUE[data] << _NIBBLE_SHIFT).sum(axis=1)
    return pa.array(values, type=pa.int64(), mask=missing)


def _int_to_int64(strings: pa.StringArray) -> pa.Array:
    """Validated decimal strings ("" = missing) -> int64 (nullable)."""
    return pc.cast(pc.if_else(pc.equal(strings, ""), pa.scalar(None, pa.string()), strings), pa.int64())


def _read_fields(lines: list[str], tabs: list[int]) -> pa.Table:
    """Lines with at most 40 fields (``tabs[i]`` tabs each) -> 40 string columns, absent fields ""."""
    padded = "\n".join([line + "\t" * (NUM_FIELDS - 1 - n) for line, n in zip(lines, tabs, strict=True)])
    return pacsv.read_csv(
        io.BytesIO(padded.encode()),
        read_options=pacsv.ReadOptions(column_names=ALL_COLUMNS),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(ALL_COLUMNS, pa.string()), strings_can_be_null=False
        ),
    ).combine_chunks()


def _valid_mask(fields: pa.Table) -> np.ndarray:
    """bool [rows]: the line passes every vectorised check."""
    ok = pc.is_in(fields.column("label"), value_set=pa.array(["0", "1"]))
    for names, pattern in ((DENSE_COLUMNS, _FAST_INT_RE), (CATEGORICAL_COLUMNS, _FAST_HEX_RE)):
        for name in names:
            col = fields.column(name)
            ok = pc.and_(ok, pc.or_(pc.equal(col, ""), pc.match_substring_regex(col, pattern)))
    return ok.to_numpy(zero_copy_only=False)


def _convert_fields(fields: pa.Table) -> pa.Table:
    """Validated string columns -> :data:`ARROW_SCHEMA`."""

    def col(name: str) -> pa.StringArray:
        return fields.column(name).combine_chunks()

    columns = [pc.cast(col("label"), pa.int64())]
    columns += [_int_to_int64(col(c)) for c in DENSE_COLUMNS]
    columns += [_hex_to_int64(col(c)) for c in CATEGORICAL_COLUMNS]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def _rows_to_table(rows: list[ParsedRow]) -> pa.Table:
    columns = [pa.array([r.label for r in rows], pa.int64())]
    columns += [pa.array([r.dense[i] for r in rows], pa.int64()) for i in range(NUM_DENSE)]
    columns += [pa.array([r.categorical[i] for r in rows], pa.int64()) for i in range(NUM_CATEGORICAL)]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def parse_criteo_batch(lines: list[str], first_line_number: int) -> tuple[pa.Table, np.ndarray, list[Quarantined]]:
    """Parse consecutive lines numbered from ``first_line_number``.

    Returns the valid rows (:data:`ARROW_SCHEMA`, input order), their line
    numbers (int64 [rows]) and the quarantined lines. Same result as
    :func:`parse_criteo_line` on each line, only faster.
    """
    stripped = ["" if isinstance(line, OverlongLine) else _strip_line_ending(line) for line in lines]
    numbers = np.arange(first_line_number, first_line_number + len(lines), dtype=np.int64)
    # Arrow's CSV reader also ends a row at "\r": such lines take the per-line path.
    tabs = [s.count("\t") for s in stripped]
    fits = np.array([n < NUM_FIELDS and 0 < len(s) <= _FAST_MAX_LINE and "\r" not in s
                     for s, n in zip(stripped, tabs, strict=True)], dtype=bool)
    fits_idx = np.flatnonzero(fits)
    fields = _read_fields([stripped[i] for i in fits_idx], [tabs[i] for i in fits_idx]) if len(fits_idx) else None
    if fields is not None and fields.num_rows != len(fits_idx):  # never seen; stay correct rather than misalign
        fits, fits_idx, fields = np.zeros(len(stripped), dtype=bool), fits_idx[:0], None
    valid = _valid_mask(fields) if fields is not None else np.zeros(0, dtype=bool)
    fast_idx = fits_idx[valid]
    table = _convert_fields(fields.filter(pa.array(valid))) if fields is not None else ARROW_SCHEMA.empty_table()

    slow_idx = np.sort(np.concatenate([np.flatnonzero(~fits), fits_idx[~valid]]))
    rescued: list[ParsedRow] = []
    rescued_idx: list[int] = []
    quarantined: list[Quarantined] = []
    for i in slow_idx:
        if isinstance(lines[i], OverlongLine):
            quarantined.append(Quarantined(
                int(numbers[i]), "line_too_long",
                f"{lines[i].total_chars} characters, at most {MAX_LINE_CHARS} allowed "
                f"(the first {_RAW_KEPT_CHARS} kept)",
                _strip_line_ending(lines[i][:_RAW_KEPT_CHARS]),
            ))
            continue
        result = parse_criteo_line(lines[i], int(numbers[i]))
        if isinstance(result, Quarantined):
            quarantined.append(result)
        else:
            rescued.append(result)
            rescued_idx.append(int(i))
    if rescued:  # rare (e.g. a 19-digit integer): merge back in input order
        order = np.argsort(np.concatenate([fast_idx, rescued_idx]), kind="stable")
        fast_idx = np.concatenate([fast_idx, rescued_idx])[order]
        table = pa.concat_tables([table, _rows_to_table(rescued)]).take(pa.array(order))
    return table, numbers[fast_idx], quarantined


# --------------------------------------------------------------------------- conversion


@dataclass
class ConversionReport:
    """What :func:`convert_criteo` did. ``rows_read`` = ``rows_converted`` + ``rows_quarantined``."""

    input_path: Path
    output_dir: Path
    quarantine_path: Path
    rows_read: int = 0
    rows_converted: int = 0
    rows_quarantined: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    train_rows: int = 0
    eval_rows: int = 0
    files: list[Path] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("input_path", "output_dir", "quarantine_path"):
            d[key] = str(d[key])
        d["files"] = [str(f) for f in self.files]
        d["rows_per_s"] = self.rows_per_s
        return d


def _open_text(path: Path) -> IO[str]:
    """Plain or gzip (by magic bytes, not name); undecodable bytes become U+FFFD and fail validation."""
    try:
        with path.open("rb") as f:
            is_gzip = f.read(2) == b"\x1f\x8b"
    except OSError as err:  # no permission, an I/O error
        raise UserError(f"{path}: cannot read the input ({type(err).__name__}: {err})") from None
    # newline="\n": a stray "\r" inside a line must not split it.
    if is_gzip:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return path.open("r", encoding="utf-8", errors="replace", newline="\n")


def _read_line(f: IO[str]) -> str:
    """The next line ("" at the end); one longer than MAX_LINE_CHARS is consumed whole but kept truncated."""
    line = f.readline(MAX_LINE_CHARS)
    if len(line) < MAX_LINE_CHARS or line.endswith("\n"):
        return line
    total, first = len(line), True
    while chunk := f.readline(MAX_LINE_CHARS):
        if first and chunk == "\n":  # exactly MAX_LINE_CHARS characters, then the line break
            return line + chunk
        first = False
        total += len(chunk) - chunk.endswith("\n")
        if chunk.endswith("\n"):
            break
    if first:  # exactly MAX_LINE_CHARS characters at the end of the file
        return line
    out = OverlongLine(line[:_RAW_KEPT_CHARS])
    out.total_chars = total
    return out


def _batches(f: IO[str], batch_lines: int) -> Iterator[list[str]]:
    while batch := list(itertools.takewhile(bool, (_read_line(f) for _ in range(batch_lines)))):
        yield batch


def convert_criteo(
    input_path: str | Path,
    output_dir: str | Path,
    *,
    eval_fraction: float = 0.1,
    rows_per_shard: int = 1_000_000,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    batch_lines: int = 65_536,
) -> ConversionReport:
    """Convert a Criteo TSV (plain or .gz) into a Parquet dataset under ``output_dir``, streaming.

    Memory is bounded by ``batch_lines``. Malformed lines go to
    ``quarantine.jsonl`` and the report; they never stop the conversion.
    ``_SUCCESS`` is written only if at least one row was converted. Raises
    :class:`UserError` for a missing input, a bad argument, an existing
    complete output (without ``overwrite``) or a corrupt gzip stream.
    """
    from tqdm.auto import tqdm

    input_path, output_dir = Path(input_path), Path(output_dir)
    if not input_path.is_file():
        raise UserError(f"input {input_path} does not exist or is not a file")
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval fraction must be in [0, 1), got {eval_fraction}")
    if rows_per_shard < 1 or batch_lines < 1:
        raise UserError("rows per shard and batch lines must be at least 1")
    splits, owned = [TRAIN_SPLIT, EVAL_SPLIT], [QUARANTINE_FILE, REPORT_FILE]
    prepare_output_dir(output_dir, splits, owned, overwrite=overwrite, command="convert-criteo")
    t0 = time.perf_counter()
    report = ConversionReport(input_path, output_dir, output_dir / QUARANTINE_FILE)
    reasons: Counter[str] = Counter()
    split_salt = salt("criteo_split", seed)
    with (
        ShardedParquetWriter(output_dir / TRAIN_SPLIT, ARROW_SCHEMA, rows_per_shard) as train,
        ShardedParquetWriter(output_dir / EVAL_SPLIT, ARROW_SCHEMA, rows_per_shard) as evals,
        _open_text(input_path) as f,
        report.quarantine_path.open("w", encoding="utf-8") as quarantine,
        tqdm(unit="row", unit_scale=True, desc="convert-criteo", disable=not progress) as bar,
    ):
        try:
            for batch in _batches(f, batch_lines):
                table, numbers, bad = parse_criteo_batch(batch, report.rows_read + 1)
                report.rows_read += len(batch)
                for q in bad:
                    # ASCII JSON: a raw line holding U+2028, U+0085 ... must not split the record
                    # for readers that split lines on them (str.splitlines).
                    quarantine.write(json.dumps(q.to_dict()) + "\n")
                    reasons[q.reason] += 1
                is_eval = hash_uniform(numbers, split_salt) < eval_fraction
                evals.write(table.filter(pa.array(is_eval)))
                train.write(table.filter(pa.array(~is_eval)))
                bar.update(len(batch))
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise UserError(
                f"{input_path}: the gzip stream is corrupt or truncated after line {report.rows_read} ({err}); "
                "the output is incomplete (no _SUCCESS)"
            ) from None
        except OSError as err:  # reading the input or writing the output (no space...)
            raise UserError(
                f"{input_path} -> {output_dir}: I/O error after line {report.rows_read} "
                f"({type(err).__name__}: {err}); the output is incomplete (no _SUCCESS)"
            ) from None
    report.files = train.close() + evals.close()
    report.train_rows, report.eval_rows = train.rows, evals.rows
    report.rows_converted = train.rows + evals.rows
    report.rows_quarantined = sum(reasons.values())
    report.quarantine_reasons = dict(sorted(reasons.items()))
    report.bytes = sum(p.stat().st_size for p in report.files)
    report.seconds = time.perf_counter() - t0
    write_schema_yaml(
        output_dir,
        criteo_schema(),
        header=f"Converted from {input_path.name} by `dlrm-platform convert-criteo`.\n"
        "Paste under `data:` in a job config.",
    )
    (output_dir / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if report.rows_converted > 0:
        mark_complete(output_dir)
    return report
