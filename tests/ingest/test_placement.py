"""``ray.placement``: the config, the remote args every data task gets, and the data nodes' CPU budget (no Ray)."""

from __future__ import annotations

import pytest

from dlrm_platform.config import ConfigError, JobConfig, load_job_config
from dlrm_platform.errors import UserError
from dlrm_platform.ingest.pipeline import RESOURCE_SLIVER, cpu_budget, data_remote_args, placed_data_cpus
from dlrm_platform.train.trainer import trainer_resources


def _job(**placement) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"path": "/tmp/x", "columns": {"label": "label", "item": {"dense": ["d"], "categorical": ["c"]}}},
        "train": {"num_workers": 2, "cpus_per_worker": 1.0},
        "ray": {"placement": placement},
    })


NODES = [
    {"Alive": True, "Resources": {"CPU": 8.0, "trainer": 1.0, "GPU": 1.0}},
    {"Alive": True, "Resources": {"CPU": 16.0, "data_worker": 16.0}},
    {"Alive": True, "Resources": {"CPU": 16.0, "data_worker": 16.0}},
    {"Alive": False, "Resources": {"CPU": 16.0, "data_worker": 16.0}},  # a dead node counts for nothing
]


def test_unplaced_jobs_run_anywhere_with_the_budget_split():
    job = _job()
    assert data_remote_args(job) == {} and trainer_resources(job) == {}
    assert placed_data_cpus(job, NODES) is None
    assert cpu_budget(job, 4.0, NODES).data == 2.0  # today's behaviour: the cluster minus the trainers


def test_placed_jobs_ask_a_sliver_of_their_node_groups_resources():
    job = _job(data_resource="data_worker", trainer_resource="trainer")
    assert data_remote_args(job) == {"resources": {"data_worker": RESOURCE_SLIVER}}
    assert trainer_resources(job) == {"trainer": RESOURCE_SLIVER}
    budget = cpu_budget(job, 56.0, NODES)
    assert (budget.train, budget.data) == (2.0, 32.0)  # the two alive data nodes, trainers elsewhere


def test_trainers_that_may_share_the_data_nodes_come_off_their_budget():
    assert placed_data_cpus(_job(data_resource="data_worker"), NODES) == 30.0


def test_no_node_with_the_data_resource_says_how_to_start_one():
    with pytest.raises(UserError, match=r"ray start --resources='\{\"data_nodes\": 1\}'"):
        cpu_budget(_job(data_resource="data_nodes"), 56.0, NODES)


def test_placement_resources_must_differ_and_be_named(tmp_path):
    with pytest.raises(Exception, match="must name different resources"):
        _job(data_resource="x", trainer_resource="x")
    config = tmp_path / "job.yaml"
    config.write_text("data: {path: /tmp/x, columns: {item: {dense: [d]}}}\nray: {placement: {data_nodes: cpu}}\n")
    with pytest.raises(ConfigError, match="ray.placement.data_nodes"):
        load_job_config(config, [])


def test_an_elastic_pipeline_is_sized_for_data_nodes_that_join_later():
    from dlrm_platform.ingest.pipeline import ELASTIC_HEADROOM, fused_operator

    job = _job(data_resource="data_worker", trainer_resource="trainer")
    budget = cpu_budget(job, 56.0, NODES)
    assert budget.elastic and budget.sized_for == ELASTIC_HEADROOM * 32.0
    assert "elastic" in budget.describe()
    # the fused operator's task pool holds the ceiling's tasks, at the start's CPUs per task
    now, later = fused_operator(job.ingest, budget.data), fused_operator(job.ingest, budget.data, budget.sized_for)
    assert later.num_cpus == now.num_cpus == 1.0 and later.concurrency == 4 * now.concurrency == 128
    # a configured ceiling wins; a fixed ingest.data_cpus is not elastic and is sized for itself
    capped = _job(data_resource="data_worker", trainer_resource="trainer", max_data_cpus=48)
    assert cpu_budget(capped, 56.0, NODES).sized_for == 48.0
    fixed = job.model_copy(update={"ingest": job.ingest.model_copy(update={"data_cpus": 8.0})})
    assert not cpu_budget(fixed, 56.0, NODES).elastic and cpu_budget(fixed, 56.0, NODES).sized_for == 8.0
    assert cpu_budget(_job(), 4.0, NODES).sized_for == 2.0  # one machine: as before


def test_max_data_cpus_must_be_positive():
    with pytest.raises(Exception, match="max_data_cpus"):
        _job(data_resource="data_worker", max_data_cpus=0)


@pytest.mark.parametrize(("data_cpus", "read_tasks", "expected"), [
    (1.0, 3, (3, 0.333)),  # the demo's 3 shard pairs: one wave of 3, not 2 + 1
    (1.0, 4, (4, 0.25)),
    (1.0, 5, (2, 0.5)),  # three waves or more: the tail matters less than thinner tasks' overheads
    (1.0, 2, (2, 0.5)), (1.0, 1, (2, 0.5)), (None, 3, (2, 0.5)),
    (8.0, 12, (12, 0.666)),
])
def test_the_fused_tasks_run_an_epochs_read_tasks_in_one_wave_where_two_would_leave_cpus_idle(
        data_cpus, read_tasks, expected):
    from dlrm_platform.config import IngestConfig
    from dlrm_platform.ingest.pipeline import fused_operator

    op = fused_operator(IngestConfig(), data_cpus or 1.0, None, read_tasks if data_cpus else None)
    assert (op.concurrency, op.num_cpus) == expected
    assert op.concurrency * op.num_cpus <= (data_cpus or 1.0)  # every task of the wave fits the budget at once
    # an elastic budget keeps its pool sized for the nodes to come; a configured ingest.fused stands
    assert fused_operator(IngestConfig(), 1.0, 4.0, read_tasks).concurrency == 8
    assert fused_operator(IngestConfig(fused={"concurrency": 1, "num_cpus": 1.0}), 1.0, None, read_tasks).concurrency == 1


def test_train_read_tasks_counts_files_row_group_ranges(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrm_platform.ingest import fused

    paths = []
    for i, groups in enumerate((1, 3)):
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.table({"x": list(range(30 * groups))}), path, row_group_size=30)
        paths.append(str(path))
    assert fused.count_read_tasks(paths) == 2  # row groups of a small file stay in one task
    monkeypatch.setattr(fused, "_MAX_ROWS_PER_TASK", 30)
    assert fused.count_read_tasks(paths) == 4  # as FusedParquetDatasource cuts them: 1 + 3 ranges
    assert len(fused.FusedParquetDatasource(paths, spec=None, batch_size=8, block_rows=8).get_read_tasks(1)) == 4


def test_the_read_tasks_are_counted_only_where_the_one_wave_rule_applies():
    """Counting locates the dedup copy or reads every Parquet footer: not for a rule that would ignore it."""
    from dlrm_platform.config import IngestConfig
    from dlrm_platform.ingest.pipeline import fused_operator

    asked: list[int] = []

    def count() -> int:
        asked.append(1)
        return 3

    assert fused_operator(IngestConfig(), 1.0, 4.0, count).concurrency == 8  # elastic: sized for the nodes to come
    assert fused_operator(IngestConfig(fused={"concurrency": 1, "num_cpus": 1.0}), 1.0, None, count).concurrency == 1
    assert not asked
    assert (fused_operator(IngestConfig(), 1.0, None, count).concurrency, len(asked)) == (3, 1)
