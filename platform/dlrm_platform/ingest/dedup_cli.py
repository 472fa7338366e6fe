"""`dlrm-platform dedup-convert CONFIG [OUT_DIR]`: flat row-per-sample Parquet -> session-dedup format."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlrm_platform.errors import UserError

__all__ = ["register"]


def _cmd_dedup_convert(args: argparse.Namespace) -> int:
    from dlrm_platform.config import load_job_config
    from dlrm_platform.ingest.dedup_convert import DEFAULT_ROWS_PER_SHARD, convert_to_dedup, default_dedup_dir
    from dlrm_platform.ingest.source import validate_dataset
    from dlrm_platform.ray_cluster import ray_session

    job = load_job_config(args.config, args.set)
    if not job.data.columns.session_key:
        raise UserError(f"{args.config}: data.columns.session_key is not set: without sessions there is nothing "
                        "to deduplicate")
    files = validate_dataset(job.data)
    out_dir = args.out_dir or default_dedup_dir(job.data.path)
    if args.rows_per_shard is not None and args.rows_per_shard < 1:
        raise UserError("--rows-per-shard must be at least 1")
    with ray_session(job.ray, verbose=args.verbose):
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = args.verbose
        report = convert_to_dedup(
            job.data.columns,
            {job.data.train_split: [str(f) for f in files.train], job.data.eval_split: [str(f) for f in files.eval]},
            out_dir,
            rows_per_shard=args.rows_per_shard or DEFAULT_ROWS_PER_SHARD,
            overwrite=args.overwrite,
            engine=args.engine,
        )
    for split, r in report.splits.items():
        print(f"{split}: {r.samples:,} samples in {r.sessions:,} sessions ({r.samples / max(r.sessions, 1):.2f} "
              f"per session), {r.shards} shard pairs, {r.bytes / 1e6:.2f} MB (flat: {r.source_bytes / 1e6:.2f} MB); "
              f"{r.missing_session_keys} samples without a session key (each its own session), "
              f"{r.split_sessions} sessions split because their user features differed")
    engines = ", ".join(f"{k}: {v}" for k, v in report.engines.items())
    print(f"wrote {out_dir} in {report.seconds:.1f} s ({engines}): {report.storage_ratio:.2f}x smaller than the "
          "flat files")
    if args.report_json:
        args.report_json.parent.mkdir(parents=True, exist_ok=True)
        args.report_json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dedup-convert",
        help="convert a job's flat dataset into the session-deduplicated format (RecD)",
        description="Convert the flat Parquet dataset of CONFIG (data.path) into OUT_DIR: user-side columns once "
        "per session, item-side columns per sample, joined by data.columns.session_key. Runs on Ray Data. "
        "Default OUT_DIR: <data.path>.dedup, the copy `dlrm-platform run` uses when ingest.dedup is on.",
    )
    p.add_argument("config", type=Path, metavar="CONFIG", help="job config YAML, e.g. configs/demo.yaml")
    p.add_argument("out_dir", type=Path, nargs="?", metavar="OUT_DIR", help="default: <data.path>.dedup")
    p.add_argument("--overwrite", action="store_true", help="replace a dedup dataset already in OUT_DIR")
    p.add_argument("--rows-per-shard", type=int, metavar="N", help="samples per shard pair (default 50000)")
    p.add_argument("--engine", choices=["auto", "ray", "local"], default="auto",
                   help="ray: Ray Data job (scales out); local: in this process; auto (default): local up to "
                   "2M rows per split, else ray")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--report-json", type=Path, metavar="PATH", help="also write the conversion report as JSON")
    p.set_defaults(handler=_cmd_dedup_convert)
