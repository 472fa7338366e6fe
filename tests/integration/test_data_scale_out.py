"""Scale-out on a multi-node local cluster (``ray.cluster_utils.Cluster``): a data node added while a job's
pass streams gets work at once (Ray Data's CPU limit follows the data nodes: ``execution_options`` of an
elastic ``cpu_budget``), and removing a data node mid-pass loses no samples."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dlrm_platform.config import load_job_config
from dlrm_platform.ingest.feed_client import FeedClient, start_feed_service
from dlrm_platform.ingest.pipeline import cluster_cpu_budget, data_remote_args, execution_options

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BLOCKS = 24


@pytest.fixture(scope="module")
def data_cluster():
    """A head node with no CPUs (the driver and the feed service) and one data node of 1 CPU."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=1, resources={"data": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _pipeline(latency_s: float):
    import ray

    def read(batch: dict, latency_s: float) -> pa.Table:
        """A read that waits on (simulated) storage; each row says which block it is and which node read it.
        (Nested: Ray pickles it by value, the workers cannot import this test module.)"""
        time.sleep(latency_s)
        return pa.table({"block": np.asarray(batch["block"]),
                         "node": [ray.get_runtime_context().get_node_id()] * len(batch["block"])})

    job = load_job_config(REPO / "configs" / "demo.yaml",
                          ["ray.placement.data_resource=data", "ray.placement.trainer_resource=trainer"])
    budget = cluster_cpu_budget(job)
    ds = ray.data.from_items([{"block": i} for i in range(BLOCKS)], override_num_blocks=BLOCKS)
    ds = ds.map_batches(read, fn_kwargs={"latency_s": latency_s}, batch_size=None, batch_format="numpy",
                        num_cpus=1, max_retries=3, **data_remote_args(job))
    ds.context.execution_options = execution_options(budget)
    return ds, budget


def test_a_data_node_added_mid_run_gets_work(data_cluster):
    ds, budget = _pipeline(latency_s=0.4)
    assert budget.elastic and budget.data == 1.0
    service = start_feed_service({"train": ds}, consumers=1, ahead=[])
    nodes, blocks, added = [], [], None
    try:
        for row in FeedClient(service, "train", 0).iter_pass(0):
            blocks.append(row.column("block")[0].as_py())
            nodes.append(row.column("node")[0].as_py())
            if len(blocks) == 3 and added is None:  # the pass is streaming on one node: add a second
                added = data_cluster.add_node(num_cpus=1, resources={"data": 1})
                data_cluster.wait_for_nodes()
    finally:
        import ray

        ray.kill(service)
    assert sorted(blocks) == list(range(BLOCKS))
    assert nodes.count(added.node_id) >= 3, f"the node added mid-run read {nodes.count(added.node_id)} blocks"


def test_removing_a_data_node_mid_run_loses_no_samples(data_cluster):
    import ray

    extra = data_cluster.add_node(num_cpus=1, resources={"data": 1})
    data_cluster.wait_for_nodes()
    ds, _ = _pipeline(latency_s=0.3)
    service = start_feed_service({"train": ds}, consumers=1, ahead=[])
    blocks, removed = [], False
    try:
        for row in FeedClient(service, "train", 0).iter_pass(0):
            blocks.append(row.column("block")[0].as_py())
            if len(blocks) == 4 and not removed:
                data_cluster.remove_node(extra)
                removed = True
    finally:
        ray.kill(service)
    assert sorted(blocks) == list(range(BLOCKS))  # every block once: lost tasks and objects are re-run
