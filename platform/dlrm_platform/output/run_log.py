"""The run's log file, and which log records reach the terminal.

While :func:`open_run_log` is active, every log record of the driver, of the
libraries it uses and of the Ray workers (:mod:`.worker_logs`) goes to
``<tracking.runs_dir>/logs/<job>-<time>-<pid>.log``. The file is written from
:meth:`RunLog.keep` on (the job calls it once its config, paths and dataset
passed their checks); records before that are held in memory and written then,
so a job refused up front leaves nothing behind (no run, no Ray, no file). The
terminal gets:

- the stage lines (logger ``dlrm_platform.stage``) and plain progress lines
  (``dlrm_platform.progress``), on stdout;
- warnings of the platform's own loggers (driver or worker) and errors of any
  logger, on stderr.

- once per run, when Ray Data says its operators cannot get CPUs ("Cluster
  resources are not enough ...", logged by the process that runs the pipeline,
  often the feed service actor) or that the execution made no progress, one
  line on stderr that says what to do (:class:`StarvedCpuHint`; the job fills in
  its CPU figures with :meth:`RunLog.advise_when_starved`). Ray's own message
  stays in the file.

With ``verbose`` the terminal gets every record too, as before this module.

Libraries that print on their own: Ray's and Ray Data's loggers have their own
console handlers and do not propagate, MLflow likewise; their console handlers
are set aside for the run and their records propagate to the run's handlers
(so Ray's auth-token notice, MLflow's store messages and the like land in the
file). Python warnings (torch.fx, Ray Data's ``UserWarning``) are captured as
log records. MLflow's artifact download bars and the run links it writes on
stdout when a run on a server ends are turned off (the summary has the link).
All of it is restored on exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlrm_platform.output.terminal import Terminal
from dlrm_platform.output.worker_logs import forward_worker_output

__all__ = ["PROGRESS_LOGGER", "STAGE_LOGGER", "RunLog", "StarvedCpuHint", "TerminalHandler", "open_run_log",
           "shown_on_terminal", "shown_path"]

STAGE_LOGGER = "dlrm_platform.stage"  # one line per stage of a job: always on the terminal
PROGRESS_LOGGER = "dlrm_platform.progress"  # plain progress lines (no bar): always on the terminal
_ALWAYS = (STAGE_LOGGER, PROGRESS_LOGGER)
# Loggers that print on their own console handler and do not propagate.
_SELF_PRINTING = ("ray", "ray.data", "ray.train", "ray.tune", "mlflow")
_FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def shown_on_terminal(record: logging.LogRecord, verbose: bool = False) -> bool:
    """Stage and progress lines; warnings of ``dlrm_platform`` (driver or worker); errors of anything."""
    if verbose or record.name in _ALWAYS or record.levelno >= logging.ERROR:
        return True
    origin = getattr(record, "origin", None) or record.name
    return record.levelno >= logging.WARNING and (origin == "dlrm_platform" or origin.startswith("dlrm_platform."))


class TerminalHandler(logging.Handler):
    """Writes the records :func:`shown_on_terminal` lets through: stage lines bare, the rest with level and logger."""

    def __init__(self, terminal: Terminal, verbose: bool = False) -> None:
        super().__init__(logging.DEBUG if verbose else logging.INFO)
        self.terminal = terminal
        self.verbose = verbose
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not shown_on_terminal(record, self.verbose):
            return
        try:
            text = record.getMessage() if record.name in _ALWAYS else self.format(record)
            self.terminal.write(text, err=record.levelno >= logging.WARNING)
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


# What Ray Data logs when its operators wait for CPUs they cannot get (ray.data resource_manager,
# no_progress_guard in Ray 2.60). Matched anywhere in a record: forwarded worker lines carry a prefix.
STARVED_MARKERS = ("Cluster resources are not enough", "Dataset execution made no progress")
_GENERIC_ADVICE = ("the cluster has too few free CPUs for the job's trainers and its data pipeline: lower "
                   "train.num_workers or train.cpus_per_worker (fractions are fine), or add nodes")


class StarvedCpuHint(logging.Handler):
    """One line on the terminal, at most once per run, when Ray Data is starved of CPUs."""

    def __init__(self, terminal: Terminal) -> None:
        super().__init__(logging.DEBUG)
        self.terminal = terminal
        self.advice = _GENERIC_ADVICE
        self.shown = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.shown:
            return
        try:
            message = record.getMessage()
            if not any(m in message for m in STARVED_MARKERS):
                return
            self.shown = True
            self.terminal.write(f"WARNING the data pipeline is waiting for CPUs it cannot get: {self.advice}",
                                err=True)
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


class _DeferredFileHandler(logging.Handler):
    """Holds records until :meth:`start`, then writes them and every later one to ``path``."""

    def __init__(self, path: Path, level: int) -> None:
        super().__init__(level)
        self.path = path
        self.setFormatter(logging.Formatter(_FILE_FORMAT))
        self._held: list[logging.LogRecord] | None = []
        self._file: logging.FileHandler | None = None

    def start(self) -> None:
        with self.lock:
            if self._file is not None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = logging.FileHandler(self.path, encoding="utf-8")
            self._file.setFormatter(self.formatter)
            held, self._held = self._held or [], None
            for record in held:
                self._file.emit(record)

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is not None:
            self._file.emit(record)
        elif self._held is not None and len(self._held) < 100_000:
            self._held.append(record)

    def close(self) -> None:
        with self.lock:
            if self._file is not None:
                self._file.close()
            self._held = None
        super().close()


@dataclass(frozen=True)
class RunLog:
    """Where this run's log goes, and the terminal its progress is drawn on."""

    path: Path
    terminal: Terminal
    verbose: bool
    _file: _DeferredFileHandler
    _starved: StarvedCpuHint

    def advise_when_starved(self, advice: str) -> None:
        """What the line shown when Ray Data is starved of CPUs tells the user to do (the job's own figures)."""
        self._starved.advice = advice

    @property
    def started(self) -> bool:
        return self.path.exists()

    def keep(self) -> None:
        """Start writing the file (with what was logged so far) and say where it is, once."""
        if self.started:
            return
        self._file.start()
        logging.getLogger(STAGE_LOGGER).info(
            "run log: %s%s", shown_path(self.path), "" if self.verbose else "  (everything not shown here; -v shows it)")


def shown_path(path: str | Path) -> str:
    """Relative to the working directory when under it (shorter, and what a user types)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def log_path(runs_dir: Path, job_name: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_name) or "job"
    return runs_dir / "logs" / f"{safe}-{stamp}-{os.getpid()}.log"


@contextlib.contextmanager
def open_run_log(job_name: str, runs_dir: Path, *, verbose: bool = False,
                 terminal: Terminal | None = None) -> Iterator[RunLog]:
    """Route the process's logging (and Ray's forwarded worker output) for one run; restore it on exit."""
    path = log_path(runs_dir.resolve(), job_name)
    terminal = terminal or Terminal()
    file_handler = _DeferredFileHandler(path, logging.DEBUG if verbose else logging.INFO)
    starved = StarvedCpuHint(terminal)
    handlers: list[logging.Handler] = [file_handler, TerminalHandler(terminal, verbose), starved]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_root_handlers(handlers, logging.DEBUG if verbose else logging.INFO))
        stack.enter_context(_library_loggers_propagate())
        stack.enter_context(_warnings_as_records())
        if not verbose:
            stack.enter_context(_env("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"))
            stack.enter_context(_env("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true"))
        stack.enter_context(forward_worker_output())
        stack.callback(file_handler.close)
        yield RunLog(path=path, terminal=terminal, verbose=verbose, _file=file_handler, _starved=starved)


@contextlib.contextmanager
def _root_handlers(handlers: list[logging.Handler], level: int) -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers[:] = handlers
    root.setLevel(level)
    try:
        yield
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@contextlib.contextmanager
def _library_loggers_propagate() -> Iterator[None]:
    """Set the console handlers of self-printing library loggers aside; their records propagate to root."""
    # Each configures its logger at import, and would undo this if first imported later.
    import mlflow  # noqa: F401
    import ray  # noqa: F401
    import ray.data  # noqa: F401

    saved = []
    for name in _SELF_PRINTING:
        logger = logging.getLogger(name)
        consoles = [h for h in logger.handlers
                    if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        saved.append((logger, logger.handlers[:], consoles, logger.propagate))
        for h in consoles:
            logger.removeHandler(h)
        logger.propagate = True
    try:
        yield
    finally:
        for logger, before, consoles, propagate in saved:
            # As they were, in their order; keep any handler added during the run (not a console set aside).
            added = [h for h in logger.handlers if h not in before and h not in consoles]
            logger.handlers[:] = before + added
            logger.propagate = propagate


@contextlib.contextmanager
def _warnings_as_records() -> Iterator[None]:
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
