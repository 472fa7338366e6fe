"""The model a job logs: loaded back with the MLflow client, it scores raw rows to the job's own AUC."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dlrm_platform.config import load_job_config
from dlrm_platform.ingest.source import list_split_files
from dlrm_platform.ingest.synthetic_data import generate_dataset
from dlrm_platform.job import run_job
from dlrm_platform.train.export import OUTPUT_COLUMN
from dlrm_platform.train.eval_metrics import auc


pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    job = load_job_config(REPO / "configs" / "demo.yaml", [
        f"data.path={root / 'data'}", "data.synthetic.num_sessions=1200", "data.synthetic.rows_per_shard=4000",
    ])
    generate_dataset(job.data, progress=False)
    return root


@pytest.fixture
def tracking_uri_restored(monkeypatch):
    """mlflow.set_tracking_uri sets a module global and $MLFLOW_TRACKING_URI (which the next job would
    follow): both go back to what they were after the test."""
    from mlflow.tracking._tracking_service import utils

    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield


@pytest.mark.parametrize("variant", [
    # RecD job (session data): the dedup DLRM trains, the plain DLRM is exported.
    ["train.num_workers=1"],
    # Plain job on two workers: tables sharded table-wise across ranks, read back whole.
    ["ingest.dedup=false", "train.num_workers=2", "train.cpus_per_worker=0.5"],
], ids=["dedup-1-worker", "plain-2-workers"])
def test_logged_model_scores_the_eval_split_to_the_jobs_auc(ray_cluster, data_root, variant, tmp_path,
                                                           tracking_uri_restored):
    job = load_job_config(REPO / "configs" / "demo.yaml", [
        f"data.path={data_root / 'data'}", f"tracking.runs_dir={tmp_path / 'runs'}",
        "ingest.batch_size=256", "train.epochs=1", "train.precision=fp32", *variant,
    ])
    summary = run_job(job)
    assert 0.5 < summary.auc <= 1.0
    assert summary.mlflow_tracking_uri == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"

    mlflow.set_tracking_uri(summary.mlflow_tracking_uri)
    model = mlflow.pyfunc.load_model(f"runs:/{summary.mlflow_run_id}/model")
    cols = job.data.columns
    inputs = model.metadata.get_input_schema()
    assert inputs.input_names() == cols.feature_columns  # the declared columns, no label or session key
    assert model.metadata.get_output_schema().input_names() == [OUTPUT_COLUMN]
    local = MlflowClient(summary.mlflow_tracking_uri).download_artifacts(summary.mlflow_run_id, "model")
    example = mlflow.models.Model.load(local).load_input_example(local)
    assert list(example.columns) == cols.feature_columns and len(example) > 0

    # The eval split as a user would read it: raw Parquet, every column of the files.
    eval_df = pd.concat([pq.read_table(f).to_pandas() for f in list_split_files(job.data, "eval")],
                        ignore_index=True)
    scored = model.predict(eval_df)
    probs = scored[OUTPUT_COLUMN].to_numpy()
    assert probs.shape == (len(eval_df),) and np.all((probs > 0) & (probs < 1))
    assert auc(probs, eval_df[cols.label].to_numpy()) == pytest.approx(summary.auc, abs=1e-4)

    # Label and session key are not inputs: without them the scores are the same.
    alone = model.predict(eval_df[cols.feature_columns].head(100))[OUTPUT_COLUMN].to_numpy()
    np.testing.assert_allclose(alone, probs[:100], rtol=1e-6)
    # A declared column missing is refused by name, before the model runs.
    with pytest.raises(MlflowException, match=cols.item.categorical[0]):
        model.predict(eval_df.drop(columns=[cols.item.categorical[0]]))
