"""Criteo TSV reader on crafted lines in the real format, the converter end to end, and its command."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrm_platform.config import load_job_config
from dlrm_platform.errors import UserError
from dlrm_platform.ingest.criteo import (
    ARROW_SCHEMA,
    ParsedRow,
    Quarantined,
    convert_criteo,
    criteo_schema,
    parse_criteo_batch,
    parse_criteo_line,
)
from dlrm_platform.ingest.source import validate_dataset

REPO = Path(__file__).resolve().parents[2]
DENSE = ["1", "-1", "0", "12", "", "3", "1000000", "7", "", "2", "9", "0", "5"]
CATS = ["68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "25c83c98", "7e0ccccf", "de7995b8", "1f89b562",
        "a73ee510", "a8cd5504", "b2cb9c98", "37c9c164", "2824a5f6", "1adce6ef", "8ba8b39a", "891b62e7",
        "e5ba7672", "f54016b9", "21ddcdc9", "b1252a9d", "07b5194c", "", "3a171ecb", "c5c50484",
        "e8b83407", "9727dd16"]
FULL = "\t".join(["0", *DENSE, *CATS])


def line(label: str, dense: list[str], cats: list[str]) -> str:
    return "\t".join([label, *dense, *cats])


def as_row(parsed: ParsedRow) -> tuple:
    return (parsed.label, *parsed.dense, *parsed.categorical)


# --------------------------------------------------------------------------- one line


def test_full_row() -> None:
    row = parse_criteo_line(FULL + "\n", 1)
    assert isinstance(row, ParsedRow)
    assert row.label == 0
    assert row.dense == (1, -1, 0, 12, None, 3, 1_000_000, 7, None, 2, 9, 0, 5)
    assert row.categorical[0] == 0x68FD1E64 and row.categorical[2] == 0xFB936136  # > 2**31: unsigned
    assert row.categorical[21] is None and len(row.categorical) == 26


def test_stripped_trailing_fields_are_missing() -> None:
    row = parse_criteo_line("1\t5\t\t7\n", 3)
    assert row == ParsedRow(1, (5, None, 7, *[None] * 10), (None,) * 26)
    assert parse_criteo_line("1", 1) == ParsedRow(1, (None,) * 13, (None,) * 26)
    # trailing fields cut inside the categorical block
    row = parse_criteo_line(line("0", DENSE, CATS[:3]), 1)
    assert isinstance(row, ParsedRow) and row.categorical[2] == 0xFB936136 and row.categorical[3:] == (None,) * 23


def test_missing_values_in_the_middle() -> None:
    dense = [""] * 5 + ["4"] + [""] * 7
    cats = [""] * 10 + ["0000000a"] + [""] * 15
    row = parse_criteo_line(line("1", dense, cats), 1)
    assert isinstance(row, ParsedRow)
    assert row.dense[5] == 4 and row.dense.count(None) == 12
    assert row.categorical[10] == 10 and row.categorical.count(None) == 25


def test_windows_line_ending_and_short_hex() -> None:
    row = parse_criteo_line(line("1", ["3"] * 13, ["a", "FFFFFFFF"]) + "\r\n", 1)
    assert isinstance(row, ParsedRow) and row.categorical[:2] == (0xA, 0xFFFFFFFF)


MALFORMED = [
    (FULL + "\t1", "too_many_fields", "41 tab-separated fields"),
    ("\t1\t2", "missing_label", "label"),
    ("", "missing_label", "label"),
    ("2\t1", "invalid_label", "'2'"),
    ("click\t1", "invalid_label", "'click'"),
    (line("1", ["1", "2.5"], []), "invalid_dense", "int_1 (field 3) is '2.5'"),
    (line("1", ["abc"], []), "invalid_dense", "int_0"),
    (line("1", [" 3"], []), "invalid_dense", "' 3'"),
    (line("1", ["99999999999999999999"], []), "invalid_dense", "64-bit"),
    (line("0", DENSE, ["68fd1e64", "zz"]), "invalid_categorical", "cat_1 (field 16) is 'zz'"),
    (line("0", DENSE, ["123456789"]), "invalid_categorical", "1-8 hex digits"),
    (line("0", DENSE, ["-1"]), "invalid_categorical", "cat_0"),
]


@pytest.mark.parametrize(("text", "reason", "detail"), MALFORMED)
def test_malformed_line_is_quarantined_with_reason(text: str, reason: str, detail: str) -> None:
    result = parse_criteo_line(text + "\n", 42)
    assert isinstance(result, Quarantined)
    assert (result.line_number, result.reason, result.raw) == (42, reason, text)
    assert detail in result.detail


def test_int64_bounds_are_inclusive() -> None:
    row = parse_criteo_line(line("1", ["9223372036854775807", "-9223372036854775808"], []), 1)
    assert isinstance(row, ParsedRow) and row.dense[:2] == (2**63 - 1, -(2**63))
    assert isinstance(parse_criteo_line(line("1", ["9223372036854775808"], []), 1), Quarantined)


# --------------------------------------------------------------------------- batches agree with lines

FIELD = st.one_of(
    st.just(""),
    st.integers(-(2**64), 2**64).map(str),
    st.integers(0, 2**36).map(lambda v: f"{v:x}"),
    st.sampled_from(["0", "1", "abc", "1.5", " 7", "+3", "0x1f", "ééé", "\r", "-", "00000000"]),
)
LINES = st.lists(st.lists(FIELD, min_size=0, max_size=42).map("\t".join), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(LINES)
def test_batch_parser_agrees_with_line_parser(lines: list[str]) -> None:
    table, numbers, quarantined = parse_criteo_batch([s + "\n" for s in lines], 10)
    expected = [parse_criteo_line(s, 10 + i) for i, s in enumerate(lines)]
    good = [as_row(r) for r in expected if isinstance(r, ParsedRow)]
    assert table.schema == ARROW_SCHEMA
    assert [tuple(r.values()) for r in table.to_pylist()] == good
    assert list(numbers) == [10 + i for i, r in enumerate(expected) if isinstance(r, ParsedRow)]
    assert quarantined == [r for r in expected if isinstance(r, Quarantined)]


def test_batch_keeps_order_when_a_rare_row_takes_the_slow_path() -> None:
    lines = [line("1", ["1"], []), line("0", ["1234567890123456789"], []), line("1", ["x"], []), line("0", ["3"], [])]
    table, numbers, quarantined = parse_criteo_batch(lines, 1)
    assert table.column("int_0").to_pylist() == [1, 1234567890123456789, 3]
    assert list(numbers) == [1, 2, 4] and [q.line_number for q in quarantined] == [3]


# --------------------------------------------------------------------------- conversion

GOOD_LINES = [FULL, "1\t5\t\t7", "1", line("0", DENSE, CATS[:5]), line("1", [""] * 13, ["ffffffff"])]


def crafted_file(path: Path, good_repeats: int = 1) -> tuple[list[str], dict[int, str]]:
    """Good lines with one malformed line of each kind in between; returns all lines and {line number: reason}."""
    lines: list[str] = []
    bad: dict[int, str] = {}
    for _ in range(good_repeats):
        lines += GOOD_LINES
    for text, _, _ in MALFORMED:
        lines.insert(len(lines) // 2, text)
    for i, text in enumerate(lines, 1):
        result = parse_criteo_line(text, i)
        if isinstance(result, Quarantined):
            bad[i] = result.reason
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return lines, bad


def read_rows(out: Path) -> list[tuple]:
    tables = [pq.read_table(p) for split in ("train", "eval") for p in sorted((out / split).glob("*.parquet"))]
    return sorted((tuple(r.values()) for t in tables for r in t.to_pylist()), key=repr)


def test_convert_quarantines_every_malformed_line(tmp_path: Path) -> None:
    lines, bad = crafted_file(tmp_path / "in.tsv", good_repeats=4)
    report = convert_criteo(tmp_path / "in.tsv", tmp_path / "out", progress=False, batch_lines=7)
    assert report.rows_read == len(lines)
    assert report.rows_quarantined == len(MALFORMED) == len(bad)
    assert report.rows_converted == len(lines) - len(bad) == report.train_rows + report.eval_rows
    assert report.quarantine_reasons == {
        r: sum(1 for _, reason, _ in MALFORMED if reason == r) for r in {m[1] for m in MALFORMED}
    }
    records = [json.loads(s) for s in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert {rec["line"]: rec["reason"] for rec in records} == bad
    assert all(rec["raw"] == lines[rec["line"] - 1] for rec in records)
    parsed = (parse_criteo_line(s, i) for i, s in enumerate(lines, 1))
    expected = sorted((as_row(r) for r in parsed if isinstance(r, ParsedRow)), key=repr)
    assert read_rows(tmp_path / "out") == expected


def test_output_layout_schema_and_report(tmp_path: Path) -> None:
    crafted_file(tmp_path / "in.tsv", good_repeats=2)
    report = convert_criteo(tmp_path / "in.tsv", tmp_path / "out", progress=False)
    out = tmp_path / "out"
    assert (out / "_SUCCESS").exists()
    for split in ("train", "eval"):
        for p in (out / split).glob("*.parquet"):
            assert pq.read_schema(p).equals(ARROW_SCHEMA)
            assert [f.name for f in pq.read_schema(p)][:3] == ["label", "int_0", "int_1"]
    saved = json.loads((out / "conversion_report.json").read_text())
    assert saved["rows_converted"] == report.rows_converted and saved["rows_quarantined"] == len(MALFORMED)
    assert saved["quarantine_path"] == str(out / "quarantine.jsonl")
    assert {"quarantine_reasons", "train_rows", "eval_rows"} <= saved.keys()
    # the schema.yaml block is exactly what configs/criteo_kaggle.yaml declares
    columns = yaml.safe_load((out / "schema.yaml").read_text())["columns"]
    assert columns == {"label": "label", "item": criteo_schema().item.model_dump(exclude_defaults=True)}
    job = load_job_config(REPO / "configs/criteo_kaggle.yaml", [f"data.path={out}"])
    assert job.data.columns == criteo_schema()
    files = validate_dataset(job.data)
    assert files.train_rows + files.eval_rows == report.rows_converted


def test_gzip_input_gives_the_same_dataset(tmp_path: Path) -> None:
    crafted_file(tmp_path / "in.tsv", good_repeats=3)
    crafted_file(tmp_path / "in.tsv.gz", good_repeats=3)
    plain = convert_criteo(tmp_path / "in.tsv", tmp_path / "a", progress=False)
    gz = convert_criteo(tmp_path / "in.tsv.gz", tmp_path / "b", progress=False)
    assert gz.rows_converted == plain.rows_converted > 0
    for split in ("train", "eval"):
        for p in (tmp_path / "a" / split).glob("*.parquet"):
            assert p.read_bytes() == (tmp_path / "b" / split / p.name).read_bytes()


def test_truncated_gzip_is_an_error_without_success(tmp_path: Path) -> None:
    crafted_file(tmp_path / "in.tsv.gz", good_repeats=200)
    data = (tmp_path / "in.tsv.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupt or truncated"):
        convert_criteo(tmp_path / "cut.gz", tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_split_is_by_eval_fraction_deterministic_and_independent_of_batching(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{i % 2}\t{i}\n" for i in range(3000)))
    a = convert_criteo(path, tmp_path / "a", eval_fraction=0.2, progress=False, batch_lines=1000)
    convert_criteo(path, tmp_path / "b", eval_fraction=0.2, progress=False, batch_lines=64)
    convert_criteo(path, tmp_path / "c", eval_fraction=0.2, seed=1, progress=False)
    assert 450 < a.eval_rows < 750 and a.train_rows + a.eval_rows == 3000

    def eval_ids(out: Path) -> list[int]:
        return sorted(pq.read_table(out / "eval").column("int_0").to_pylist())

    assert eval_ids(tmp_path / "a") == eval_ids(tmp_path / "b")
    assert eval_ids(tmp_path / "c") != eval_ids(tmp_path / "a")


def test_shards_roll_over(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"1\t{i}\n" for i in range(250)))
    report = convert_criteo(path, tmp_path / "out", eval_fraction=0.0, rows_per_shard=100, progress=False)
    train = sorted((tmp_path / "out" / "train").glob("*.parquet"))
    assert [pq.read_metadata(p).num_rows for p in train] == [100, 100, 50]
    assert [pq.read_metadata(p).num_rows for p in (tmp_path / "out" / "eval").glob("*.parquet")] == [0]
    assert report.eval_rows == 0


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    crafted_file(tmp_path / "in.tsv")
    convert_criteo(tmp_path / "in.tsv", tmp_path / "out", progress=False)
    with pytest.raises(UserError, match="--overwrite"):
        convert_criteo(tmp_path / "in.tsv", tmp_path / "out", progress=False)
    assert convert_criteo(tmp_path / "in.tsv", tmp_path / "out", overwrite=True, progress=False).rows_converted > 0


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        convert_criteo(tmp_path / "missing.tsv", tmp_path / "out", progress=False)
    (tmp_path / "in.tsv").write_text("1\n")
    with pytest.raises(UserError, match="eval fraction"):
        convert_criteo(tmp_path / "in.tsv", tmp_path / "out", eval_fraction=1.0, progress=False)


# --------------------------------------------------------------------------- the command


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("dlrm-platform")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, check=False)


def test_cli_prints_counts_and_writes_report_json(tmp_path: Path) -> None:
    lines, bad = crafted_file(tmp_path / "in.tsv.gz")
    proc = run_cli("convert-criteo", str(tmp_path / "in.tsv.gz"), str(tmp_path / "out"),
                   "--eval-fraction", "0.5", "--report-json", str(tmp_path / "r.json"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    converted = len(lines) - len(bad)
    assert f"converted {converted} rows" in proc.stdout and f"quarantined {len(bad)} of {len(lines)}" in proc.stdout
    assert "invalid_dense: 4" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows_converted"] == converted and report["rows_quarantined"] == len(bad)


def test_cli_errors_without_traceback(tmp_path: Path) -> None:
    proc = run_cli("convert-criteo", str(tmp_path / "missing.tsv"), str(tmp_path / "out"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "junk.tsv").write_text("hello world\nfoo\tbar\n")
    proc = run_cli("convert-criteo", str(tmp_path / "junk.tsv"), str(tmp_path / "out2"), "--quiet")
    assert proc.returncode == 2 and "no valid row" in proc.stderr
    assert "quarantined 2 of 2" in proc.stdout
    assert not (tmp_path / "out2" / "_SUCCESS").exists()


def test_arrow_schema_types() -> None:
    assert ARROW_SCHEMA.field("label").type == pa.int64()
    assert all(ARROW_SCHEMA.field(f"int_{i}").type == pa.int64() for i in range(13))
    assert all(ARROW_SCHEMA.field(f"cat_{i}").type == pa.int64() for i in range(26))
    assert len(ARROW_SCHEMA) == 40
