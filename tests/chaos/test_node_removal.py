"""A node of a multi-node local cluster removed mid-run: the job completes, every sample once per epoch."""

from __future__ import annotations

import os

import pytest

import scenarios

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
SEEDS = [int(s) for s in os.environ.get("DLRM_CHAOS_SEEDS", "7").split(",")]


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and one more node, 2 CPUs each: data tasks and trainers spread over both."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    yield cluster, ray
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize("seed", SEEDS)
def test_removed_node_mid_run_loses_no_sample(two_node_cluster, tmp_path, seed):
    cluster, ray = two_node_cluster
    cluster.add_node(num_cpus=2)  # one per test: the test removes it
    cluster.wait_for_nodes()
    if not ray.is_initialized():
        ray.init(address=cluster.address, logging_level="WARNING")
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    out = scenarios.node_removal(cluster, tmp_path, seed)
    assert out.faults_injected == 1, out  # the node went while the job ran
    assert out.completed and not out.crashed, out.error
    assert (out.samples_lost, out.samples_duplicated) == (0, 0), out.details
