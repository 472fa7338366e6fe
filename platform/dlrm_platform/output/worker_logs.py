"""The output Ray forwards from workers to the driver, as log records the run's handlers route.

Ray prints every line a worker, actor or task writes (fbgemm's ``[TBE=...]``
configuration, TorchRec's planner table, torch.fx warnings, Ray Data's and Ray
Train's messages) on the driver's terminal. The driver cannot filter what it
cannot see, and the lines must still land somewhere (the run's log file), so
instead of turning forwarding off (``ray.init(log_to_driver=False)``: the lines
would then only be in the session logs of each node) the driver turns each
forwarded line into a record of the ``workers`` logger at a level read from the
line; :mod:`.run_log` decides where each record goes.

The level of a line: a training worker logs ``dlrm_platform`` records as
``LEVEL logger: message`` (:func:`configure_worker_logging`); Python logging
lines in Ray's format carry ``<time>\\tLEVEL``; a Python traceback is a
warning; everything else is INFO. The record's ``origin`` attribute names the
logger the line came from, when it says.

Why a traceback is not an error here: a worker's exception that fails the job
reaches the driver as the exception ``trainer.fit()`` raises, with the worker's
traceback in it, and that is what the terminal shows once. The same traceback
is also printed by the worker and again by Ray Train's controller; and Ray's
own actors print tracebacks that fail nothing (Ray Train's placement-group
cleaner when two Ray clusters share a machine, its controller's resource
requests timing out on a busy CPU). They stay in the run's log file.

Private Ray name: Ray 2.60 has no public hook on forwarded output. The driver's
log thread hands every batch to ``ray._private.ray_logging.global_worker_stdstream_dispatcher.emit``;
:func:`forward_worker_output` replaces that method on the instance for the
duration of a run. Only this module touches it; :func:`verify_hook` fails loudly
when an upgrade moves it (tests/output/test_worker_logs.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "WORKERS_LOGGER",
    "WORKER_LOG_FORMAT",
    "classify_batch",
    "configure_worker_logging",
    "forward_worker_output",
    "verify_hook",
]

WORKERS_LOGGER = "workers"  # top level: its records are not subject to the "ray" logger's level
WORKER_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}
_OURS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) (dlrm_platform(?:\.[\w.]+)?): ")
# Ray's text format "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s", MLflow's
# "%Y/%m/%d %H:%M:%S LEVEL name: message" and basicConfig's "LEVEL:name:message".
_STAMPED = re.compile(r"^\d{4}[-/]\d\d[-/]\d\d[ T][\d:.,]+\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_BASIC = re.compile(r"^(ERROR|CRITICAL):[\w.]+:")
_TRACEBACK = "Traceback (most recent call last):"


def classify_batch(lines: list[str]) -> list[tuple[int, str, str]]:
    """(level, origin, line) for each line of one forwarded batch (one process, one flush).

    A traceback makes its line and the rest of the batch (the frames and the
    exception) warnings.
    """
    out: list[tuple[int, str, str]] = []
    in_traceback = False
    for line in lines:
        level, origin = logging.INFO, ""
        if line.startswith(_TRACEBACK):
            in_traceback = True
        if in_traceback:
            level = logging.WARNING
        elif m := _OURS.match(line):
            level, origin = _LEVELS[m.group(1)], m.group(2)
            line = line[len(m.group(1)) + 1:]  # the record carries the level
        elif m := _STAMPED.match(line) or _BASIC.match(line):
            level = _LEVELS[m.group(1)]
        out.append((level, origin, line))
    return out


def _prefix(data: Mapping[str, Any]) -> str:
    """Ray's own prefix: ``(RayTrainWorker pid=123, ip=...)``."""
    pid = data.get("pid")
    if pid in ("autoscaler", "raylet"):
        return f"({pid}) "
    name = data.get("actor_name") or data.get("task_name") or ""
    ip = data.get("ip")
    where = "" if not ip or ip == data.get("localhost") else f", ip={ip}"
    return f"({name + ' ' if name else ''}pid={pid}{where}) "


def _emitter(logger: logging.Logger):
    def emit(data: Mapping[str, Any]) -> None:
        try:
            prefix = _prefix(data)
            for level, origin, line in classify_batch(list(data.get("lines") or [])):
                logger.log(level, "%s%s", prefix, line, extra={"origin": origin})
        except Exception:  # noqa: BLE001 - Ray's log thread must survive anything we do with a line
            logging.getLogger(__name__).debug("could not route a forwarded batch", exc_info=True)
    return emit


def _dispatcher() -> Any:
    from ray._private import ray_logging

    return ray_logging.global_worker_stdstream_dispatcher


def verify_hook() -> None:
    """Raise RuntimeError if this Ray has no dispatcher whose ``emit(batch)`` the driver's log thread calls."""
    try:
        dispatcher = _dispatcher()
    except (ImportError, AttributeError) as err:
        raise RuntimeError(f"ray._private.ray_logging.global_worker_stdstream_dispatcher is gone: {err}") from err
    if not callable(getattr(type(dispatcher), "emit", None)):
        raise RuntimeError(f"{type(dispatcher).__name__} has no emit(batch) method any more")


@contextlib.contextmanager
def forward_worker_output(logger: logging.Logger | None = None) -> Iterator[None]:
    """While active, lines Ray forwards from workers become records of ``logger`` instead of being printed.

    Independent of when ``ray.init`` runs (before, inside, or not at all): the
    dispatcher exists from ``import ray`` on. On a Ray without the hook, Ray
    keeps printing the lines itself and a warning says so.
    """
    try:
        verify_hook()
    except RuntimeError as err:
        logging.getLogger(__name__).warning("Ray workers' output stays on the terminal: %s", err)
        yield
        return
    dispatcher = _dispatcher()
    emit = _emitter(logger or logging.getLogger(WORKERS_LOGGER))
    dispatcher.emit = emit  # shadows the class's method for this instance
    try:
        yield
    finally:
        if dispatcher.__dict__.get("emit") is emit:
            del dispatcher.emit


def configure_worker_logging(level: int = logging.INFO) -> None:
    """In a training worker: ``dlrm_platform`` records as ``LEVEL logger: message`` on stderr.

    Ray Train's own root handler prints the bare message, so the driver could
    not tell a warning from the rest; this logger gets its own handler and
    stops propagating (no line printed twice). Idempotent: a restarted loop in
    the same process adds no second handler.
    """
    logger = logging.getLogger("dlrm_platform")
    logger.setLevel(level)
    logger.propagate = False
    if not any(getattr(h, "_dlrm_worker_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(WORKER_LOG_FORMAT))
        handler._dlrm_worker_handler = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
