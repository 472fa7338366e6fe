"""The model a job produces: an MLflow pyfunc that scores raw rows with click probabilities.

::

    last checkpoint (DCP of the sharded DistributedModelParallel, :mod:`.checkpoint`)
      -> the unsharded DLRM on CPU (:func:`load_unsharded_model`)
      -> MLflow pyfunc "model" in the job's run (:func:`log_job_model`):
           artifacts  weights.pt (plain state dict), job_config.json (the resolved job config)
           signature  inputs: the declared feature columns of ``data.columns`` (raw, as in the
                      dataset's Parquet files); output: ``click_probability``
           example    the first rows of the dataset

Load and score::

    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    probabilities = model.predict(df)    # df: pandas DataFrame with the declared columns

``predict`` applies the training pipeline's own transforms (``ingest.transforms``:
``parse`` casts, ``dense_transform``, ``sparse_transform`` hashing and history
truncation, then the plain packing of ``ingest.batching``) and the plain DLRM of
:mod:`.model`. A dedup job's model is the same function (``train.dedup_model``:
same modules, same state-dict names), so every job exports the plain model. The
label and the session key are not inputs (extra columns are ignored); missing
dense values count as 0 and missing ids as id 0, as in training. Inference runs
in float32 on CPU, whatever precision training used.

The loading environment needs this package (``dlrm_platform``) importable, i.e.
the platform's own environment (``make install``); the model's pip requirements
name the third-party packages and versions it was logged with.

A DCP checkpoint of a sharded model loads into plain tensors without a process
group: DCP reads each table's shards (table-wise, column-wise, ...) into the
whole tensor, so the export does not care how training sharded the tables.
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from dlrm_platform.config import DatasetSchema, JobConfig

__all__ = [
    "MODEL_ARTIFACT_PATH",
    "OUTPUT_COLUMN",
    "DLRMClickModel",
    "input_example",
    "load_unsharded_model",
    "log_job_model",
    "model_signature",
    "predict_proba",
    "save_job_model",
]

log = logging.getLogger(__name__)

MODEL_ARTIFACT_PATH = "model"
OUTPUT_COLUMN = "click_probability"
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "job_config.json"
# Rows scored per forward pass (bounds the memory of a large DataFrame).
PREDICT_BATCH_ROWS = 8192


class ExportError(RuntimeError):
    """The job's model could not be exported (the message says which checkpoint and why)."""


# --------------------------------------------------------------------------- weights


def load_unsharded_model(job: JobConfig, checkpoint_path: str | Path) -> torch.nn.Module:
    """The job's DLRM (``model.DLRMTrain``, unsharded, CPU, eval mode) with the weights of a checkpoint.

    ``checkpoint_path`` is a directory written by :func:`.checkpoint.save_checkpoint`
    (the job summary's ``checkpoint_path``); only its ``model`` entries are read.
    """
    import torch.distributed.checkpoint as dcp

    from dlrm_platform.train.model import build_dlrm

    path = Path(checkpoint_path)
    if not (path / ".metadata").is_file():
        raise ExportError(f"{path} is not a training checkpoint (no DCP .metadata file)")
    model = build_dlrm(job, "cpu")
    state = {"model": model.state_dict()}
    try:
        with warnings.catch_warnings():  # no process group is the intent here: one process reads every shard
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path))
    except Exception as err:  # names and shapes must match the job's model
        raise ExportError(
            f"could not load the model of checkpoint {path} into the job's DLRM ({err}); was it written by a job "
            "with the same data.columns, ingest table sizes and train model shape?"
        ) from err
    model.load_state_dict(state["model"])
    return model.eval()


# --------------------------------------------------------------------------- scoring


def _feature_table(df: pd.DataFrame, columns: DatasetSchema) -> pa.Table:
    """The declared feature columns of ``df`` as Arrow, plus a placeholder label (``parse`` requires one)."""
    missing = [c for c in columns.feature_columns if c not in df.columns]
    if missing:
        raise ValueError(f"the input lacks the declared columns {missing} (data.columns of the job)")
    multi_hot = set(columns.multi_hot_columns)
    arrays, names = [], []
    for name in columns.feature_columns:
        values = df[name]
        if name in multi_hot:
            arr = pa.array([None if v is None else np.asarray(v, dtype=np.int64) for v in values],
                           type=pa.large_list(pa.int64()))
        else:
            arr = pa.array(values.to_numpy(), from_pandas=True)
        arrays.append(arr)
        names.append(name)
    arrays.append(pa.array(np.zeros(len(df), dtype=np.float32)))
    names.append(columns.label)
    return pa.Table.from_arrays(arrays, names=names)


def predict_proba(model: torch.nn.Module, job: JobConfig, df: pd.DataFrame) -> np.ndarray:
    """Click probabilities (float64, one per row of ``df``) of the unsharded ``model`` of ``job``."""
    from dlrm_platform.ingest import transforms
    from dlrm_platform.ingest.batching import pack_table
    from dlrm_platform.train.batches import unpack_batch

    # The label is a placeholder and the session key is not a feature: parse neither.
    columns = job.data.columns.model_copy(update={"session_key": None})
    spec = transforms.TransformSpec.from_config(columns, job.ingest, None)
    dense, sparse = columns.dense_columns, columns.sparse_features
    out = np.empty(len(df), dtype=np.float64)
    dlrm = model.model if hasattr(model, "model") else model
    with torch.inference_mode():
        for start in range(0, len(df), PREDICT_BATCH_ROWS):
            table = _feature_table(df.iloc[start : start + PREDICT_BATCH_ROWS], columns)
            table = transforms.parse(table, spec)
            table = transforms.dense_transform(table, spec)
            table = transforms.sparse_transform(table, spec)
            packed = pack_table(table, dense, sparse, columns.multi_hot_columns, columns.label)
            batch = unpack_batch(packed, sparse, len(dense))
            logits = dlrm(batch.dense_features, batch.sparse_features).squeeze(-1)
            out[start : start + len(table)] = torch.sigmoid(logits.double()).numpy()
    return out


class DLRMClickModel(mlflow.pyfunc.PythonModel):
    """The pyfunc: ``predict(DataFrame of the declared columns) -> DataFrame[click_probability]``."""

    def load_context(self, context: Any) -> None:
        config = json.loads(Path(context.artifacts["job_config"]).read_text())
        self.job = JobConfig.model_validate(config)
        self.model = _model_from_weights(self.job, context.artifacts["weights"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        if not isinstance(model_input, pd.DataFrame):
            model_input = pd.DataFrame(model_input)
        return pd.DataFrame({OUTPUT_COLUMN: predict_proba(self.model, self.job, model_input)})


def _model_from_weights(job: JobConfig, weights_path: str | Path) -> torch.nn.Module:
    from dlrm_platform.train.model import build_dlrm

    model = build_dlrm(job, "cpu")
    model.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
    return model.eval()


# --------------------------------------------------------------------------- signature, example


def model_signature(columns: DatasetSchema) -> Any:
    """Inputs: every declared feature column (dense double, categorical long, multi-hot array of long)."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, Schema

    multi_hot = set(columns.multi_hot_columns)
    dense = set(columns.dense_columns)
    specs = []
    for name in columns.feature_columns:
        if name in dense:
            specs.append(ColSpec(DataType.double, name))
        elif name in multi_hot:
            specs.append(ColSpec(Array(DataType.long), name))
        else:
            specs.append(ColSpec(DataType.long, name))
    return ModelSignature(inputs=Schema(specs), outputs=Schema([ColSpec(DataType.double, OUTPUT_COLUMN)]))


def input_example(columns: DatasetSchema, files: Sequence[str | Path], rows: int = 5) -> pd.DataFrame:
    """The first ``rows`` rows of the dataset's declared feature columns, typed as the signature says."""
    if not files:
        raise ExportError("no dataset file to take an input example from")
    table = pq.ParquetFile(files[0]).read_row_group(0, columns=columns.feature_columns).slice(0, rows)
    return _conform(table.to_pandas(), columns)


def _conform(df: pd.DataFrame, columns: DatasetSchema) -> pd.DataFrame:
    """Cast a raw frame to the signature's types (dense float64, ids int64, lists of int64)."""
    out = {}
    for name in columns.feature_columns:
        if name in columns.dense_columns:
            out[name] = df[name].astype("float64")
        elif name in columns.multi_hot_columns:
            out[name] = [list(map(int, v)) if v is not None else [] for v in df[name]]
        else:
            out[name] = df[name].astype("int64")
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- save, log


def _pip_requirements() -> list[str]:
    reqs = []
    for dist, pin_public in (("torch", True), ("torchrec", False), ("fbgemm-gpu-cpu", False), ("fbgemm-gpu", False),
                             ("mlflow", False), ("pandas", False), ("pyarrow", False), ("numpy", False),
                             ("pydantic", False), ("pyyaml", False)):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        reqs.append(f"{dist}=={version.split('+')[0] if pin_public else version}")
    return reqs


def save_job_model(job: JobConfig, checkpoint_path: str | Path, path: str | Path,
                   example: pd.DataFrame | None = None) -> Path:
    """Write the job's pyfunc model (from its checkpoint) to the new directory ``path``."""
    path = Path(path)
    model = load_unsharded_model(job, checkpoint_path)
    with tempfile.TemporaryDirectory() as tmp:
        weights, config = Path(tmp) / WEIGHTS_FILE, Path(tmp) / CONFIG_FILE
        torch.save(model.state_dict(), weights)
        config.write_text(json.dumps(job.model_dump(mode="json"), indent=2))
        mlflow.pyfunc.save_model(
            path=str(path),
            python_model=DLRMClickModel(),
            artifacts={"weights": str(weights), "job_config": str(config)},
            signature=model_signature(job.data.columns),
            input_example=example,
            pip_requirements=_pip_requirements(),
            metadata={"checkpoint": str(checkpoint_path), "job": job.name},
        )
    return path


def log_job_model(client: Any, run_id: str, job: JobConfig, checkpoint_path: str | Path | None,
                  example_files: Sequence[str | Path] = ()) -> str | None:
    """Export the job's model into its MLflow run under ``model``; returns ``runs:/<run_id>/model``.

    Without a checkpoint on local disk (none reported, or ``train.storage_path`` is a remote URI)
    nothing is exported and a warning says so.
    """
    if not checkpoint_path or not Path(checkpoint_path).is_dir():
        log.warning("no model logged: the last checkpoint (%s) is not a local directory; export it later with "
                    "dlrm_platform.train.export.log_job_model from a copy of it", checkpoint_path)
        return None
    example = input_example(job.data.columns, example_files) if example_files else None
    with tempfile.TemporaryDirectory() as tmp:
        local = save_job_model(job, checkpoint_path, Path(tmp) / MODEL_ARTIFACT_PATH, example)
        client.log_artifacts(run_id, str(local), artifact_path=MODEL_ARTIFACT_PATH)
    uri = f"runs:/{run_id}/{MODEL_ARTIFACT_PATH}"
    log.info("model logged: %s (mlflow.pyfunc.load_model(%r).predict(DataFrame of data.columns))", uri, uri)
    return uri
