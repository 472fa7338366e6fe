"""Fuzzing the Criteo TSV reader (`convert_criteo`) with Hypothesis.

Every input, however broken (truncated, bad bytes, wrong types, huge fields,
empty, gzip or a corrupt gzip), must end in converted rows + quarantined rows
that add up to its lines, or in a UserError naming the file; never another
exception, a hang or a lost line. The expected counts come from the reference
definition of a line (:func:`parse_criteo_line`) applied to the decoded text.

`make test` tries a few dozen inputs; `make fuzz` (profile ``chaos``) 600.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dlrm_platform.errors import UserError
from dlrm_platform.ingest import criteo
from dlrm_platform.ingest.criteo import ParsedRow, convert_criteo, parse_criteo_batch, parse_criteo_line

pytestmark = pytest.mark.timeout(600)

# Small enough that Hypothesis reaches it, so the overlong-line path is fuzzed too.
FUZZ_MAX_LINE_CHARS = 3000

_dense = st.one_of(st.just(""), st.integers(-(2**63), 2**63 - 1).map(str), st.integers(0, 999).map(str))
_cat = st.one_of(st.just(""), st.integers(0, 2**32 - 1).map(lambda v: f"{v:x}"))


@st.composite
def valid_lines(draw) -> str:
    fields = [draw(st.sampled_from(["0", "1"]))]
    fields += [draw(_dense) for _ in range(13)] + [draw(_cat) for _ in range(26)]
    keep = draw(st.integers(1, 40))  # real files strip trailing empty fields
    return "\t".join(fields[:keep])


_junk_field = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["-", "1.5", "0x1f", "1e3", "nan", "abcdefg12", "123456789", " 1", "٣", "\x00", "\ufeff0"]),
    st.integers().map(str),  # out-of-range integers
    st.integers(1, 6000).map(lambda n: "9" * n),  # integers Python refuses to int() (> 4300 digits)
    st.integers(1, 6000).map(lambda n: "0" * n + "1"),  # zero-padded: still a valid int64
)


@st.composite
def broken_lines(draw) -> str:
    """A valid line with a field replaced, fields added or removed, or a huge field."""
    fields = draw(valid_lines()).split("\t")
    how = draw(st.sampled_from(["replace", "extra", "huge", "label"]))
    if how == "replace":
        fields[draw(st.integers(0, len(fields) - 1))] = draw(_junk_field)
    elif how == "extra":
        fields += [draw(_dense) for _ in range(draw(st.integers(1, 45)))]
    elif how == "huge":
        fields[draw(st.integers(0, len(fields) - 1))] = "f" * draw(st.integers(100, 2 * FUZZ_MAX_LINE_CHARS))
    else:
        fields[0] = draw(st.sampled_from(["", "2", "-1", "0.0", "true", "01", " 0"]))
    return "\t".join(fields)


LINES = st.lists(st.one_of(valid_lines(), broken_lines(), st.text(max_size=60)), max_size=40)


@st.composite
def raw_files(draw) -> tuple[bytes, bool]:
    """(file bytes, whether the bytes are a whole gzip stream)."""
    text = "\n".join(draw(LINES))
    if draw(st.booleans()):
        text += "\n"
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8", "surrogatepass")
    bad_bytes = st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\r", b"\t\t", b"\xed\xa0\x80"])
    for _ in range(draw(st.integers(0, 3))):  # bad bytes: invalid UTF-8, NUL, stray CR, tabs
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(bad_bytes) + data[at:]
    if draw(st.booleans()):  # truncated anywhere
        data = data[: draw(st.integers(0, len(data)))]
    container = draw(st.sampled_from(["plain", "plain", "gzip", "gzip_truncated", "gzip_flipped"]))
    if container == "plain":
        return data, False
    packed = gzip.compress(data, mtime=0)
    if container == "gzip_truncated":
        return packed[: draw(st.integers(2, max(2, len(packed) - 1)))], True
    if container == "gzip_flipped":
        at = draw(st.integers(10, len(packed) - 1))
        packed = packed[:at] + bytes([packed[at] ^ draw(st.integers(1, 255))]) + packed[at + 1:]
        return packed, True
    return packed, False


def _expected(text: str) -> tuple[int, int, int]:
    """(lines, valid lines, overlong lines) of decoded text, by the reference definition."""
    if text == "":
        return 0, 0, 0
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    overlong = sum(len(line) > FUZZ_MAX_LINE_CHARS for line in lines)
    valid = sum(
        isinstance(parse_criteo_line(line, i + 1), ParsedRow)
        for i, line in enumerate(lines)
        if len(line) <= FUZZ_MAX_LINE_CHARS
    )
    return len(lines), valid, overlong


def _check_output(report, out: Path) -> None:
    assert report.rows_read == report.rows_converted + report.rows_quarantined
    assert sum(report.quarantine_reasons.values()) == report.rows_quarantined
    parquet_rows = sum(pq.read_metadata(p).num_rows for p in report.files)
    assert parquet_rows == report.rows_converted == report.train_rows + report.eval_rows
    quarantined = [json.loads(x) for x in (out / criteo.QUARANTINE_FILE).read_text().splitlines()]
    assert len(quarantined) == report.rows_quarantined
    numbers = [q["line"] for q in quarantined]
    assert numbers == sorted(set(numbers)) and all(1 <= n <= report.rows_read for n in numbers)
    assert (out / "_SUCCESS").exists() == (report.rows_converted > 0)


@fuzz_settings()
@given(raw_files(), st.sampled_from([1, 3, 64, 65_536]))
def test_fuzzed_criteo_file_is_converted_or_quarantined(tmp_path_factory, monkeypatch, raw, batch_lines) -> None:
    monkeypatch.setattr(criteo, "MAX_LINE_CHARS", FUZZ_MAX_LINE_CHARS)
    data, may_fail = raw
    work = tmp_path_factory.mktemp("criteo")
    src, out = work / "input.tsv", work / "out"
    src.write_bytes(data)
    try:
        report = convert_criteo(src, out, progress=False, batch_lines=batch_lines, rows_per_shard=7)
    except UserError as err:
        assert may_fail, f"a readable input was rejected: {err}"
        assert str(src) in str(err)  # names the file
        assert not (out / "_SUCCESS").exists()
        return
    _check_output(report, out)
    decoded = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    lines, valid, overlong = _expected(decoded.decode("utf-8", "replace"))
    assert report.rows_read == lines
    assert report.rows_converted == valid
    assert report.quarantine_reasons.get("line_too_long", 0) == overlong


def test_huge_fields_at_the_real_limits_are_quarantined(tmp_path: Path) -> None:
    """Regressions found by the fuzzer: a > 4300-digit integer (int() raises) and a field larger
    than Arrow's CSV block (1 MiB: 'straddling object') crashed the converter; a 3 MiB line without
    a line break is quarantined as line_too_long, holding only its first characters."""
    good = "\t".join(["1", *["7"] * 13, *["ab"] * 26])
    lines = [
        good,
        "0\t" + "9" * 6000,                         # invalid_dense, not a ValueError
        "0\t" + "0" * 6000 + "5",                    # zero-padded: a valid int64
        "1" + "\t" * 14 + "x" * 1_000_000,                 # invalid_categorical, < MAX_LINE_CHARS
        "1\t" + "f" * (3 * criteo.MAX_LINE_CHARS),   # > MAX_LINE_CHARS
        good,
    ]
    src = tmp_path / "huge.tsv"
    src.write_text("\n".join(lines))
    report = convert_criteo(src, tmp_path / "out", progress=False)
    assert report.rows_read == 6 and report.rows_converted == 3
    assert report.quarantine_reasons == {"invalid_dense": 1, "invalid_categorical": 1, "line_too_long": 1}
    quarantined = [json.loads(x) for x in (tmp_path / "out" / criteo.QUARANTINE_FILE).read_text().splitlines()]
    too_long = next(q for q in quarantined if q["reason"] == "line_too_long")
    assert too_long["line"] == 5 and len(too_long["raw"]) <= 1000
    assert str(3 * criteo.MAX_LINE_CHARS + 2) in too_long["detail"]
    # Larger than Arrow's 1 MiB CSV block (reachable by the batch parser; lines that long are cut by the reader)
    table, numbers, bad = parse_criteo_batch([good, "1" + "\t" * 14 + "x" * 1_200_000, good], 1)
    assert table.num_rows == 2 and list(numbers) == [1, 3] and [q.reason for q in bad] == ["invalid_categorical"]


def test_a_line_of_exactly_the_limit_is_not_too_long(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(criteo, "MAX_LINE_CHARS", 100)
    exact = "1\t" + "0" * 97 + "5"  # 100 characters
    for text in (exact, exact + "\n", exact + "\n" + exact):
        src = tmp_path / "exact.tsv"
        src.write_text(text)
        report = convert_criteo(src, tmp_path / "out", progress=False, overwrite=True)
        assert report.rows_converted == report.rows_read == text.count(exact)


@pytest.mark.parametrize("content", [b"", b"\n", b"\n\n\n", b"\x1f\x8b", b"PAR1\x00\x00PAR1"])
def test_degenerate_files(tmp_path: Path, content: bytes) -> None:
    src = tmp_path / "in.tsv"
    src.write_bytes(content)
    try:
        report = convert_criteo(src, tmp_path / "out", progress=False)
    except UserError as err:
        assert content.startswith(b"\x1f\x8b") and str(src) in str(err)
        return
    assert report.rows_converted == 0 and report.rows_read == report.rows_quarantined == content.count(b"\n") + (
        1 if content and not content.endswith(b"\n") else 0)


def test_io_errors_are_user_errors_naming_the_file(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "in.tsv"
    src.write_text("1\t2\n" * 10)
    real_open = Path.open

    def no_permission(self, *args, **kwargs):
        if self == src:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", no_permission)
    with pytest.raises(UserError, match=f"{src}: cannot read the input"):
        convert_criteo(src, tmp_path / "out", progress=False)
    monkeypatch.setattr(Path, "open", real_open)

    def failing_batches(f, batch_lines):
        yield [f.readline()]
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(criteo, "_batches", failing_batches)
    with pytest.raises(UserError, match="I/O error after line 1") as err:
        convert_criteo(src, tmp_path / "out2", progress=False)
    assert str(src) in str(err.value) and not (tmp_path / "out2" / "_SUCCESS").exists()
