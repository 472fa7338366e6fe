"""The worker's MLflow logger through a server outage: training never blocks, nothing is lost silently."""

from __future__ import annotations

import logging
import threading
import time

from dlrm_platform.train.mlflow_logger import MlflowTracker


class FlakyClient:
    """An MlflowClient stand-in whose server is down while ``down`` is set."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.logged: list[tuple[str, int, float]] = []
        self.attempts = 0

        self.commit_then_fail = False  # the server stores the request, then dies before it answers

    def log_batch(self, run_id: str, metrics: list) -> None:
        self.attempts += 1
        if self.down.is_set():
            raise ConnectionError("connection refused")
        self.logged.extend((m.key, m.step, m.value) for m in metrics)
        self._raw = getattr(self, "_raw", []) + list(metrics)
        if self.commit_then_fail:
            self.commit_then_fail = False
            raise ConnectionError("connection reset")

    def get_metric_history(self, run_id: str, key: str) -> list:
        return [m for m in getattr(self, "_raw", []) if m.key == key]


def _tracker(client: FlakyClient, **kw) -> MlflowTracker:
    return MlflowTracker("http://127.0.0.1:1", "run", client=client, **{"flush_wait_s": 5.0, "retry_s": 0.05, **kw})


def test_flush_sends_before_it_returns_while_the_server_answers():
    client = FlakyClient()
    t = _tracker(client)
    t.log_step(1, {"loss": 0.5})
    t.log_step(2, {"loss": 0.4})
    t.flush()
    assert client.logged == [("loss", 1, 0.5), ("loss", 2, 0.4)]
    t.log_epoch(0, {"epoch_train_loss": 0.45})
    assert client.logged[-1] == ("epoch_train_loss", 0, 0.45)
    assert t.close().total == 0


def test_an_outage_buffers_without_blocking_and_flushes_everything_in_order_when_the_server_returns(caplog):
    client = FlakyClient()
    t = _tracker(client, flush_wait_s=0.3)
    client.down.set()
    caplog.set_level(logging.WARNING, logger="dlrm_platform.train.mlflow_logger")
    started = time.monotonic()
    for step in range(1, 101):
        t.log_step(step, {"loss": 1.0 / step})
        if step % 10 == 0:
            t.flush()
    # The first flush waits at most flush_wait_s; once the outage is known, flushes return at once.
    assert time.monotonic() - started < 2.0
    assert client.logged == [] and t.buffered == 100
    assert "not answering" in caplog.text and "training goes on" in caplog.text
    client.down.clear()
    lost = t.close(timeout_s=10)
    assert lost.total == 0
    assert client.logged == [("loss", s, 1.0 / s) for s in range(1, 101)]  # each once, in step order
    assert "is back" in caplog.text


def test_metrics_the_server_never_took_are_reported_by_name_and_steps(caplog):
    client = FlakyClient()
    t = _tracker(client, flush_wait_s=0.1, max_buffered=50)
    client.down.set()
    for step in range(1, 41):
        t.log_step(step, {"loss": 0.1, "samples_per_s": 10.0})  # 80 metrics: 30 overflow the buffer
    t.flush()
    caplog.set_level(logging.WARNING, logger="dlrm_platform.train.mlflow_logger")
    lost = t.close(timeout_s=0.3)
    assert lost.total == 80 and lost.counts == {"loss": 40, "samples_per_s": 40}
    assert (lost.first_step, lost.last_step) == (1, 40)
    assert "lost 80 metrics of steps 1-40 (loss x40, samples_per_s x40)" in caplog.text
    assert client.logged == []


def test_a_request_the_server_stored_before_dying_is_not_logged_twice():
    client = FlakyClient()
    t = _tracker(client, flush_wait_s=0.3)
    for step in range(1, 6):
        t.log_step(step, {"loss": float(step)})
    client.commit_then_fail = True  # stored, but the answer never came: the sender retries
    t.flush()
    t.log_step(6, {"loss": 6.0})
    assert t.close(timeout_s=10).total == 0
    assert client.logged == [("loss", s, float(s)) for s in range(1, 7)]  # each once
