"""`analyze`'s measuring loop, with a fake pipeline and controller (the live run: tests/integration)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dlrm_platform.errors import UserError
from dlrm_platform.tuner import analysis


class SlowStartDataset:
    """Yields its first batch after ``startup_s`` (workers importing), then one every ``every_s``."""

    def __init__(self, startup_s: float, every_s: float):
        self.startup_s, self.every_s = startup_s, every_s
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.context = SimpleNamespace()

    def iter_batches(self, **_):
        time.sleep(self.startup_s)
        while True:
            now = time.time()
            self.first_t = self.first_t or now
            self.last_t = now
            yield SimpleNamespace(num_rows=10)
            time.sleep(self.every_s)


def _fake_tuner(monkeypatch, rate):
    from dlrm_platform import tuner as tuner_api
    from dlrm_platform.tuner import ray_hooks

    obs = SimpleNamespace(ops=[SimpleNamespace(name="parse", rate_per_slot=rate)])
    ctl = SimpleNamespace(last_obs=obs, pop_records=lambda: [{"type": "epoch_start", "fused": {}, "missing": []}])
    monkeypatch.setattr(tuner_api, "attach", lambda *a, **k: SimpleNamespace(tuner_id="t"))
    monkeypatch.setattr(ray_hooks, "local_controller", lambda _id: ctl)
    monkeypatch.setattr(ray_hooks, "uninstall", lambda _ctx: None)
    return obs


def test_the_clock_starts_at_the_first_output_not_at_submission(monkeypatch):
    obs = _fake_tuner(monkeypatch, rate=100.0)
    ds = SlowStartDataset(startup_s=0.6, every_s=0.02)
    got, _, _ = analysis._run_and_observe(ds, [], 2.0, seconds=0.5, warmup_s=0.1)
    assert got is obs
    # measured for the full 0.5 s after the first batch, though start-up alone took longer than that
    assert ds.last_t - ds.first_t >= 0.5


def test_nothing_measured_says_run_longer(monkeypatch):
    _fake_tuner(monkeypatch, rate=None)
    with pytest.raises(UserError, match="run longer"):
        analysis._run_and_observe(SlowStartDataset(0.0, 0.01), [], 2.0, seconds=0.05, warmup_s=0.0)
