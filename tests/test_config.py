"""Job config validation: good files load, bad ones name the file and the field path."""

from pathlib import Path

import pytest
import yaml

from dlrm_platform.config import (
    ConfigError,
    JobConfig,
    TrainConfig,
    apply_overrides,
    load_job_config,
    revalidate,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (REPO / "configs").glob("*.yaml") if yaml.safe_load(p.read_text()).get("data"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    job = load_job_config(path)
    assert isinstance(job, JobConfig)
    assert job.train.bottom_mlp[-1] == job.train.embedding_dim


def test_criteo_kaggle_is_the_standard_model():
    job = load_job_config(REPO / "configs" / "criteo_kaggle.yaml")
    assert len(job.data.columns.dense_columns) == 13
    assert len(job.data.columns.sparse_features) == 26
    assert job.train.embedding_dim == 16
    assert job.train.bottom_mlp == [512, 256, 64, 16]
    assert job.train.top_mlp == [512, 256, 1]
    assert job.ingest.table_size("cat_0") == job.ingest.hash_size


def test_demo_columns_order_user_then_item():
    job = load_job_config(REPO / "configs" / "demo.yaml")
    cols = job.data.columns
    assert cols.sparse_features[: len(cols.user_sparse_features)] == cols.user_sparse_features
    assert cols.session_key == "session_id"


def _write(tmp_path, raw) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _demo_raw():
    return yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())


def test_unknown_key_names_field_path_and_file(tmp_path):
    raw = _demo_raw()
    raw["train"]["num_wrokers"] = 2
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError) as err:
        load_job_config(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "train.num_wrokers" in msg
    assert "unknown key" in msg


def test_wrong_type_names_field_path_and_value(tmp_path):
    raw = _demo_raw()
    raw["ingest"]["operators"]["parse"]["concurrency"] = "lots"
    with pytest.raises(ConfigError) as err:
        load_job_config(_write(tmp_path, raw))
    assert "ingest.operators.parse.concurrency" in str(err.value)
    assert "'lots'" in str(err.value)


def test_unknown_operator_is_rejected(tmp_path):
    raw = _demo_raw()
    raw["ingest"]["operators"]["shuffle"] = {"concurrency": 1}
    with pytest.raises(ConfigError, match="ingest.operators.shuffle"):
        load_job_config(_write(tmp_path, raw))


def test_cross_field_checks(tmp_path):
    raw = _demo_raw()
    raw["train"]["bottom_mlp"] = [64, 32]
    with pytest.raises(ConfigError, match="bottom_mlp must end in embedding_dim"):
        load_job_config(_write(tmp_path, raw))
    raw = _demo_raw()
    raw["data"]["columns"]["session_key"] = None
    raw["ingest"]["dedup"] = True
    with pytest.raises(ConfigError, match="session_key"):
        load_job_config(_write(tmp_path, raw))


def test_duplicate_column_is_rejected(tmp_path):
    raw = _demo_raw()
    raw["data"]["columns"]["item"]["dense"].append("u_dense_0")
    with pytest.raises(ConfigError, match="u_dense_0"):
        load_job_config(_write(tmp_path, raw))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_job_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_job_config(bad)


def test_overrides_are_typed_and_validated():
    job = load_job_config(REPO / "configs" / "demo.yaml", ["train.epochs=3", "ingest.dedup=true"])
    assert job.train.epochs == 3 and job.ingest.dedup is True
    with pytest.raises(ConfigError, match="train.epochs"):
        load_job_config(REPO / "configs" / "demo.yaml", ["train.epochs=zero"])
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides({}, ["train.epochs"])


def test_revalidate_roundtrip():
    job = load_job_config(REPO / "configs" / "demo.yaml")
    again = revalidate(job)
    assert again == job and again is not job


def test_dedup_default_follows_session_key():
    job = load_job_config(REPO / "configs" / "demo.yaml", ["ingest.dedup=null"])
    assert job.dedup_enabled is True
    job = load_job_config(REPO / "configs" / "criteo_kaggle.yaml", ["ingest.dedup=null"])
    assert job.dedup_enabled is False


def test_revalidate_rejects_objects_that_skipped_validation():
    """What crosses a Ray boundary is re-validated on arrival: a model built or changed past validation is refused."""
    job = load_job_config(REPO / "configs" / "demo.yaml")
    bad = job.model_copy(update={"train": job.train.model_copy(update={"epochs": 0})})  # no validation
    with pytest.raises(ConfigError, match=r"JobConfig received across a Ray boundary: train\.epochs"):
        revalidate(bad)
    with pytest.raises(ConfigError, match=r"TrainConfig received across a Ray boundary: epochs"):
        revalidate(TrainConfig.model_construct(epochs="many"))
    with pytest.raises(TypeError, match="pydantic"):
        revalidate(job.model_dump())  # a dict (or a JSON string) is not a typed crossing


def test_revalidate_checks_pydantic_dataclasses():
    from dlrm_platform.tuner.spec import OpSpec, TunerSpec

    spec = TunerSpec("t", "static", 4.0, [OpSpec("a", 1.0)])
    assert revalidate(spec) == spec
    spec.cpu_budget = -1.0  # dataclass fields are not validated on assignment
    with pytest.raises(ConfigError, match="cpu_budget must be positive"):
        revalidate(spec)


def test_the_tuner_is_on_by_default_with_auto():
    from dlrm_platform.config import TunerConfig
    from dlrm_platform.ingest.fused import fusion_enabled

    assert TunerConfig().policy == "auto"
    for name in ("demo.yaml", "criteo_kaggle.yaml"):
        job = load_job_config(REPO / "configs" / name)
        assert job.tuner.policy == "auto", name
        assert fusion_enabled(job.ingest, job.tuner), name  # auto keeps the pipeline fused
    assert load_job_config(REPO / "configs" / "demo.yaml", ["tuner.policy=static"]).tuner.policy == "static"
    with pytest.raises(ConfigError, match="tuner.policy"):
        load_job_config(REPO / "configs" / "demo.yaml", ["tuner.policy=automatic"])


def test_idle_worker_keep_reaches_the_local_clusters_ray_setting():
    from dlrm_platform.ray_cluster import IDLE_WORKER_KEEP_MS, idle_worker_env, local_system_config

    job = load_job_config(REPO / "configs" / "demo.yaml")
    assert local_system_config(job.ray.idle_worker_keep_s) == {"idle_worker_killing_time_threshold_ms": 60_000}
    assert IDLE_WORKER_KEEP_MS == 60_000 and idle_worker_env() == {"RAY_idle_worker_killing_time_threshold_ms": "60000"}
    before = load_job_config(REPO / "configs" / "demo.yaml", ["ray.idle_worker_keep_s=1"])  # Ray's own default
    assert local_system_config(before.ray.idle_worker_keep_s) == {"idle_worker_killing_time_threshold_ms": 1000}
    with pytest.raises(ConfigError, match=r"ray\.idle_worker_keep_s"):
        load_job_config(REPO / "configs" / "demo.yaml", ["ray.idle_worker_keep_s=0"])
