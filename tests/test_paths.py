"""dlrm_platform.paths: config paths confined to data/output roots, each escape kind, and the job's own check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlrm_platform.config import load_job_config
from dlrm_platform.paths import (
    DATA_ROOTS_ENV,
    OUTPUT_ROOTS_ENV,
    PathEscapeError,
    check_job_paths,
    confine_path,
    enforce_job_paths,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "data", tmp_path / "runs"


def test_inside_relative_absolute_and_through_an_inner_link(tmp_path: Path, roots) -> None:
    data, _ = roots
    assert confine_path("data/demo", [data], field="data.path", base=tmp_path) == data / "demo"
    assert confine_path(data / "demo" / "new", [data], field="data.path", base=tmp_path) == data / "demo" / "new"
    os.symlink(data / "demo", data / "alias")
    assert confine_path("data/alias", [Path("data")], field="data.path", base=tmp_path) == data / "demo"


@pytest.mark.parametrize("value", ["../x", "data/../data/demo", "data/demo/..", "/../etc"])
def test_dotdot_anywhere(tmp_path: Path, roots, value: str) -> None:
    with pytest.raises(PathEscapeError, match=r"data\.path: .*'\.\.'"):
        confine_path(value, [roots[0]], field="data.path", base=tmp_path)


def test_absolute_elsewhere_and_a_prefix_that_is_not_a_parent(tmp_path: Path, roots) -> None:
    for value in ("/etc", str(tmp_path / "elsewhere"), str(tmp_path / "data-evil"), str(tmp_path)):
        with pytest.raises(PathEscapeError, match="outside the allowed directories"):
            confine_path(value, [roots[0]], field="data.path", base=tmp_path)


def test_symlink_escape_at_any_depth(tmp_path: Path, roots) -> None:
    data, _ = roots
    os.symlink(tmp_path / "elsewhere", data / "out")
    os.symlink("/", data / "demo" / "root")
    for value in ("data/out", "data/out/a/b", "data/demo/root/etc"):
        with pytest.raises(PathEscapeError, match="symbolic link"):
            confine_path(value, [data], field="data.path", base=tmp_path)


def test_nul_byte(tmp_path: Path, roots) -> None:
    with pytest.raises(PathEscapeError, match="NUL"):
        confine_path("data/a\x00", [roots[0]], field="data.path", base=tmp_path)


def _job(tmp_path: Path, *overrides: str):
    return load_job_config(REPO / "configs" / "demo.yaml", [f"data.path={tmp_path}/data/demo",
                                                           f"tracking.runs_dir={tmp_path}/runs", *overrides])


def test_check_job_paths_names_every_field(tmp_path: Path, roots) -> None:
    data, runs = roots
    assert check_job_paths(_job(tmp_path), [data], [runs], tmp_path) == []
    job = _job(tmp_path, "data.path=/etc", "tracking.runs_dir=../x", "tuner.policy_path=/tmp/p",
               "train.resume_from=/tmp/ckpt", f"train.storage_path={tmp_path}/elsewhere", "ingest.dedup=false")
    fields = {p.field for p in check_job_paths(job, [data], [runs], tmp_path)}
    assert fields == {"data.path", "tracking.runs_dir", "tuner.policy_path", "train.resume_from", "train.storage_path"}
    # A URI storage path (s3://...) is not a local path: not confined here.
    assert check_job_paths(_job(tmp_path, "train.storage_path=s3://bucket/x"), [data], [runs], tmp_path) == []


def test_enforce_uses_the_roots_the_service_passed(tmp_path: Path, roots, monkeypatch) -> None:
    data, runs = roots
    job = _job(tmp_path, "data.path=/etc")
    enforce_job_paths(job, tmp_path)  # no roots in the environment: a hand-run job is not confined
    monkeypatch.setenv(DATA_ROOTS_ENV, str(data))
    monkeypatch.setenv(OUTPUT_ROOTS_ENV, os.pathsep.join([str(runs), str(tmp_path / "storage")]))
    enforce_job_paths(_job(tmp_path), tmp_path)
    with pytest.raises(PathEscapeError, match="data.path: '/etc'"):
        enforce_job_paths(job, tmp_path)


def test_run_job_checks_paths_before_anything_starts(tmp_path: Path, roots, monkeypatch) -> None:
    """A symlink swapped in after the service accepted the config: the job refuses before Ray or MLflow."""
    import ray

    from dlrm_platform import job as job_module
    from dlrm_platform import mlflow_run

    data, runs = roots
    os.symlink(tmp_path / "elsewhere", data / "swapped")
    monkeypatch.setenv(DATA_ROOTS_ENV, str(data))
    monkeypatch.setenv(OUTPUT_ROOTS_ENV, str(runs))

    def forbidden(*args, **kwargs):
        raise AssertionError("started work for a job whose paths escape")

    monkeypatch.setattr(ray, "init", forbidden)
    monkeypatch.setattr(mlflow_run, "start_job_run", forbidden)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathEscapeError, match="symbolic link"):
        job_module.run_job(_job(tmp_path, f"data.path={data}/swapped"))
