"""Fuzzing job configs and `--set` overrides (`load_job_config`).

Every input is either a valid JobConfig or a ConfigError whose message names
the field path concerned (or the override / file); never another exception.
And `dlrm-platform run` rejects an invalid config before any Ray or MLflow
work starts.

`make test` tries a few dozen inputs per test; `make fuzz` (profile ``chaos``) 600.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dlrm_platform.config import ConfigError, JobConfig, load_job_config, parse_job_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [REPO / "configs" / "demo.yaml", REPO / "configs" / "criteo_kaggle.yaml"]
BASES = [yaml.safe_load(p.read_text()) for p in CONFIGS]
# Every field path of a full config (defaults included), e.g. ("train", "epochs").
FULL = [JobConfig.model_validate(b).model_dump(mode="json") for b in BASES]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    return out


FIELD_PATHS = sorted({p for f in FULL for p in _paths(f)})

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["", "-1", "0", "nan", "inf", "1e999", "auto", "../..", "/etc", "\x00"]),
    st.lists(st.integers(-5, 100), max_size=4), st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _mentions_path(message: str, path: tuple) -> bool:
    """The message names the path, one of its parents, or (for a cross-field check) its section."""
    dotted = [".".join(str(p) for p in path[:k]) for k in range(len(path), 0, -1)]
    return any(d and d in message for d in dotted)


def _check(raw: Any, path: tuple, overrides: list[str] | None = None) -> None:
    try:
        parse_job_config(raw, "fuzz.yaml", overrides)
    except ConfigError as err:
        msg = str(err)
        assert _mentions_path(msg, path), f"{path} not named in: {msg}"
        assert "Traceback" not in msg


@fuzz_settings()
@given(st.data())
def test_fuzzed_config_is_valid_or_names_the_field(data) -> None:
    raw = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    path = data.draw(st.sampled_from(FIELD_PATHS))
    action = data.draw(st.sampled_from(["set", "set", "unknown_key", "delete"]))
    node = raw
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if action == "set":
        node[path[-1]] = data.draw(JUNK)
    elif action == "unknown_key":
        node[path[-1]] = node.get(path[-1]) if isinstance(node.get(path[-1]), dict) else {}
        key = data.draw(st.text(min_size=1, max_size=10))
        node[path[-1]][key] = data.draw(JUNK)
        path = (*path, key)
    else:
        node.pop(path[-1], None)
    _check(raw, path)


OVERRIDE_VALUES = st.one_of(
    JUNK.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()),
    st.text(max_size=30),
    st.sampled_from(["[", "{a: ", "*x", "&a [1]", "!!python/object:os.system", "!!binary zz", "9" * 5000,
                     "[" * 1000, "'unterminated", "a: b: c", "- 1\n- 2", "~", "0x1F", "1_000", "2001-01-01"]),
)


@fuzz_settings()
@given(st.lists(st.tuples(st.one_of(st.sampled_from(FIELD_PATHS).map(lambda p: ".".join(map(str, p))),
                                    st.text(max_size=15).filter(lambda k: "=" not in k)), OVERRIDE_VALUES),
                          min_size=1, max_size=3),
       st.sampled_from(CONFIGS))
def test_fuzzed_set_overrides_are_applied_or_named(pairs, config) -> None:
    overrides = [f"{k}={v}" for k, v in pairs]
    try:
        load_job_config(config, overrides)
    except ConfigError as err:
        msg = str(err)
        named = [k.strip() for k, _ in pairs]
        # The error names an override (as written), or a field path of it or a parent (a section replaced).
        assert any(f"override {k!r}" in msg or (k and _mentions_path(msg, tuple(k.split(".")))) for k in named), msg


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["train.epochs=["], "train.epochs"),
        (["train.epochs=!!python/object/apply:os.system ['true']"], "train.epochs"),
        (["train.epochs=" + "9" * 5000], "train.epochs"),
        (["train.epochs=" + "[" * 1000], "train.epochs"),
        (["train.epochs=*x"], "train.epochs"),
        (["=5"], "override ''"),
        (["train.=5"], "train."),
        (["ingest.hash_sizes.u_cat_0=-1"], "ingest.hash_sizes.u_cat_0"),
        (["ingest.hash_sizes.u_cat_9=100"], "ingest.hash_sizes"),
    ],
)
def test_bad_overrides_found_by_the_fuzzer(overrides, named) -> None:
    with pytest.raises(ConfigError) as err:
        load_job_config(CONFIGS[0], overrides)
    assert named in str(err.value)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00bad", b"a: [" + b"[" * 1000,
                                     b"train: {epochs: " + b"9" * 5000 + b"}"])
def test_unreadable_config_files_are_config_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=str(path)):
        load_job_config(path)
    with pytest.raises(ConfigError, match="is a directory"):
        load_job_config(tmp_path)


def test_deeply_nested_config_is_a_config_error() -> None:
    raw = copy.deepcopy(BASES[0])
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    raw["tracking"]["tags"] = {"a": deep}
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_job_config(raw, "deep.yaml")


@pytest.mark.parametrize("override", ["train.epochs=0", "train.epochs=[", "train.num_wrokers=2", "data=1"])
def test_run_rejects_an_invalid_config_before_ray_or_mlflow(override, monkeypatch, tmp_path, capsys) -> None:
    import ray

    from dlrm_platform import cli, job, mlflow_run

    def forbidden(*args, **kwargs):
        raise AssertionError("Ray or MLflow work started for an invalid config")

    monkeypatch.setattr(ray, "init", forbidden)
    monkeypatch.setattr(job, "run_job", forbidden)
    monkeypatch.setattr(mlflow_run, "start_job_run", forbidden)
    code = cli.main(["run", str(CONFIGS[0]), "--set", override, "--set", f"tracking.runs_dir={tmp_path}/runs"])
    assert code == 2
    assert override.split("=")[0] in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
