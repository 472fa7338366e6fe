"""Placement on a multi-node local cluster (``ray.cluster_utils.Cluster``): data tasks only on data nodes,
trainers only on trainer nodes, Ray Data's CPU budget = the data nodes' CPUs (``ray.placement``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrm_platform.config import load_job_config
from dlrm_platform.errors import UserError
from dlrm_platform.ingest.pipeline import cpu_budget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head node for the trainers (and the driver's actors) and one data node.

    The head has a CPU to spare beside the trainer's: unplaced data tasks would run there (Ray prefers
    the driver's node), so only the placement keeps them on the data node.
    """
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"trainer": 1}, "include_dashboard": True})
    data_node = cluster.add_node(num_cpus=1, resources={"data_worker": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield cluster, data_node
    ray.shutdown()
    cluster.shutdown()


def _job(root: Path, *overrides: str):
    return load_job_config(REPO / "configs" / "demo.yaml", [
        f"data.path={root / 'demo'}", "data.synthetic.num_sessions=400", "data.synthetic.rows_per_shard=1200",
        f"tracking.runs_dir={root / 'runs'}", "train.epochs=1", "ingest.batch_size=128",
        "tracking.log_model=false", *overrides,
    ])


def test_budget_is_the_data_nodes_cpus_and_a_missing_resource_is_named(two_node_cluster, tmp_path):
    import ray

    placed = _job(tmp_path, "ray.placement.data_resource=data_worker", "ray.placement.trainer_resource=trainer")
    budget = cpu_budget(placed, float(ray.cluster_resources()["CPU"]), ray.nodes())
    assert (budget.total, budget.train, budget.data) == (3.0, 1.0, 1.0)  # not 3 - 1: the data node's only
    # Trainers free to land on the data node: their CPUs come off the data budget.
    shared = _job(tmp_path, "ray.placement.data_resource=data_worker", "train.cpus_per_worker=0.5")
    assert cpu_budget(shared, 3.0, ray.nodes()).data == 0.5
    with pytest.raises(UserError, match="no alive Ray node offers the resource 'gpu_data'"):
        cpu_budget(_job(tmp_path, "ray.placement.data_resource=gpu_data"), 3.0, ray.nodes())


def test_job_runs_data_tasks_on_data_nodes_and_trainers_on_trainer_nodes(two_node_cluster, tmp_path):
    from ray.util.state import list_actors, list_tasks

    from dlrm_platform.ingest.source import validate_dataset
    from dlrm_platform.ingest.synthetic_data import generate_dataset
    from dlrm_platform.job import run_job

    cluster, data_node = two_node_cluster
    job = _job(tmp_path, "ray.placement.data_resource=data_worker", "ray.placement.trainer_resource=trainer")
    generate_dataset(job.data, overwrite=True, progress=False)
    summary = run_job(job)
    assert summary.samples == validate_dataset(job.data).train_rows  # every sample once, across nodes

    # The state API told which cluster to ask: it would otherwise ask the machine's latest one.
    trainers = list_actors(address=cluster.address, filters=[("class_name", "=", "RayTrainWorker")], limit=100)
    assert trainers and {a.node_id for a in trainers} == {cluster.head_node.node_id}
    data_tasks = [t for t in list_tasks(address=cluster.address, limit=10_000, detail=True)
                  if t.name.startswith(("ReadFused", "ReadSession", "ReadParquet", "MapBatches"))]
    assert data_tasks, "no Ray Data task found in the state API"
    assert {t.node_id for t in data_tasks if t.node_id} == {data_node.node_id}
