"""validate_dataset: a declared column missing or mistyped is an error naming the column, the type and the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_platform.config import DataConfig, DatasetSchema, SideColumns, SyntheticDataConfig
from dlrm_platform.errors import UserError
from dlrm_platform.ingest.source import DatasetNotFoundError, DatasetSchemaError, validate_dataset

COLUMNS = DatasetSchema(
    label="label",
    session_key="sid",
    user=SideColumns(dense=["u_d"], categorical=["u_c"], multi_hot=["hist"]),
    item=SideColumns(dense=["i_d"], categorical=["i_c"]),
)


def good_table(n: int = 3) -> pa.Table:
    return pa.table(
        {
            "sid": pa.array(range(n), pa.int64()),
            "label": pa.array([0, 1] * (n // 2) + [0] * (n % 2), pa.int64()),
            "u_d": pa.array([1.5] * n, pa.float32()),
            "u_c": pa.array([7] * n, pa.int64()),
            "hist": pa.array([[1, 2]] * n, pa.list_(pa.int64())),
            "i_d": pa.array([3] * n, pa.int32()),
            "i_c": pa.array([4] * n, pa.int64()),
            "unused": pa.array(["x"] * n),  # undeclared columns are fine
        }
    )


def write(root: Path, split: str, name: str, table: pa.Table) -> Path:
    (root / split).mkdir(parents=True, exist_ok=True)
    path = root / split / name
    pq.write_table(table, path)
    return path


def data_config(root: Path, synthetic: bool = False) -> DataConfig:
    return DataConfig(path=root, columns=COLUMNS, synthetic=SyntheticDataConfig() if synthetic else None)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    write(tmp_path, "train", "part-00000.parquet", good_table(4))
    write(tmp_path, "train", "part-00001.parquet", good_table(3))
    write(tmp_path, "eval", "part-00000.parquet", good_table(2))
    return tmp_path


def test_good_dataset_lists_files_and_rows(dataset: Path) -> None:
    files = validate_dataset(data_config(dataset))
    assert files.train == [dataset / "train/part-00000.parquet", dataset / "train/part-00001.parquet"]
    assert files.eval == [dataset / "eval/part-00000.parquet"]
    assert (files.train_rows, files.eval_rows) == (7, 2)


def test_hidden_and_underscore_files_are_ignored(dataset: Path) -> None:
    (dataset / "train" / "_temporary").mkdir()
    (dataset / "train" / "_temporary" / "x.parquet").write_bytes(b"partial")
    (dataset / "train" / ".part-9.parquet").write_bytes(b"partial")
    (dataset / "train" / "_SUCCESS").write_text("")
    assert len(validate_dataset(data_config(dataset)).train) == 2


def test_nested_partition_directories_are_read(dataset: Path) -> None:
    write(dataset, "train/day=1", "a.parquet", good_table(5))
    files = validate_dataset(data_config(dataset))
    assert dataset / "train/day=1/a.parquet" in files.train
    assert files.train_rows == 12


def test_missing_column_names_column_kind_and_file(dataset: Path) -> None:
    bad = write(dataset, "eval", "part-00001.parquet", good_table().drop_columns(["i_c"]))
    with pytest.raises(DatasetSchemaError) as err:
        validate_dataset(data_config(dataset))
    msg = str(err.value)
    assert "'i_c'" in msg and "data.columns.item.categorical" in msg and "expected integer" in msg
    assert "is missing from" in msg and str(bad) in msg
    assert "part-00000" not in msg  # the good files are not blamed
    assert isinstance(err.value, UserError)


@pytest.mark.parametrize(
    ("column", "bad_type", "field_path", "expected"),
    [
        ("label", pa.string(), "data.columns.label", "integer, float or bool"),
        ("sid", pa.list_(pa.int64()), "data.columns.session_key", "a scalar"),
        ("u_d", pa.string(), "data.columns.user.dense", "integer or float"),
        ("u_c", pa.float64(), "data.columns.user.categorical", "expected integer"),
        ("u_c", pa.string(), "data.columns.user.categorical", "expected integer"),
        ("hist", pa.list_(pa.string()), "data.columns.user.multi_hot", "list of integer"),
        ("hist", pa.int64(), "data.columns.user.multi_hot", "list of integer"),
        ("i_d", pa.bool_(), "data.columns.item.dense", "integer or float"),
    ],
)
def test_wrong_type_names_column_type_and_file(
    tmp_path: Path, column: str, bad_type: pa.DataType, field_path: str, expected: str
) -> None:
    table = good_table()
    idx = table.schema.get_field_index(column)
    table = table.set_column(idx, pa.field(column, bad_type), pa.nulls(table.num_rows, bad_type))
    path = write(tmp_path, "train", "p.parquet", table)
    write(tmp_path, "eval", "p.parquet", good_table())
    with pytest.raises(DatasetSchemaError) as err:
        validate_dataset(data_config(tmp_path))
    msg = str(err.value)
    assert f"column {column!r} ({field_path}, " in msg
    type_name = str(bad_type).split("<")[0]  # Parquet renames a list's item field
    assert expected in msg and f"has type {type_name}" in msg and str(path) in msg


@pytest.mark.parametrize(
    ("column", "ok_type"),
    [
        ("label", pa.bool_()),
        ("label", pa.float32()),
        ("sid", pa.string()),
        ("u_c", pa.dictionary(pa.int32(), pa.int64())),
        ("u_c", pa.uint32()),
        ("hist", pa.large_list(pa.int32())),
        ("u_d", pa.int16()),
    ],
)
def test_accepted_types(tmp_path: Path, column: str, ok_type: pa.DataType) -> None:
    table = good_table()
    idx = table.schema.get_field_index(column)
    table = table.set_column(idx, pa.field(column, ok_type), pa.nulls(table.num_rows, ok_type))
    write(tmp_path, "train", "p.parquet", table)
    write(tmp_path, "eval", "p.parquet", table)
    assert validate_dataset(data_config(tmp_path)).train_rows == table.num_rows


def test_same_problem_in_many_files_is_reported_once(dataset: Path) -> None:
    for i in range(5):
        write(dataset, "train", f"z-{i}.parquet", good_table().drop_columns(["u_d"]))
    with pytest.raises(DatasetSchemaError) as err:
        validate_dataset(data_config(dataset))
    msg = str(err.value)
    assert msg.count("'u_d'") == 1 and "and 2 more files" in msg


def test_every_problem_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "train", "p.parquet", good_table().drop_columns(["u_d", "hist"]))
    write(tmp_path, "eval", "p.parquet", good_table())
    with pytest.raises(DatasetSchemaError) as err:
        validate_dataset(data_config(tmp_path))
    assert "'u_d'" in str(err.value) and "'hist'" in str(err.value)


def test_unreadable_file_is_named(dataset: Path) -> None:
    bad = dataset / "train" / "part-00002.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetSchemaError, match=str(bad)):
        validate_dataset(data_config(dataset))


def test_missing_directory_says_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        validate_dataset(data_config(tmp_path / "nope"))
    msg = str(err.value)
    assert str(tmp_path / "nope") in msg and "convert-criteo" in msg and "gen-data" in msg
    assert isinstance(err.value, UserError)


def test_missing_directory_of_synthetic_config_points_to_gen_data(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"dlrm-platform gen-data CONFIG"):
        validate_dataset(data_config(tmp_path / "nope", synthetic=True))


def test_missing_split_is_named(tmp_path: Path) -> None:
    write(tmp_path, "train", "p.parquet", good_table())
    with pytest.raises(DatasetNotFoundError, match=r"no 'eval' split .*eval"):
        validate_dataset(data_config(tmp_path))


def test_split_without_parquet_files(tmp_path: Path) -> None:
    write(tmp_path, "train", "p.parquet", good_table())
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "notes.txt").write_text("x")
    with pytest.raises(DatasetNotFoundError, match=r"holds no \.parquet files"):
        validate_dataset(data_config(tmp_path))


def test_custom_split_names(tmp_path: Path) -> None:
    write(tmp_path, "tr", "p.parquet", good_table(4))
    write(tmp_path, "va", "p.parquet", good_table(1))
    data = DataConfig(path=tmp_path, columns=COLUMNS, train_split="tr", eval_split="va")
    files = validate_dataset(data)
    assert (files.train_rows, files.eval_rows) == (4, 1)
