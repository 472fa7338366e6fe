"""Progress views: plain lines when stdout is not a terminal (Ray Jobs, CI), a bar when it is."""

from __future__ import annotations

import io

from dlrm_platform.output.progress_view import BarView, LineView, make_view
from dlrm_platform.output.terminal import Terminal


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_line_view_prints_start_throttled_windows_and_end():
    lines: list[str] = []
    clock = Clock()
    view = LineView(lines.append, interval_s=10.0, clock=clock)
    view.epoch_started(0, 143_991, 0)
    clock.now = 2.0
    view.update(0, 20_480, 14_000.0, 0.78, 0.66)  # within the interval since the start line: skipped
    clock.now = 11.0
    view.update(0, 40_960, 52_000.0, 0.43, 0.4703)
    clock.now = 12.0
    view.update(0, 61_440, 60_000.0, 0.02, 0.45)  # 1 s after the last line: skipped
    view.epoch_finished(0, 143_991, 8.0, 0.43, 0.475)
    view.close()
    assert lines == [
        "epoch 0: training (~143,991 samples)",
        "epoch 0: 40,960 samples (28%), 52,000 samples/s, data-wait 0.43, loss 0.4703",
        "epoch 0: trained 143,991 samples in 8.0 s, 17,999 samples/s, data-wait 0.43, loss 0.4750",
    ]


def test_line_view_without_expected_size_and_resumed_epoch():
    lines: list[str] = []
    clock = Clock()
    view = LineView(lines.append, interval_s=0.0, clock=clock)
    view.epoch_started(3, None, 5_000)
    view.update(3, 6_000, 1_000.0, 0.5, float("nan"))
    assert lines == ["epoch 3: training, resumed after 5,000", "epoch 3: 6,000 samples, 1,000 samples/s, data-wait 0.50, loss -"]


def test_non_tty_terminal_gets_the_line_view():
    terminal = Terminal(io.StringIO(), io.StringIO())
    assert not terminal.is_tty
    assert isinstance(make_view(terminal, print), LineView)


def test_bar_view_draws_and_leaves_the_finished_epoch():
    out = io.StringIO()
    terminal = Terminal(out, io.StringIO())
    view = BarView(terminal)
    view.epoch_started(0, 100_000, 0)
    view.update(0, 40_000, 52_000.0, 0.43, 0.47)
    terminal.write("epoch 0: a stage line")  # clears the bar, writes, redraws
    view.epoch_finished(0, 98_000, 2.0, 0.4, 0.46)  # fewer than expected (quarantine): the bar ends at 100%
    assert terminal.bar is None
    view.close()
    text = out.getvalue()
    assert "epoch 0: a stage line\n" in text
    assert "52,000 samples/s, data-wait 0.43, loss 0.4700" in text
    final = text.rsplit("\r", 1)[-1]
    assert "100%" in final and "49,000 samples/s, data-wait 0.40, loss 0.4600" in final
