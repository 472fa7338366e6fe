"""The main job: `dlrm-platform run CONFIG` (also the entry point of Ray Jobs and the API).

    load config -> check dataset -> MLflow run -> Ray -> pipelines -> Ray Train -> summary

Every step fails early with a message that says what to fix: a bad config or
dataset is reported before Ray starts, and the MLflow run is marked FAILED
(or KILLED on Ctrl-C) when anything after it breaks.

What the terminal shows (:mod:`dlrm_platform.output`): a line as each stage
starts (logger ``dlrm_platform.stage``), a bar per epoch, the tuner's decisions
and the summary; everything else goes to the run's log file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlrm_platform.config import JobConfig, load_job_config
from dlrm_platform.errors import UserError
from dlrm_platform.ingest.feed_report import FeedReport
from dlrm_platform.output.run_log import PROGRESS_LOGGER, STAGE_LOGGER, RunLog, open_run_log, shown_path
from dlrm_platform.paths import enforce_job_paths
from dlrm_platform.ray_cluster import ray_session
from dlrm_platform.redact import redact_text
from dlrm_platform.train.result import CacheStats, EpochRecord

log = logging.getLogger("dlrm_platform.job")
stage = logging.getLogger(STAGE_LOGGER)


@dataclass
class JobSummary:
    """What `run` prints at the end and writes with --summary-json."""

    job: str
    samples_per_s: float
    data_wait_fraction: float
    auc: float
    logloss: float
    steps: int
    samples: int
    train_time_s: float
    wall_time_s: float
    rows_quarantined: int
    mlflow_run_id: str
    mlflow_tracking_uri: str
    checkpoint_path: str | None
    bad_shards: list[str] = field(default_factory=list)  # "path: reason" of shards skipped (data.on_bad_shard)
    pipeline: str = ""
    epochs: list[EpochRecord] = field(default_factory=list)  # per epoch: data wait, first-batch latency, source
    epoch_cache: dict[str, CacheStats] = field(default_factory=dict)  # rank 0's caches, by dataset
    feed: FeedReport | None = None  # the feed service's passes and sharing (ingest/feed_report.py); None: no report
    log_file: str | None = None  # the run's log (`dlrm-platform run`): everything the terminal did not show
    mlflow_run_url: str | None = None  # the run's page when the tracking store is an MLflow server
    tuner: dict[str, Any] = field(default_factory=dict)  # the tuner's account (policy, decisions, final allocation)

    def to_json(self) -> str:
        return json.dumps({
            **asdict(self),
            "epochs": [e.model_dump() for e in self.epochs],
            "epoch_cache": {n: c.model_dump() for n, c in self.epoch_cache.items()},
            "feed": self.feed.model_dump() if self.feed is not None else {},
        }, indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobSummary:
        """What :meth:`to_json` wrote (``--summary-json``), typed again."""
        fields = json.loads(text)
        return cls(**{**fields,
                      "epochs": [EpochRecord.model_validate(e) for e in fields.get("epochs", [])],
                      "epoch_cache": {n: CacheStats.model_validate(c) for n, c in fields.get("epoch_cache", {}).items()},
                      "feed": FeedReport.model_validate(fields["feed"]) if fields.get("feed") else None})

    def render(self) -> str:
        per_epoch = ", ".join(f"{e.data_wait_fraction:.3f}" for e in self.epochs)
        first = ", ".join(f"{e.first_batch_latency_s:.2f}" for e in self.epochs)
        rows = [
            ("training samples/s", f"{self.samples_per_s:,.0f}"),
            ("data-wait fraction", f"{self.data_wait_fraction:.3f}" + (f"  (per epoch: {per_epoch})" if per_epoch else "")),
            ("first batch (s)", first or "-"),
            ("pipeline", self.pipeline or "-"),
            ("tuner", describe_tuner(self.tuner)),
            ("epoch cache", describe_cache(self.epoch_cache, self.epochs)),
            ("feed service", describe_feed(self.feed)),
            ("held-out AUC", f"{self.auc:.4f}"),
            ("held-out logloss", f"{self.logloss:.4f}"),
            ("steps / samples", f"{self.steps:,} / {self.samples:,}"),
            ("rows quarantined", f"{self.rows_quarantined:,}"),
            ("bad shards skipped", f"{len(self.bad_shards)}" + (
                f" ({', '.join(b.split(': ', 1)[0] for b in self.bad_shards[:5])}"
                + (" ..." if len(self.bad_shards) > 5 else "") + ")" if self.bad_shards else "")),
            ("wall time", f"{self.wall_time_s:.1f} s"),
            ("MLflow run", self.mlflow_run_id),
        ] + ([("run log", shown_path(self.log_file))] if self.log_file else [])
        width = max(len(k) for k, _ in rows)
        lines = [f"== {self.job}: done =="] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines.append(f"  open it: {self.mlflow_run_url or open_hint(self.mlflow_tracking_uri)}")
        return "\n".join(lines)


def describe_tuner(tuner: dict[str, Any]) -> str:
    """One line on the tuner: its policy, the moves it made and where it left the pipeline's operators."""
    if not tuner:
        return "-"
    line = f"{tuner.get('policy', '?')}: {_count(int(tuner.get('decisions', 0)), 'decision')}"
    final = tuner.get("final_allocation")
    if final:
        line += ", final tasks " + ", ".join(f"{op} {n}" for op, n in final.items())
    return line


def describe_cache(caches: dict[str, CacheStats], epochs: list[EpochRecord]) -> str:
    """One line on the train epoch cache: its state, size, and which epochs it served."""
    train = caches.get("train")
    if train is None:
        return "-"
    replayed = [str(e.epoch) for e in epochs if e.source == "cache"]
    if train.state == "off":
        return f"off ({train.reason})"
    where = f"{train.batches:,} batches, {train.memory_mb:.1f} MB in memory, {train.disk_mb:.1f} MB on disk"
    return f"{train.state}: {where}" + (f"; epochs {', '.join(replayed)} replayed from it" if replayed else "")


def describe_feed(feed: FeedReport | None) -> str:
    """One line on the first train pass: how long the pipeline took and whether it beat the trainers' start."""
    passes = [p for p in feed.passes if p.name == "train"] if feed is not None else []
    if not passes:
        return "-"
    first = min(passes, key=lambda p: p.epoch)
    ready, asked = first.produced_s, first.first_open_s
    line = f"{len(passes)} train pass(es) run; epoch {first.epoch}: {first.rows:,} batches"
    if ready is not None and asked is not None:
        lead = asked - ready
        line += (f", all produced {lead:.1f} s before the trainers asked" if lead >= 0 else
                 f", trainers asked {-lead:.1f} s before its last batch (first after {first.first_block_s:.1f} s)")
    if first.steps:
        line += f"; equal-sized steps: {first.steps:,} (uneven: {first.uneven_steps})"
    sharing = feed.sharing
    if sharing.served_from_shared_stream:
        line += f"; served from a shared stream, {sharing.cpu_s_saved:.1f} CPU-s of preprocessing saved"
    elif sharing.shared_streams:
        line += f"; its streams shared with other jobs ({sharing.shared_streams})"
    return line


def feed_sharing(feed: FeedReport) -> dict[str, float]:
    """The run's sharing figures (MLflow metrics): whether a shared stream served it, CPU-seconds saved and paid."""
    return {"feed_served_from_shared_stream": float(feed.sharing.served_from_shared_stream),
            "feed_cpu_s_saved": float(feed.sharing.cpu_s_saved),
            "feed_cpu_s_paid": float(feed.sharing.cpu_s_paid)}


def open_hint(tracking_uri: str) -> str:
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri
    return "make ui  (or: dlrm-platform ui), then http://127.0.0.1:5000"


def run_job(job: JobConfig, *, config_source: str | None = None, verbose: bool = False,
            run_log: RunLog | None = None) -> JobSummary:
    """Run ``job`` end to end and return its summary.

    ``run_log`` (the CLI's): progress is drawn on its terminal and the summary names its file;
    without it (tests, notebooks) no progress is shown.
    """
    from mlflow.tracking import MlflowClient

    from dlrm_platform import mlflow_run
    from dlrm_platform.ingest.pipeline import cluster_cpu_budget, execution_options
    from dlrm_platform.ingest.source import validate_dataset
    from dlrm_platform.ingest.transforms import count_quarantined
    from dlrm_platform.train.checkpoint import check_checkpoint_storage, estimate_checkpoint_bytes
    from dlrm_platform.train.trainer import run_training
    from dlrm_platform.tuner.job_pipelines import build_tuned_datasets

    started = time.time()
    enforce_job_paths(job)  # under the job service: every path inside its data/output roots (dlrm_platform.paths)
    files = validate_dataset(job.data)
    stage.info("data checked: %s: %s (%s rows) for training, %s (%s rows) for evaluation", job.data.path,
               _count(len(files.train), "file"), f"{files.train_rows:,}", _count(len(files.eval), "file"),
               f"{files.eval_rows:,}")
    if files.bad_shards:
        log.warning("data.on_bad_shard: skip: training without %d unreadable shard(s): %s", len(files.bad_shards),
                    ", ".join(str(b.path) for b in files.bad_shards))
    # Before Ray or MLflow: checkpoints must be writable where they go, with room for them.
    check_checkpoint_storage(job.train.storage_path or str(job.tracking.runs_dir.resolve() / "ray_results"),
                             need_bytes=estimate_checkpoint_bytes(job))
    if run_log is not None:
        run_log.keep()  # the job passed its checks: from here on it leaves a log file

    tracking_uri = mlflow_run.resolve_tracking_uri(job.tracking)
    run_id = mlflow_run.start_job_run(job, tracking_uri, config_source=config_source, run_id=job.tracking.run_id)
    client = MlflowClient(tracking_uri)
    log.info("MLflow run %s at %s", run_id, redact_text(tracking_uri))
    runs_dir = job.tracking.runs_dir.resolve()
    quarantine_dir = runs_dir / "quarantine" / run_id
    status = "FAILED"
    tracking = _TrackingAtEnd(tracking_uri)
    try:
        with ray_session(job.ray, verbose=verbose):
            _quiet_ray_data(verbose)
            budget = cluster_cpu_budget(job)
            log.info("CPU budget: %s", budget.describe())
            if run_log is not None:
                run_log.advise_when_starved(starved_cpu_advice(job, budget))
            client.log_param(run_id, "cpu_budget", budget.describe())
            result = None
            datasets, tuner_handle = build_tuned_datasets(job, files, quarantine_dir, budget.data, budget.sized_for)
            stage.info("pipeline built: %s; tuner: %s", datasets.describe(), job.tuner.policy)
            try:
                client.log_param(run_id, "pipeline", datasets.describe())
                stage.info("trainers starting: %s x %g CPU%s (%g CPU for data), %s",
                           _count(job.train.num_workers, "worker"), job.train.cpus_per_worker,
                           " + 1 GPU" if job.train.use_gpu else "", budget.data, _count(job.train.epochs, "epoch"))
                with _live_progress(job, run_id, run_log, files.train_rows, tuner_handle):
                    result = run_training(
                        job,
                        datasets.as_dict(),
                        mlflow_run_id=run_id,
                        tracking_uri=tracking_uri,
                        storage_path=job.train.storage_path or str(runs_dir / "ray_results"),
                        execution_options=execution_options(budget),
                        dataset_files=datasets.files,
                        cache_dir=str(job.ingest.cache.spill_dir or runs_dir / "epoch_cache"),
                    )
            finally:
                tuner_account = _tuner_account(tuner_handle)
                if tracking.answers():
                    _log_tuner(tuner_handle, client, run_id, [e.model_dump() for e in result.epochs]
                               if result is not None else None)
        quarantined = count_quarantined(quarantine_dir) if quarantine_dir.exists() else {}
        summary = JobSummary(
            job=job.name,
            samples_per_s=result.samples_per_s,
            data_wait_fraction=result.data_wait_fraction,
            auc=result.auc,
            logloss=result.logloss,
            steps=result.steps,
            samples=result.samples,
            train_time_s=result.train_time_s,
            wall_time_s=time.time() - started,
            rows_quarantined=sum(quarantined.values()),
            mlflow_run_id=run_id,
            mlflow_tracking_uri=tracking_uri,
            checkpoint_path=result.checkpoint_path,
            bad_shards=[b.describe() for b in files.bad_shards],
            pipeline=datasets.describe(),
            epochs=list(result.epochs),
            epoch_cache=dict(result.feed.caches),
            feed=result.feed_service,
            log_file=str(run_log.path) if run_log is not None else None,
            mlflow_run_url=_run_url(tracking_uri, run_id, client) if tracking.answers() else None,
            tuner=tuner_account,
        )
        if not tracking.answers():  # trained and checkpointed: the job succeeded, its MLflow record is short
            stage.warning("MLflow at %s did not answer within %.0f s: the run's summary metrics, tuner decisions and "
                          "model are not in MLflow run %s (the summary is below and in the run log; the model's "
                          "checkpoint is %s)", redact_text(tracking_uri), _TrackingAtEnd.WAIT_S, run_id,
                          summary.checkpoint_path)
            status = "FINISHED"
            return summary
        _log_summary(client, run_id, summary, quarantined)
        if job.tracking.log_model:  # the pyfunc model a user loads for inference (train/export.py)
            from dlrm_platform.train.export import log_job_model

            stage.info("model export: the last checkpoint as an MLflow pyfunc model")
            log_job_model(client, run_id, job, summary.checkpoint_path, example_files=files.eval or files.train)
        status = "FINISHED"
        return summary
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if tracking.answers():
            client.set_terminated(run_id, status=status)


class _TrackingAtEnd:
    """Whether the MLflow server answers when the job's results are due, asked once (waiting up to ``WAIT_S``).

    Training does not need the server (its workers buffer through an outage,
    ``train/mlflow_logger.py``); the driver's last writes do. A server that stays
    away costs the job its MLflow record, not its result.
    """

    WAIT_S = 120.0

    def __init__(self, tracking_uri: str) -> None:
        self._uri = tracking_uri
        self._answers: bool | None = None

    def answers(self) -> bool:
        from dlrm_platform import mlflow_run

        if self._answers is None:
            self._answers = mlflow_run.server_answers(self._uri)
            if not self._answers:
                stage.warning("MLflow at %s is not answering; waiting up to %.0f s to log the run's results",
                              redact_text(self._uri), self.WAIT_S)
                self._answers = mlflow_run.wait_for_server(self._uri, self.WAIT_S)
        return self._answers


def starved_cpu_advice(job: JobConfig, budget: Any) -> str:
    """What to do when Ray Data cannot get CPUs (shown once on the terminal): the job's demand and the cluster's CPUs."""
    workers = job.train.num_workers
    return (f"the job asks {budget.train + budget.data:g} CPUs ({_count(workers, 'trainer')} x "
            f"{job.train.cpus_per_worker:g} CPU, {budget.data:g} for data), the cluster has {budget.total:g} and "
            "other work may hold some; lower train.num_workers or train.cpus_per_worker (fractions are fine) or "
            "ingest.data_cpus, or add nodes")


def _run_url(tracking_uri: str, run_id: str, client: Any) -> str | None:
    from dlrm_platform import mlflow_run

    url = mlflow_run.run_url(tracking_uri, run_id, client.get_run(run_id).info.experiment_id)
    return redact_text(url) if url else None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _live_progress(job: JobConfig, run_id: str, run_log: RunLog | None, train_rows: int,
                   tuner_handle: Any) -> contextlib.AbstractContextManager:
    """Rank 0's progress drawn on the run's terminal (a bar, or plain lines when it is not a TTY)."""
    from dlrm_platform.output.progress import live_progress
    from dlrm_platform.output.progress_view import make_view

    view = None
    if run_log is not None:
        view = make_view(run_log.terminal, logging.getLogger(PROGRESS_LOGGER).info)
    expected = train_rows
    if job.train.max_steps_per_epoch is not None:
        expected = min(expected, job.train.max_steps_per_epoch * job.ingest.batch_size * job.train.num_workers)
    # Decisions are printed as the tuner makes them; `static` makes none and `ray_default` only observes.
    shows_decisions = tuner_handle is not None and job.tuner.policy not in ("static", "ray_default")
    return live_progress(run_id, view, expected_samples=expected, tuner=tuner_handle if shows_decisions else None)


def _tuner_account(handle) -> dict[str, Any]:
    """The tuner's summary for the job's (policy, ticks, decisions, final allocation), before the handle closes."""
    if handle is None:
        return {}
    try:
        keep = ("policy", "ticks", "decisions", "final_allocation", "steady_samples_per_s", "held")
        return {k: v for k, v in handle.summary().items() if k in keep}
    except Exception as err:  # noqa: BLE001 - the account is telemetry, the run's result is not at stake
        log.warning("could not read the tuner's summary: %s", err)
        return {}


def _log_tuner(handle, client, run_id: str, epochs: list[dict] | None = None) -> None:
    """Tuner decisions, bottleneck report and throughput over time into the run (metrics, plot, report)."""
    if handle is None:
        return
    try:
        handle.log_to_mlflow(client, run_id, epochs=epochs)
        client.log_dict(run_id, handle.summary(), "tuner_summary.json")
    except Exception as err:  # telemetry must not fail a finished training run
        log.warning("could not log the tuner's history to MLflow: %s", err)
    finally:
        handle.close()


def _quiet_ray_data(verbose: bool) -> None:
    """Ray Data's per-operator progress logs drown the training progress lines on a terminal."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = verbose
    ctx.print_on_execution_start = verbose


def _log_summary(client, run_id: str, summary: JobSummary, quarantined: dict[str, int]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = {
        "final_samples_per_s": summary.samples_per_s,
        "final_data_wait_fraction": summary.data_wait_fraction,
        "auc": summary.auc,
        "logloss": summary.logloss,
        "rows_quarantined": float(summary.rows_quarantined),
        "bad_shards_skipped": float(len(summary.bad_shards)),
        "wall_time_s": summary.wall_time_s,
        **{f"epoch_{e.epoch}_data_wait_fraction": e.data_wait_fraction for e in summary.epochs},
        **{f"epoch_{e.epoch}_first_batch_latency_s": e.first_batch_latency_s for e in summary.epochs},
        **(feed_sharing(summary.feed) if summary.feed is not None else {}),
    }
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    client.log_dict(run_id, json.loads(summary.to_json()), "summary.json")
    client.set_tag(run_id, "epoch_cache", describe_cache(summary.epoch_cache, summary.epochs)[:5000])
    client.set_tag(run_id, "feed_service", describe_feed(summary.feed)[:5000])
    if summary.feed is not None:
        client.set_tag(run_id, "feed_shared_stream", "yes" if summary.feed.sharing.served_from_shared_stream else "no")
        client.log_dict(run_id, summary.feed.model_dump(), "feed_service.json")
    if quarantined:
        client.log_dict(run_id, quarantined, "quarantine_counts.json")


# --------------------------------------------------------------------------- CLI


def _cmd_run(args: argparse.Namespace) -> int:
    job = load_job_config(args.config, args.set)
    print(f"== {job.name}: {args.config} ==", flush=True)
    with open_run_log(job.name, job.tracking.runs_dir, verbose=args.verbose) as run_log:
        try:
            summary = run_job(job, config_source=str(args.config), verbose=args.verbose, run_log=run_log)
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as err:  # the message once, with the worker's traceback when a worker failed
            log.info("the job failed; the driver's traceback:", exc_info=True)
            log.error("the job failed: %s: %s", type(err).__name__, err)
            if run_log.started:
                stage.info("job failed; the run log has everything: %s", shown_path(run_log.path))
            return 1
    print(summary.render(), flush=True)
    if args.summary_json:
        path = Path(args.summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary.to_json())
        print(f"  summary written to {path}")
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from dlrm_platform import mlflow_run
    from dlrm_platform.config import TrackingConfig

    cfg = load_job_config(args.config).tracking if args.config else TrackingConfig()
    cmd = mlflow_run.ui_command(cfg, port=args.port)
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    if mlflow_bin.exists():
        cmd[0] = str(mlflow_bin)
    elif shutil.which("mlflow") is None:
        raise UserError("mlflow is not installed in this environment; run `make install`")
    print("serving", redact_text(mlflow_run.resolve_tracking_uri(cfg)), f"at http://127.0.0.1:{args.port}", flush=True)
    return subprocess.call(cmd)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a training job end to end", description=run_job.__doc__)
    p.add_argument("config", type=Path, help="job config YAML, e.g. configs/demo.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set train.epochs=3 (repeatable)")
    p.add_argument("--summary-json", type=Path, help="also write the summary as JSON here")
    p.set_defaults(handler=_cmd_run)

    p = sub.add_parser("ui", help="open the MLflow UI on the runs of a config (default: the embedded store)")
    p.add_argument("config", type=Path, nargs="?", help="job config whose tracking store to serve")
    p.add_argument("--port", type=int, default=5000)
    p.set_defaults(handler=_cmd_ui)
