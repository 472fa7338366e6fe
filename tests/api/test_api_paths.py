"""Paths in API requests stay inside the service's data and output roots: no '..', no absolute path
elsewhere, no symbolic link out, no service-managed field chosen by the request; the job gets the roots
and checks again before it starts (tests/test_paths.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_fakes import TINY_CONFIG, Stack

from dlrm_platform.paths import DATA_ROOTS_ENV, OUTPUT_ROOTS_ENV

SESSION_CONFIG = TINY_CONFIG.replace("    label: label\n", "    label: label\n    session_key: sid\n")


def _post(stack: Stack, body: dict[str, Any]):
    return stack.client.post("/v1/jobs", json=body, headers=stack.h("alice"))


def _config(**sections: dict[str, Any]) -> dict[str, Any]:
    cfg = yaml.safe_load(TINY_CONFIG)
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def _rejected(r, loc: tuple[str, ...], *words: str) -> None:
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    hit = [e for e in errors if tuple(e["loc"]) == ("body", "config", *loc)]
    assert hit, errors
    for w in words:
        assert w in hit[0]["msg"], hit[0]["msg"]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path.parent / f"{tmp_path.name}-outside"
    (out / "train").mkdir(parents=True, exist_ok=True)
    return out


def test_paths_inside_the_roots_are_accepted(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "data" / "real").mkdir(parents=True)
    os.symlink(tmp_path / "data" / "real", tmp_path / "data" / "alias")  # a link that stays inside
    for cfg in (_config(data={"path": "data/tiny"}), _config(data={"path": str(tmp_path / "data" / "x")}),
                _config(data={"path": "data/alias/sub"}), _config(tracking={"runs_dir": "runs/alice"})):
        r = _post(stack, {"config": cfg})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize("path", ["../data/tiny", "data/../../etc", "data/tiny/../../.."])
def test_dotdot_is_rejected(stack: Stack, path: str) -> None:
    _rejected(_post(stack, {"config": _config(data={"path": path})}), ("data", "path"), "data.path", "'..'")


def test_absolute_path_elsewhere_is_rejected(stack: Stack, outside: Path) -> None:
    _rejected(_post(stack, {"config": _config(data={"path": str(outside)})}), ("data", "path"),
              "data.path", "outside the allowed directories")
    _rejected(_post(stack, {"config": _config(data={"path": "/etc"})}), ("data", "path"), "data.path")
    _rejected(_post(stack, {"config": _config(tracking={"runs_dir": str(outside)})}), ("tracking", "runs_dir"),
              "tracking.runs_dir")
    _rejected(_post(stack, {"config": _config(tuner={"policy_path": "/etc/passwd"})}), ("tuner", "policy_path"),
              "tuner.policy_path")
    # an output may not go into the data roots, nor an input come from elsewhere
    _rejected(_post(stack, {"config": _config(tracking={"runs_dir": "data/runs"})}), ("tracking", "runs_dir"))


def test_symlink_escape_is_rejected(stack: Stack, tmp_path: Path, outside: Path) -> None:
    (tmp_path / "data").mkdir(exist_ok=True)
    os.symlink(outside, tmp_path / "data" / "escape")
    _rejected(_post(stack, {"config": _config(data={"path": "data/escape"})}), ("data", "path"),
              "data.path", "symbolic link")
    _rejected(_post(stack, {"config": _config(data={"path": "data/escape/deeper/still"})}), ("data", "path"),
              "symbolic link")
    (tmp_path / "runs").mkdir(exist_ok=True)
    os.symlink(outside, tmp_path / "runs" / "escape")
    _rejected(_post(stack, {"config": _config(tracking={"runs_dir": "runs/escape"})}), ("tracking", "runs_dir"),
              "symbolic link")


def test_overrides_cannot_escape_either(stack: Stack) -> None:
    r = _post(stack, {"config_name": "tiny", "overrides": {"data.path": "../../etc"}})
    _rejected(r, ("data", "path"), "'..'")
    r = _post(stack, {"config_name": "tiny", "overrides": {"tracking.runs_dir": "/"}})
    _rejected(r, ("tracking", "runs_dir"))


def test_nul_byte_is_rejected(stack: Stack) -> None:
    _rejected(_post(stack, {"config": _config(data={"path": "data/a\x00b"})}), ("data", "path"), "NUL")


def test_dedup_copy_beside_a_data_root_is_rejected(stack: Stack) -> None:
    cfg = yaml.safe_load(SESSION_CONFIG)
    cfg["data"]["path"] = "data"  # the root itself: its dedup copy data.dedup would land outside
    _rejected(_post(stack, {"config": cfg}), ("data", "path"), "dedup copy")
    cfg["data"]["path"] = "data/sessions"
    assert _post(stack, {"config": cfg}).status_code == 201


@pytest.mark.parametrize(("field", "value"), [("train.storage_path", "runs/api/storage/job-other"),
                                              ("train.resume_from", "runs/api/storage/job-other/checkpoint"),
                                              ("tracking.run_id", "0123456789abcdef")])
def test_service_managed_fields_are_not_accepted(stack: Stack, field: str, value: str) -> None:
    section, name = field.split(".")
    _rejected(_post(stack, {"config": _config(**{section: {name: value}})}), (section, name),
              field, "set by the service")
    r = _post(stack, {"config_name": "tiny", "overrides": {field: value}})
    _rejected(r, (section, name), "set by the service")


def test_config_name_cannot_leave_configs_dir(stack: Stack, tmp_path: Path, outside: Path) -> None:
    (outside / "evil.yaml").write_text(TINY_CONFIG)
    os.symlink(outside / "evil.yaml", tmp_path / "configs" / "evil.yaml")
    r = _post(stack, {"config_name": "evil"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "config_name"], r.text
    for name in ("../evil", "/etc/passwd", ".hidden", "a/b"):
        assert _post(stack, {"config_name": name}).status_code == 422


def test_the_job_gets_the_roots(stack: Stack, tmp_path: Path) -> None:
    stack.submit("alice")
    stack.service.tick()
    env = stack.backend.submissions[-1]["runtime_env"]["env_vars"]
    assert env[DATA_ROOTS_ENV].split(os.pathsep) == [str(tmp_path / "data")]
    assert env[OUTPUT_ROOTS_ENV].split(os.pathsep) == [str(tmp_path / "runs"), str((tmp_path / "storage").resolve())]
