"""`dlrm-platform` command line.

Each subpackage that contributes commands exposes ``register(subparsers)``
in its ``cli.py``; this module only assembles them, so the packages stay
separable. Handlers receive the parsed ``argparse.Namespace`` and return an
exit code. Heavy imports (ray, torch) happen inside handlers, never here.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dlrm_platform.errors import UserError

# Modules with a `register(subparsers)` function, in help order.
COMMAND_MODULES = (
    "dlrm_platform.ingest.cli",   # gen-data, convert-criteo
    "dlrm_platform.ingest.dedup_cli",  # dedup-convert
    "dlrm_platform.job",          # run, ui
    "dlrm_platform.tuner.cli",    # analyze, tuner ...
    "dlrm_platform.api.cli",      # serve, api-key ...
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlrm-platform",
        description="Train DLRM recommendation models on Ray: ingestion, training, tuning, job service.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and everything else on the terminal too: `run` otherwise keeps "
                             "library, Ray and worker output in the run's log file")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # not written yet; its commands are simply absent
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
