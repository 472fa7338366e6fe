"""Rank 0's training progress, from the worker to the driver's terminal.

Channel: a small actor (:class:`_Board`, no CPU) named after the job's MLflow
run, created by the driver for the run. Rank 0's :class:`ProgressSink` sends it
one fire-and-forget call per log window (``train.log_every_steps``) and per
stage (restore, epoch start and end, evaluation, checkpoint): never per step, and never
waiting for an answer. Each call carries one typed event (:mod:`.progress_events`).
The driver's :class:`ProgressMonitor` thread takes the events twice a second,
validates each (one that does not validate is logged at debug and skipped) and
hands them to a view (:mod:`.progress_view`) and to the stage logger; it also
prints the tuner's decisions as the tuner records them
(:mod:`dlrm_platform.tuner.recorder`).

Why an actor rather than polling MLflow: the per-step metrics say nothing of
epochs, evaluation or checkpoints, and a sqlite store polled while rank 0 writes
to it adds lock contention on the training side. The worker finds the board by
name, so nothing is added to what the driver hands the workers; without a board
(a test calling ``run_training`` directly) the sink does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from dlrm_platform.output.progress_events import (
    Checkpointed,
    EpochFinished,
    EpochStarted,
    Evaluating,
    ProgressEvent,
    Restored,
    Window,
    read_event,
)
from dlrm_platform.output.progress_view import ProgressView
from dlrm_platform.output.run_log import STAGE_LOGGER, shown_path

__all__ = ["NAMESPACE", "ProgressMonitor", "ProgressSink", "board_name", "live_progress"]

log = logging.getLogger(__name__)
stage = logging.getLogger(STAGE_LOGGER)

NAMESPACE = "dlrm_platform_progress"


def board_name(run_id: str) -> str:
    return f"dlrm-progress-{run_id}"


class _Board:
    """The actor's body: events in order, taken by one reader."""

    def __init__(self) -> None:
        self.events: list[ProgressEvent] = []

    def put(self, event: ProgressEvent) -> None:
        self.events.append(event)

    def take(self) -> list[ProgressEvent]:
        out, self.events = self.events, []
        return out


# --------------------------------------------------------------------------- worker side


class ProgressSink:
    """What a training worker reports; only rank 0 of a run with a board sends anything.

    Every method is one fire-and-forget actor call (no wait on the training
    thread). The board is looked up once; if it is missing, the sink goes quiet.
    """

    def __init__(self, run_id: str | None = None, rank: int = 0) -> None:
        self._name = board_name(run_id) if run_id and rank == 0 else None
        self._board: Any = None

    def _send(self, kind: type[ProgressEvent], **fields: Any) -> None:
        if self._name is None:
            return
        try:
            event = kind(**fields)
        except ValidationError as err:  # a bad figure loses this event only
            log.debug("progress event %s not sent: %s", kind.__name__, err)
            return
        try:
            if self._board is None:
                import ray

                self._board = ray.get_actor(self._name, namespace=NAMESPACE)
            self._board.put.remote(event)
        except Exception as err:  # noqa: BLE001 - progress display must never break training
            log.debug("no progress board %s (%s): progress is not shown", self._name, err)
            self._name = None

    def epoch_started(self, epoch: int, samples_done: int) -> None:
        """``samples_done``: of this epoch already, when resumed mid-epoch from a checkpoint."""
        self._send(EpochStarted, epoch=epoch, samples_done=samples_done)

    def window(self, epoch: int, samples_done: int, samples_per_s: float, data_wait: float, loss: float) -> None:
        """One log window (all workers): samples of the epoch so far, the window's rate, data wait and loss."""
        self._send(Window, epoch=epoch, samples_done=samples_done, samples_per_s=samples_per_s,
                   data_wait=data_wait, loss=loss)

    def epoch_finished(self, epoch: int, samples: int, seconds: float, data_wait: float, loss: float) -> None:
        self._send(EpochFinished, epoch=epoch, samples=samples, seconds=seconds, data_wait=data_wait, loss=loss)

    def evaluating(self, epoch: int) -> None:
        self._send(Evaluating, epoch=epoch)

    def restored(self, path: str, epoch: int, global_step: int, samples_in_epoch: int) -> None:
        """Resumed from the checkpoint at ``path``; ``samples_in_epoch`` of ``epoch`` were trained before it."""
        self._send(Restored, path=path, epoch=epoch, global_step=global_step, samples_in_epoch=samples_in_epoch)

    def checkpointed(self, epoch: int, name: str, *, end_of_epoch: bool, auc: float | None = None,
                     logloss: float | None = None) -> None:
        self._send(Checkpointed, epoch=epoch, path=_checkpoint_location(name), end_of_epoch=end_of_epoch,
                   auc=auc, logloss=logloss)


def _checkpoint_location(name: str) -> str:
    try:
        import ray.train

        return f"{ray.train.get_context().get_storage().experiment_fs_path}/{name}"
    except Exception:  # noqa: BLE001 - the name alone still says which checkpoint
        return name


# --------------------------------------------------------------------------- driver side


class ProgressMonitor:
    """Polls the board (and the tuner's recorder) on a thread; draws on ``view``, logs stage lines."""

    def __init__(self, board: Any, view: ProgressView, *, expected_samples: int | None = None,
                 tuner: Any = None, poll_s: float = 0.5, tuner_poll_s: float = 2.0) -> None:
        self.board = board
        self.view = view
        self.expected_samples = expected_samples
        self.tuner = tuner  # a tuner.recorder.TunerHandle whose decisions are printed, or None
        self.poll_s = poll_s
        self.tuner_poll_s = tuner_poll_s
        self._tuner_seen = 0
        self._tuner_next = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlrm-progress", daemon=True)

    def start(self) -> ProgressMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling, take what is left, close the view. Call before Ray shuts down."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.poll(final=True)
        self.view.close()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self, final: bool = False) -> None:
        import ray

        try:
            events = ray.get(self.board.take.remote(), timeout=10)
        except Exception as err:  # noqa: BLE001 - a missed poll only delays the display
            log.debug("progress board unreachable: %s", err)
            events = []
        for event in events:
            try:
                self.handle(event)
            except Exception:  # noqa: BLE001 - a display bug must not stop the job
                log.debug("could not show progress event %s", event, exc_info=True)
        if self.tuner is not None and (final or time.monotonic() >= self._tuner_next):
            self._tuner_next = time.monotonic() + self.tuner_poll_s
            self._show_tuner_decisions()

    def handle(self, received: Any) -> None:
        """Validate one event from the board and show it; a malformed one is logged (debug) and skipped."""
        try:
            event = read_event(received)
        except ValidationError as err:
            log.debug("skipped a malformed progress event %r: %s", received, err)
            return
        epoch = event.epoch
        if isinstance(event, EpochStarted):
            self.view.epoch_started(epoch, self.expected_samples, event.samples_done)
        elif isinstance(event, Window):
            self.view.update(epoch, event.samples_done, event.samples_per_s, event.data_wait, event.loss)
        elif isinstance(event, EpochFinished):
            self.view.epoch_finished(epoch, event.samples, event.seconds, event.data_wait, event.loss)
        elif isinstance(event, Restored):
            done = event.samples_in_epoch
            stage.info("restored %s: epoch %d, global step %d%s", shown_path(event.path), epoch, event.global_step,
                       f"; epoch {epoch} goes on after {done:,} samples" if done else "")
        elif isinstance(event, Evaluating):
            stage.info("epoch %d: evaluating", epoch)
        elif isinstance(event, Checkpointed):
            held_out = ""
            if event.end_of_epoch and _finite(event.auc):
                held_out = f"held-out AUC {event.auc:.4f}, logloss {event.logloss:.4f}; "
            stage.info("epoch %d: %scheckpoint %s", epoch, held_out, shown_path(event.path))

    def _show_tuner_decisions(self) -> None:
        try:
            records = self.tuner.history()
        except Exception as err:  # noqa: BLE001
            log.debug("tuner history unreachable: %s", err)
            return
        for rec in records[self._tuner_seen:]:
            if rec.get("type") == "tick" and rec.get("decision"):
                stage.info("%s", describe_decision(rec))
        self._tuner_seen = len(records)


def describe_decision(tick: dict[str, Any]) -> str:
    """``tuner (hill_climb): parse +1, batch -1 -> read 1, parse 3, batch 1; 12,345 samples/s``."""
    changes = ", ".join(f"{op} {delta:+d}" for op, delta in tick["decision"].items())
    allocation = ", ".join(f"{op} {n}" for op, n in tick.get("allocation", {}).items())
    rate = tick.get("throughput")
    tail = f"; {rate:,.0f} samples/s before" if _finite(rate) else ""
    bottleneck = f", bottleneck {tick['bottleneck']}" if tick.get("bottleneck") else ""
    why = (tick.get("explanation") or {}).get("text")
    if why:
        bottleneck = f"; {why}"
    return f"tuner ({tick.get('policy', '?')}): {changes} -> {allocation}{tail}{bottleneck}"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@contextlib.contextmanager
def live_progress(run_id: str, view: ProgressView | None, *, expected_samples: int | None = None,
                  tuner: Any = None) -> Iterator[ProgressMonitor | None]:
    """The board for ``run_id`` and a monitor drawing on ``view`` while the body trains.

    ``view=None``: nothing (no actor; the workers' sinks stay quiet). The board
    is killed and the monitor's thread joined on exit, before the caller shuts
    Ray down (a thread still calling Ray then fails on a GCS that is gone).
    """
    if view is None:
        yield None
        return
    import ray

    board = ray.remote(num_cpus=0)(_Board).options(
        name=board_name(run_id), namespace=NAMESPACE, get_if_exists=True).remote()
    monitor = ProgressMonitor(board, view, expected_samples=expected_samples, tuner=tuner).start()
    try:
        yield monitor
    finally:
        monitor.stop()
        with contextlib.suppress(Exception):
            ray.kill(board)
