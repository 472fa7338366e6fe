"""What reaches the terminal during a run, and what only the run's log file gets."""

from __future__ import annotations

import io
import logging
import warnings

from dlrm_platform.output.run_log import STAGE_LOGGER, open_run_log, shown_on_terminal
from dlrm_platform.output.terminal import Terminal


def _record(name: str, level: int, origin: str | None = None) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, "m", None, None)
    if origin is not None:
        record.origin = origin
    return record


def test_terminal_filter():
    assert shown_on_terminal(_record(STAGE_LOGGER, logging.INFO))
    assert shown_on_terminal(_record("dlrm_platform.job", logging.WARNING))
    assert shown_on_terminal(_record("workers", logging.WARNING, origin="dlrm_platform.train.feed"))
    assert shown_on_terminal(_record("fbgemm_gpu", logging.ERROR))
    assert not shown_on_terminal(_record("dlrm_platform.job", logging.INFO))
    assert not shown_on_terminal(_record("ray", logging.WARNING))  # e.g. the auth-token notice
    assert not shown_on_terminal(_record("workers", logging.WARNING, origin=""))
    assert not shown_on_terminal(_record("dlrm_platformx", logging.WARNING))
    assert shown_on_terminal(_record("root", logging.INFO), verbose=True)


def test_run_log_routes_and_restores(tmp_path):
    import mlflow  # noqa: F401 - these configure their loggers at import: before the comparison below
    import ray  # noqa: F401
    import ray.data  # noqa: F401

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    before = (root.handlers[:], root.level, logging.getLogger("ray").handlers[:])
    with open_run_log("my job", tmp_path / "runs", terminal=Terminal(out, err)) as run_log:
        logging.getLogger(STAGE_LOGGER).info("data checked: %d files", 4)
        assert not (tmp_path / "runs").exists()  # nothing on disk before the job passed its checks
        run_log.keep()
        logging.getLogger("fbgemm_gpu").info("[TBE=abc] config")
        logging.getLogger("ray.some_module").warning("Token authentication is enabled")
        logging.getLogger("dlrm_platform.ingest").warning("skipping 1 shard")
        logging.getLogger("some.library").error("it broke")
        warnings.warn("is_fx_tracing will return true", UserWarning, stacklevel=1)
    assert run_log.path.parent == (tmp_path / "runs" / "logs").resolve() and run_log.path.name.startswith("my_job-")
    assert out.getvalue().splitlines() == ["data checked: 4 files",
                                           f"run log: {run_log.path}  (everything not shown here; -v shows it)"]
    assert err.getvalue() == "WARNING dlrm_platform.ingest: skipping 1 shard\nERROR some.library: it broke\n"
    text = run_log.path.read_text()
    for marker in ("data checked", "[TBE=abc]", "Token authentication", "skipping 1 shard", "it broke", "is_fx_tracing"):
        assert marker in text
    assert (root.handlers, root.level, logging.getLogger("ray").handlers) == before


def test_a_run_refused_up_front_leaves_no_file(tmp_path):
    with open_run_log("job", tmp_path / "runs", terminal=Terminal(io.StringIO(), io.StringIO())) as run_log:
        logging.getLogger("dlrm_platform.job").info("checking the dataset")
    assert not run_log.started and not (tmp_path / "runs").exists()


def test_starved_cpus_get_one_line_on_the_terminal_saying_what_to_do(tmp_path):
    """Ray Data's "Cluster resources are not enough" stays in the file; the terminal gets one actionable line."""
    out, err = io.StringIO(), io.StringIO()
    starved = ("Cluster resources are not enough to run any task from MapBatches(parse). "
               "The job may hang forever unless the cluster scales up.")
    with open_run_log("job", tmp_path / "runs", terminal=Terminal(out, err)) as run_log:
        run_log.keep()
        run_log.advise_when_starved("the job asks 3 CPUs (2 trainers x 1 CPU, 1 for data), the cluster has 2; "
                                    "lower train.cpus_per_worker, or add nodes")
        logging.getLogger("ray.data._internal.execution.resource_manager").warning(starved)
        # the same, forwarded from the feed service actor, and a later execution's
        logging.getLogger("workers").warning("(FeedService pid=7) 2026-11-23 08:00:00,000\tWARNING "
                                             "resource_manager.py:818 -- %s", starved, extra={"origin": ""})
        logging.getLogger("ray.data").warning(starved)
    lines = err.getvalue().splitlines()
    assert lines == ["WARNING the data pipeline is waiting for CPUs it cannot get: the job asks 3 CPUs (2 trainers x "
                     "1 CPU, 1 for data), the cluster has 2; lower train.cpus_per_worker, or add nodes"]
    assert "Cluster resources" not in out.getvalue()
    assert run_log.path.read_text().count("Cluster resources are not enough") == 3


def test_the_starved_cpu_line_without_the_jobs_figures_still_says_what_to_do(tmp_path):
    err = io.StringIO()
    with open_run_log("job", tmp_path / "runs", terminal=Terminal(io.StringIO(), err)):
        logging.getLogger("ray.data").warning("Dataset execution made no progress for at least 600s ...")
    assert err.getvalue().count("\n") == 1 and "lower train.num_workers or train.cpus_per_worker" in err.getvalue()


def test_starved_cpu_advice_names_the_jobs_demand_and_the_cluster():
    from dlrm_platform.config import JobConfig
    from dlrm_platform.ingest.pipeline import CpuBudget
    from dlrm_platform.job import starved_cpu_advice

    job = JobConfig.model_validate({
        "data": {"path": "/d", "columns": {"user": {"dense": ["a"], "categorical": ["b"]}}},
        "train": {"num_workers": 2, "cpus_per_worker": 0.5},
    })
    advice = starved_cpu_advice(job, CpuBudget(total=2.0, train=1.0, data=1.0))
    assert advice.startswith("the job asks 2 CPUs (2 trainers x 0.5 CPU, 1 for data), the cluster has 2")
    assert "train.cpus_per_worker" in advice and "add nodes" in advice
