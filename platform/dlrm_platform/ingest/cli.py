"""`dlrm-platform gen-data` and `dlrm-platform convert-criteo`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dlrm_platform.errors import UserError

__all__ = ["register"]


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _cmd_gen_data(args: argparse.Namespace) -> int:
    from dlrm_platform.config import load_job_config
    from dlrm_platform.ingest.layout import is_complete
    from dlrm_platform.ingest.synthetic_data import check_declared_columns, generate_dataset

    data = load_job_config(args.config, args.set).data
    if data.synthetic is None:
        raise UserError(f"{args.config}: data.synthetic is not set, so there is nothing to generate")
    check_declared_columns(data.columns, data.synthetic)  # before --if-missing: a stale config is still wrong
    if args.if_missing and is_complete(data.path):
        print(f"{data.path} already holds a complete dataset; nothing to do (--overwrite regenerates it)")
        return 0
    report = generate_dataset(data, overwrite=args.overwrite, progress=not args.quiet)
    total = report.train_rows + report.eval_rows
    print(
        f"wrote {report.num_sessions} sessions, {total} rows ({report.train_rows} train, {report.eval_rows} eval, "
        f"click rate {report.positive_rate:.3f}) to {report.path}: {len(report.files)} files, "
        f"{_megabytes(report.bytes)}, {report.seconds:.1f} s ({total / max(report.seconds, 1e-9):,.0f} rows/s)"
    )
    if args.report_json:
        args.report_json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


def _cmd_convert_criteo(args: argparse.Namespace) -> int:
    from dlrm_platform.ingest.criteo import convert_criteo

    report = convert_criteo(
        args.input,
        args.output_dir,
        eval_fraction=args.eval_fraction,
        rows_per_shard=args.rows_per_shard,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    if args.report_json:
        args.report_json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    print(
        f"converted {report.rows_converted} rows ({report.train_rows} train, {report.eval_rows} eval), "
        f"quarantined {report.rows_quarantined} of {report.rows_read} lines in {report.seconds:.1f} s "
        f"({report.rows_per_s:,.0f} lines/s) -> {report.output_dir}"
    )
    if report.rows_quarantined:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in report.quarantine_reasons.items())
        print(f"quarantined lines ({reasons}) are in {report.quarantine_path}")
    if report.rows_converted == 0:
        raise UserError(f"no valid row in {args.input}: is it a Criteo TSV (label, 13 integers, 26 hex ids)?")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gen-data",
        help="generate the synthetic session dataset a job config describes",
        description="Generate data.synthetic of CONFIG into data.path (train/, eval/, schema.yaml, _SUCCESS).",
    )
    p.add_argument("config", type=Path, metavar="CONFIG", help="job config YAML, e.g. configs/demo.yaml")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--if-missing", action="store_true", help="do nothing when the dataset is already complete")
    mode.add_argument("--overwrite", action="store_true", help="replace a complete dataset")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field, e.g. --set data.synthetic.num_sessions=1000 (repeatable)",
    )
    p.add_argument("--report-json", type=Path, metavar="PATH", help="also write the generation report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_gen_data)

    p = subparsers.add_parser(
        "convert-criteo",
        help="convert a Criteo TSV (plain or .gz) into a Parquet dataset",
        description="Convert INPUT (Criteo TSV: label, 13 integer, 26 hex fields; plain or gzip) into OUTPUT_DIR. "
        "Malformed lines are quarantined to OUTPUT_DIR/quarantine.jsonl with their line number and reason.",
    )
    p.add_argument("input", type=Path, metavar="INPUT")
    p.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR")
    p.add_argument("--eval-fraction", type=float, default=0.1, metavar="F", help="share of rows for eval (default 0.1)")
    p.add_argument("--rows-per-shard", type=int, default=1_000_000, metavar="N")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/eval assignment")
    p.add_argument("--overwrite", action="store_true", help="replace a complete dataset in OUTPUT_DIR")
    p.add_argument("--report-json", type=Path, metavar="PATH", help="also write the conversion report as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_convert_criteo)
