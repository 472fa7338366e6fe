"""The driver's check that the MLflow server answers before it writes a job's results."""

from __future__ import annotations

import http.server
import socket
import threading
import time

from dlrm_platform import mlflow_run
from dlrm_platform.job import _TrackingAtEnd


class _Health(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_local_store_always_answers():
    assert mlflow_run.server_answers("sqlite:////tmp/x.db")
    assert mlflow_run.server_answers("file:///tmp/mlruns")


def test_server_answers_asks_health_without_the_credentials_in_the_uri():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert mlflow_run.server_answers(f"http://user:secret@127.0.0.1:{port}/")
        assert _Health.seen[-1] == "/health"
    finally:
        server.shutdown()


def test_a_stopped_server_is_reported_at_once_and_waited_for_with_a_bound():
    uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    assert not mlflow_run.server_answers(uri)
    assert not mlflow_run.wait_for_server(uri, timeout_s=0.3, interval_s=0.1)
    assert time.monotonic() - started < 5


def test_the_job_asks_once_and_remembers(monkeypatch):
    calls = []
    monkeypatch.setattr(mlflow_run, "server_answers", lambda uri, timeout_s=5.0: calls.append(uri) or False)
    monkeypatch.setattr(mlflow_run, "wait_for_server", lambda uri, timeout_s, interval_s=5.0: False)
    tracking = _TrackingAtEnd("http://127.0.0.1:1")
    assert not tracking.answers() and not tracking.answers()
    assert calls == ["http://127.0.0.1:1"]
