"""Typed job configuration.

One pydantic model per stage (data, ingest, train, tuner, tracking), composed
into :class:`JobConfig`. Every model forbids unknown keys. YAML is read only by
:func:`load_job_config`, called from entry points; everything below an entry
point receives the typed objects.

Crossing a Ray boundary: one way, everywhere. The sender passes the typed
object itself (a pydantic model, or a pydantic dataclass where positional
construction matters); Ray pickles it. The receiving side's entry point (a
remote function, a read task, an actor's method, the Ray Train loop, a Ray Data
callback) calls :func:`revalidate` on it before anything else, so an object
built with ``model_construct``, mutated past validation, or unpickled from a
different version is rejected there with an error naming the field. No config
travels as JSON strings or as dicts indexed by string keys. Where Ray itself
demands a dict (Ray Train's ``train_loop_config``), the dict holds the typed
object under one key. The same rule holds for results travelling back: the
worker reports one typed model and the driver validates it
(``train.result.TrainReport``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.dataclasses import is_pydantic_dataclass

from dlrm_platform.errors import UserError

__all__ = [
    "ConfigError",
    "DataConfig",
    "DatasetSchema",
    "EpochCacheConfig",
    "IngestConfig",
    "JobConfig",
    "OperatorConfig",
    "OperatorsConfig",
    "RayClusterConfig",
    "SideColumns",
    "SyntheticDataConfig",
    "TrackingConfig",
    "TrainConfig",
    "TunerConfig",
    "apply_overrides",
    "format_validation_error",
    "load_job_config",
    "revalidate",
]


class ConfigError(UserError, ValueError):
    """A job config that cannot be used. The message names the file and field path."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- data


class SideColumns(StrictModel):
    """The columns of one side (user or item) of a sample, by kind."""

    dense: list[str] = Field(default_factory=list, description="float/int columns, one value per sample")
    categorical: list[str] = Field(default_factory=list, description="integer id columns, one id per sample")
    multi_hot: list[str] = Field(default_factory=list, description="list<integer> columns, e.g. a user history")


class DatasetSchema(StrictModel):
    """What a Parquet dataset holds, declared in the job config.

    User-side columns are shared by every sample of a session; item-side
    columns vary per sample. Categorical and multi-hot columns each get an
    embedding table named after the column.
    """

    label: str = "label"
    session_key: str | None = Field(
        default=None, description="column identifying the session (one user); enables deduplication"
    )
    user: SideColumns = Field(default_factory=SideColumns)
    item: SideColumns = Field(default_factory=SideColumns)

    @model_validator(mode="after")
    def _check_columns(self) -> DatasetSchema:
        names = [self.label, *([self.session_key] if self.session_key else []), *self.feature_columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"columns declared more than once: {dupes}")
        if not self.dense_columns:
            raise ValueError("at least one dense column is required (user.dense or item.dense)")
        if not self.sparse_features:
            raise ValueError("at least one categorical or multi_hot column is required")
        return self

    @property
    def dense_columns(self) -> list[str]:
        """Dense columns in model order: user side, then item side."""
        return [*self.user.dense, *self.item.dense]

    @property
    def user_sparse_features(self) -> list[str]:
        return [*self.user.categorical, *self.user.multi_hot]

    @property
    def item_sparse_features(self) -> list[str]:
        return [*self.item.categorical, *self.item.multi_hot]

    @property
    def sparse_features(self) -> list[str]:
        """Sparse features in KeyedJaggedTensor key order: user side, then item side."""
        return [*self.user_sparse_features, *self.item_sparse_features]

    @property
    def multi_hot_columns(self) -> list[str]:
        return [*self.user.multi_hot, *self.item.multi_hot]

    @property
    def feature_columns(self) -> list[str]:
        return [*self.dense_columns, *self.sparse_features]

    @property
    def columns(self) -> list[str]:
        """Every column the pipeline reads."""
        key = [self.session_key] if self.session_key else []
        return [self.label, *key, *self.feature_columns]


class SessionLengthConfig(StrictModel):
    """Distribution of samples per session."""

    distribution: Literal["fixed", "poisson", "geometric"] = "poisson"
    mean: float = Field(8.0, ge=1.0)
    max: int = Field(64, ge=1)


class SyntheticDataConfig(StrictModel):
    """Parameters of the synthetic session generator (`dlrm-platform gen-data`)."""

    seed: int = 0
    num_sessions: int = Field(20_000, ge=1)
    samples_per_session: SessionLengthConfig = Field(default_factory=SessionLengthConfig)
    num_user_categorical: int = Field(3, ge=1)
    num_user_dense: int = Field(3, ge=0)
    num_item_categorical: int = Field(3, ge=1)
    num_item_dense: int = Field(3, ge=0)
    user_vocab_size: int = Field(100_000, ge=2)
    item_vocab_size: int = Field(50_000, ge=2)
    history_length: tuple[int, int] = (20, 100)
    zipf_exponent: float = Field(1.1, gt=1.0)
    layout: Literal["random", "clustered"] = Field(
        "random", description="random: rows shuffled as logs land; clustered: rows grouped by session"
    )
    rows_per_shard: int = Field(50_000, ge=1)
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0)

    @field_validator("history_length")
    @classmethod
    def _check_history(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError("history_length must be [min, max] with 1 <= min <= max")
        return v


class DataConfig(StrictModel):
    """Where the dataset lives and what it holds.

    ``path`` holds one directory per split (``train/``, ``eval/``) of Parquet
    files. Relative paths resolve against the working directory.
    """

    path: Path
    format: Literal["parquet"] = "parquet"
    columns: DatasetSchema
    train_split: str = "train"
    eval_split: str = "eval"
    synthetic: SyntheticDataConfig | None = Field(
        default=None, description="how `dlrm-platform gen-data` generates this dataset"
    )
    on_bad_shard: Literal["fail", "skip"] = Field(
        "fail",
        description="a Parquet shard that cannot be read (corrupt, truncated, not Parquet): fail the job "
        "before Ray starts, or skip it; either way the job reports the count and the files",
    )

    def split_dir(self, split: str) -> Path:
        return self.path / split


# --------------------------------------------------------------------------- ingest


class OperatorConfig(StrictModel):
    """Resources of one pipeline operator. The tuner may change these while it runs."""

    concurrency: int = Field(1, ge=1, description="parallel tasks (or actors) of this operator")
    num_cpus: float = Field(0.2, gt=0, description="CPUs reserved by each task")


class OperatorsConfig(StrictModel):
    """One knob per named pipeline operator, in pipeline order."""

    read: OperatorConfig = Field(default_factory=OperatorConfig)
    parse: OperatorConfig = Field(default_factory=OperatorConfig)
    dense_transform: OperatorConfig = Field(default_factory=OperatorConfig)
    sparse_transform: OperatorConfig = Field(default_factory=OperatorConfig)
    batch: OperatorConfig = Field(default_factory=OperatorConfig)


# The ingest operators, in pipeline order: the fields above, the names Ray Data shows (MapBatches(<name>)),
# the tuner's knobs (dlrm_platform.tuner.operator_specs).
OPERATOR_NAMES: tuple[str, ...] = tuple(OperatorsConfig.model_fields)


def _on_off(value: Any) -> Any:
    """YAML reads a bare ``on``/``off`` as a boolean: take it as the word it was."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class EpochCacheConfig(StrictModel):
    """Each trainer keeps its first pass over a dataset (packed batches) and replays it in later epochs.

    ``auto``: keep while the batches fit ``memory_mb`` plus ``disk_mb`` (spilled
    to ``spill_dir``); past that, drop the cache and run the pipeline every
    epoch. ``on``: the same, but outgrowing the bounds fails the job with a
    message naming these fields. ``off``: run the pipeline every epoch. A
    replayed epoch visits the same batches in a fresh order; when an input file
    changes, or the cache of any worker is incomplete, every worker runs the
    pipeline again (``train/feed.py``).
    """

    mode: Literal["auto", "on", "off"] = "auto"
    memory_mb: float = Field(2048.0, ge=0, description="per trainer: packed batches kept in memory")
    disk_mb: float = Field(20480.0, ge=0, description="per trainer: packed batches spilled to local disk")
    spill_dir: Path | None = Field(default=None, description="where spills go; default <tracking.runs_dir>/epoch_cache")

    _mode_words = field_validator("mode", mode="before")(_on_off)


class IngestConfig(StrictModel):
    """The Ray Data preprocessing pipeline."""

    batch_size: int = Field(1024, ge=1, description="samples per training batch (per worker)")
    hash_size: int = Field(100_000, ge=2, description="rows of each embedding table unless overridden")
    hash_sizes: dict[str, Annotated[int, Field(ge=2)]] = Field(
        default_factory=dict, description="per-feature table sizes (keys: categorical or multi_hot columns)"
    )
    max_history_length: int = Field(100, ge=1, description="multi-hot lists are truncated to this length")
    dense_log1p: bool = Field(True, description="fill missing dense values with 0, then log1p(max(x, 0))")
    dedup: bool | None = Field(
        default=None, description="RecD deduplication; None means on when the data has a session key"
    )
    data_cpus: float | None = Field(
        default=None, gt=0, description="CPUs for Ray Data; default: the cluster's CPUs minus the trainers'"
    )
    prefetch_batches: int = Field(2, ge=0, description="batches each trainer prefetches ahead")
    read_ahead: bool = Field(
        True, description="read each pass (next epoch, eval) from worker start-up on, ahead of the trainer "
        "(train/feed.py); false: a pass starts when the trainer asks for it"
    )
    operators: OperatorsConfig = Field(default_factory=OperatorsConfig)
    fusion: Literal["auto", "on", "off"] = Field(
        "auto",
        description="run read..batch as one task per block (ingest/fused.py); auto: on unless the tuner "
        "policy steers operators one by one (every policy but static and auto) and the data CPUs leave it a "
        "choice (room for a second task of some operator)",
    )
    fused: OperatorConfig | None = Field(
        default=None, description="tasks and CPUs of the fused operator; None: from the data CPUs"
    )
    block_rows: int | None = Field(
        default=None, ge=1,
        description="samples per block of the fused pipeline; None: whole batches, >= 8 of them and ~2 MiB, <= 8 MiB",
    )
    cache: EpochCacheConfig = Field(default_factory=EpochCacheConfig)
    coordinated_reads: Literal["auto", "steps", "blocks"] = Field(
        "auto",
        description="how the feed service splits a pass between trainers (ingest/feed_service.py): steps = every "
        "step gives every worker a batch of exactly batch_size samples (the pipeline's session-sized batches "
        "re-cut; the pass's order is preserved so a resumed epoch re-cuts the same batches); blocks = whole "
        "blocks to whichever worker asks, a worker ahead waits; auto: steps with 2 or more workers",
    )
    share: Literal["auto", "off"] = Field(
        "auto",
        description="share the feed service with concurrent jobs whose pipelines have the same fingerprint (input "
        "files, transforms and their config): one preprocessing execution serves them all, a job that joins late "
        "replays the pass from its start; off: the job's own service",
    )
    share_retain_mb: float = Field(
        256.0, ge=0,
        description="per pass, preprocessed blocks a shared feed service keeps after every job read them, so that a "
        "job joining late can replay them (ephemeral: dropped when no job reads the pass)",
    )

    _fusion_words = field_validator("fusion", mode="before")(_on_off)
    _share_words = field_validator("share", mode="before")(_on_off)

    def step_samples(self, num_workers: int) -> int | None:
        """The feed service's step size (coordinated reads in steps mode), or None for blocks mode."""
        steps = self.coordinated_reads == "steps" or (self.coordinated_reads == "auto" and num_workers > 1)
        return self.batch_size if steps else None

    def table_size(self, feature: str) -> int:
        return self.hash_sizes.get(feature, self.hash_size)


# --------------------------------------------------------------------------- train


class TrainConfig(StrictModel):
    """Ray Train + TorchRec DLRM training."""

    num_workers: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    use_gpu: bool = False
    epochs: int = Field(1, ge=1)
    max_steps_per_epoch: int | None = Field(default=None, ge=1)
    embedding_dim: int = Field(16, ge=1)
    bottom_mlp: list[int] = Field(default_factory=lambda: [64, 16], min_length=1)
    top_mlp: list[int] = Field(default_factory=lambda: [64, 1], min_length=1)
    dense_optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"
    learning_rate: float = Field(0.05, gt=0)
    embedding_learning_rate: float = Field(0.05, gt=0)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="bf16 autocast for the MLPs where the hardware gains from it (train/perf.py)"
    )
    sharding: Literal["auto", "table_wise", "data_parallel", "column_wise", "table_column_wise"] = "auto"
    log_every_steps: int = Field(20, ge=1)
    checkpoint_every_steps: int | None = Field(default=None, ge=1)
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on storage (the newest)")
    max_failures: int = Field(1, ge=0, description="worker failures Ray Train recovers from")
    seed: int = 0
    # Set by the job service (dlrm_platform.api) so that a retried job resumes:
    storage_path: str | None = Field(
        default=None,
        description="Ray Train storage root for checkpoints (a directory or URI); None = Ray's default",
    )
    resume_from: str | None = Field(
        default=None,
        description="a checkpoint directory written by an earlier attempt of this job: restore model, "
        "optimizer and step counters from it instead of starting from zero",
    )

    @model_validator(mode="after")
    def _check_mlps(self) -> TrainConfig:
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(
                f"bottom_mlp must end in embedding_dim ({self.embedding_dim}), got {self.bottom_mlp[-1]}"
            )
        if self.top_mlp[-1] != 1:
            raise ValueError(f"top_mlp must end in 1 (the logit), got {self.top_mlp[-1]}")
        return self


# --------------------------------------------------------------------------- tuner


# The tuner's policies (dlrm_platform.tuner.policies.POLICY_CLASSES implements each).
TunerPolicy = Literal["auto", "static", "ray_default", "plumber", "hill_climb", "rl", "oracle"]
TUNER_POLICIES: tuple[str, ...] = get_args(TunerPolicy)


class TunerConfig(StrictModel):
    """Per-operator concurrency control of the live pipeline."""

    policy: TunerPolicy = Field(
        "auto", description="auto (default): hold a fused pipeline, plumber over split operators "
        "(dlrm_platform/tuner/README.md)"
    )
    interval_s: float = Field(1.0, gt=0, description="seconds between observations/actions")
    policy_path: Path | None = Field(default=None, description="RL policy checkpoint; None = the shipped one")
    object_store_limit_fraction: float = Field(
        0.8, gt=0, le=1, description="actions that would push object-store use past this share are masked"
    )


# --------------------------------------------------------------------------- tracking


class TrackingConfig(StrictModel):
    """MLflow tracking. With no ``tracking_uri``, a sqlite store under ``runs_dir``."""

    tracking_uri: str | None = None
    runs_dir: Path = Path("runs")
    experiment: str = "dlrm-platform"
    run_name: str | None = None
    log_model: bool = True
    tags: dict[str, str] = Field(default_factory=dict)
    run_id: str | None = Field(
        default=None,
        description="log into this existing MLflow run instead of creating one (the job service creates "
        "one run per job and passes it to every attempt)",
    )


class PlacementConfig(StrictModel):
    """Where a job's processes run on a multi-node cluster, named by Ray custom resources.

    Nodes offer a custom resource (``ray start --resources='{"data_worker": 16}'``;
    infra/kuberay's data and trainer groups declare ``data_worker`` and
    ``trainer``); a process that asks for a sliver of it runs only on those
    nodes. Unset (one machine): anywhere, with the CPUs split by the budget.
    """

    data_resource: str | None = Field(
        default=None, min_length=1,
        description="every Ray Data task asks a sliver of this resource: preprocessing runs only on the nodes "
        "that offer it, and Ray Data's CPU budget is those nodes' CPUs",
    )
    trainer_resource: str | None = Field(
        default=None, min_length=1,
        description="every training worker asks a sliver of this resource: trainers run only on those nodes",
    )
    max_data_cpus: float | None = Field(
        default=None, gt=0,
        description="with data_resource and no ingest.data_cpus, the most data-node CPUs the pipeline's task "
        "pools and the tuner are sized for as data nodes join a running job; None: 4x the data CPUs at start",
    )

    @model_validator(mode="after")
    def _distinct(self) -> PlacementConfig:
        if self.data_resource is not None and self.data_resource == self.trainer_resource:
            raise ValueError("ray.placement.data_resource and trainer_resource must name different resources "
                             f"(both are {self.data_resource!r})")
        return self


class RayClusterConfig(StrictModel):
    """How the entry point reaches Ray. ``address=None`` starts a local cluster."""

    address: str | None = None
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of a local cluster (default: all)")
    idle_worker_keep_s: float = Field(
        default=60.0, gt=0,
        description="a local cluster's idle task workers live this long (Ray's default: 1 s, which re-spawns a "
                    "pipeline's workers after every pause; see ray_cluster.py)")
    placement: PlacementConfig = Field(default_factory=PlacementConfig)


# --------------------------------------------------------------------------- job


class JobConfig(StrictModel):
    """A whole training job: one per `dlrm-platform run`."""

    name: str = "dlrm"
    data: DataConfig
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tuner: TunerConfig = Field(default_factory=TunerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    ray: RayClusterConfig = Field(default_factory=RayClusterConfig)

    @property
    def dedup_enabled(self) -> bool:
        if self.ingest.dedup is None:
            return self.data.columns.session_key is not None
        return self.ingest.dedup

    @model_validator(mode="after")
    def _check_dedup(self) -> JobConfig:
        if self.ingest.dedup and self.data.columns.session_key is None:
            raise ValueError("ingest.dedup is true but data.columns.session_key is not set")
        unknown = sorted(set(self.ingest.hash_sizes) - set(self.data.columns.sparse_features))
        if unknown:  # a typo would silently leave the table at hash_size
            raise ValueError(
                f"ingest.hash_sizes names {unknown}, which are not categorical or multi_hot columns of "
                f"data.columns ({self.data.columns.sparse_features})"
            )
        return self


# --------------------------------------------------------------------------- loading

M = TypeVar("M")  # a pydantic model or pydantic dataclass


def format_validation_error(err: ValidationError, source: str, headline: str = "invalid job config") -> str:
    """One line per problem: ``source: field.path: message``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not a field of this section)"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict | list):
            got = repr(e["input"])
            msg = f"{msg} (got {got if len(got) <= 200 else got[:200] + '...'})"
        lines.append(f"{source}: {loc}: {msg}")
    return f"{headline}:\n  " + "\n  ".join(lines)


# What YAML parsing raises on bad input: YAMLError, ValueError (an integer of more than 4300 digits),
# RecursionError (nesting thousands deep).
_YAML_INPUT_ERRORS = (yaml.YAMLError, ValueError, RecursionError)


def _parse_override_value(key: str, raw: str) -> Any:
    if raw == "":
        return ""
    try:
        return yaml.safe_load(raw)
    except _YAML_INPUT_ERRORS as err:
        first = " ".join(str(err).split())[:200]
        raise ConfigError(f"override {key!r}: the value {raw[:100]!r} is not a YAML value ({first})") from None


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    """Apply dotted-path overrides (``{"train.epochs": 2}`` or ``["train.epochs=2"]``) to a raw config dict."""
    out = copy.deepcopy(raw)
    if not overrides:
        return out
    if isinstance(overrides, list):
        pairs: dict[str, Any] = {}
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} must look like section.field=value")
            key, value = item.split("=", 1)
            pairs[key.strip()] = _parse_override_value(key.strip(), value)
        overrides = pairs
    for dotted, value in overrides.items():
        node = out
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError(f"override {dotted!r} must be a dotted field path like train.epochs")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def parse_job_config(raw: Any, source: str = "<config>", overrides: dict[str, Any] | list[str] | None = None) -> JobConfig:
    """Validate an already-parsed config mapping. Raises :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a job config must be a mapping of sections, got {type(raw).__name__}")
    try:
        raw = apply_overrides(raw, overrides)
        return JobConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a job config") from None


def load_job_config(path: str | Path, overrides: dict[str, Any] | list[str] | None = None) -> JobConfig:
    """Read a YAML job config; the only place configs are read from disk."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the config file ({type(err).__name__}: {err})") from None
    try:
        raw = yaml.safe_load(text)
    except _YAML_INPUT_ERRORS as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err)[:500]}") from None
    return parse_job_config(raw, str(path), overrides)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def revalidate(model: M) -> M:
    """Re-validate a typed object received across a Ray boundary; return the validated copy.

    ``model``: a pydantic model or pydantic dataclass. Raises :class:`ConfigError`
    (one line per problem, naming the field) when it does not validate, and
    TypeError when it is not a typed object at all (a dict or a JSON string).
    """
    cls = type(model)
    try:
        if isinstance(model, BaseModel):
            return cls.model_validate(model.model_dump(mode="python", warnings=False))
        if is_pydantic_dataclass(cls):
            return _adapter(cls).validate_python(dataclasses.asdict(model))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, f"{cls.__name__} received across a Ray boundary",
                                                  headline=f"invalid {cls.__name__}")) from None
    raise TypeError(f"expected a pydantic model or pydantic dataclass across the Ray boundary, got {cls.__name__}")
