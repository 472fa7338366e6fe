"""The driver's side of progress: events to view calls and stage lines; the worker's sink without a board."""

from __future__ import annotations

import logging

import pytest

from dlrm_platform.output.progress import ProgressMonitor, ProgressSink, describe_decision
from dlrm_platform.output.progress_events import (
    Checkpointed,
    EpochFinished,
    EpochStarted,
    Evaluating,
    Restored,
    Window,
)
from dlrm_platform.output.run_log import STAGE_LOGGER


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_events_reach_the_view_and_the_stage_log(caplog):
    view = Recorder()
    monitor = ProgressMonitor(board=None, view=view, expected_samples=1000)
    with caplog.at_level(logging.INFO, logger=STAGE_LOGGER):
        for event in [
            Restored(epoch=0, path="/ckpt/s3", global_step=3, samples_in_epoch=768),
            EpochStarted(epoch=0, samples_done=0),
            Window(epoch=0, samples_done=500, samples_per_s=100.0, data_wait=0.5, loss=0.6),
            EpochFinished(epoch=0, samples=1000, seconds=10.0, data_wait=0.4, loss=0.5),
            Evaluating(epoch=0),
            Checkpointed(epoch=0, path="/ckpt/e0", end_of_epoch=True, auc=0.85, logloss=0.42),
            Checkpointed(epoch=1, path="/ckpt/e1s5", end_of_epoch=False, auc=0.85, logloss=0.42),
        ]:
            monitor.handle(event)
    assert view.calls == [("epoch_started", 0, 1000, 0), ("update", 0, 500, 100.0, 0.5, 0.6),
                          ("epoch_finished", 0, 1000, 10.0, 0.4, 0.5)]
    assert [r.getMessage() for r in caplog.records] == [
        "restored /ckpt/s3: epoch 0, global step 3; epoch 0 goes on after 768 samples",
        "epoch 0: evaluating",
        "epoch 0: held-out AUC 0.8500, logloss 0.4200; checkpoint /ckpt/e0",
        "epoch 1: checkpoint /ckpt/e1s5",
    ]


def test_tuner_decision_line():
    tick = {"type": "tick", "policy": "hill_climb", "decision": {"parse": 1, "batch": -1},
            "allocation": {"read": 1, "parse": 3, "batch": 1}, "throughput": 12345.6, "bottleneck": "parse"}
    assert describe_decision(tick) == (
        "tuner (hill_climb): parse +1, batch -1 -> read 1, parse 3, batch 1; 12,346 samples/s before, bottleneck parse")


@pytest.mark.parametrize("run_id, rank", [(None, 0), ("abc", 1)])
def test_sink_is_quiet_without_a_run_or_off_rank_zero(run_id, rank):
    sink = ProgressSink(run_id, rank)
    sink.window(0, 1, 1.0, 0.0, 0.1)  # no Ray call at all: would raise without ray.init
    sink.checkpointed(0, "c", end_of_epoch=True)
    assert sink._name is None


def test_a_malformed_event_is_skipped_and_the_monitor_goes_on(caplog, monkeypatch):
    import ray

    class Board:
        class take:  # noqa: N801 - stands in for the actor method
            @staticmethod
            def remote():
                return [{"kind": "window", "epoch": 0, "samples_done": "many"},  # not a number
                        {"kind": "rewound", "epoch": 0},  # a kind nobody knows
                        "not an event",
                        Evaluating(epoch=2).model_dump(),  # an event's dump is read as the event
                        EpochStarted(epoch=2, samples_done=5)]

    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: refs)
    view = Recorder()
    monitor = ProgressMonitor(board=Board(), view=view, expected_samples=10)
    with caplog.at_level(logging.DEBUG):
        monitor.poll()
    assert view.calls == [("epoch_started", 2, 10, 5)]
    assert [r.getMessage() for r in caplog.records if r.name == STAGE_LOGGER] == ["epoch 2: evaluating"]
    assert sum("malformed progress event" in r.getMessage() for r in caplog.records) == 3


def test_the_sink_sends_a_typed_event_the_monitor_shows():
    sent = []

    class Board:
        class put:  # noqa: N801 - stands in for the actor method
            @staticmethod
            def remote(event):
                sent.append(event)

    sink = ProgressSink("abc", 0)
    sink._board = Board()
    sink.window(1, 64, 32.0, 0.25, 0.7)
    sink.epoch_started(1, "not a number")  # a bad figure: this event is dropped, the sink stays on
    sink.evaluating(1)
    assert [type(e) for e in sent] == [Window, Evaluating] and sink._name is not None
    view = Recorder()
    ProgressMonitor(board=None, view=view).handle(sent[0])
    assert view.calls == [("update", 1, 64, 32.0, 0.25, 0.7)]


class FakeTuner:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def history(self) -> list[dict]:
        return list(self.records)


def test_tuner_decisions_are_printed_once_as_they_are_recorded(caplog):
    tuner = FakeTuner()
    monitor = ProgressMonitor(board=None, view=Recorder(), tuner=tuner, tuner_poll_s=0.0)
    decided = {"type": "tick", "policy": "plumber", "decision": {"parse": 1}, "allocation": {"parse": 2},
               "throughput": 100.0}
    with caplog.at_level(logging.INFO, logger=STAGE_LOGGER):
        tuner.records += [{"type": "epoch_start"}, {"type": "tick", "decision": None}, decided]
        monitor._show_tuner_decisions()
        tuner.records += [{"type": "tick", "decision": {}}]
        monitor._show_tuner_decisions()  # nothing new decided
    assert [r.getMessage() for r in caplog.records] == ["tuner (plumber): parse +1 -> parse 2; 100 samples/s before"]
