"""How an epoch's progress is drawn: a live bar on a terminal, periodic plain lines elsewhere.

Both views get the same calls from the progress monitor (:mod:`.progress`):
epoch started, a log window's figures, epoch finished. The figures are the
workers' own (samples/s of the window's wall time, data-wait fraction, loss),
not rates the driver estimates from when the updates arrive.

:class:`LineView` is for logs people read later (``ray job submit``, the job
service's Ray Jobs, CI): one line when an epoch starts, one every
``interval_s`` while it trains, one when it ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from dlrm_platform.output.terminal import Terminal

__all__ = ["BarView", "LineView", "ProgressView", "make_view"]


class ProgressView(Protocol):
    def epoch_started(self, epoch: int, expected: int | None, done: int) -> None: ...

    def update(self, epoch: int, done: int, samples_per_s: float, data_wait: float, loss: float) -> None: ...

    def epoch_finished(self, epoch: int, samples: int, seconds: float, data_wait: float, loss: float) -> None: ...

    def close(self) -> None: ...


def _figures(samples_per_s: float, data_wait: float, loss: float) -> str:
    loss_text = f"{loss:.4f}" if math.isfinite(loss) else "-"
    return f"{samples_per_s:,.0f} samples/s, data-wait {data_wait:.2f}, loss {loss_text}"


class LineView:
    """Plain lines through ``write`` (the progress logger: terminal and run log)."""

    def __init__(self, write: Callable[[str], None], interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write
        self.interval_s = interval_s
        self.clock = clock
        self._expected: int | None = None
        self._last = -math.inf

    def epoch_started(self, epoch: int, expected: int | None, done: int) -> None:
        self._expected = expected
        self._last = self.clock()
        about = f" (~{expected:,} samples)" if expected else ""
        resumed = f", resumed after {done:,}" if done else ""
        self.write(f"epoch {epoch}: training{about}{resumed}")

    def update(self, epoch: int, done: int, samples_per_s: float, data_wait: float, loss: float) -> None:
        now = self.clock()
        if now - self._last < self.interval_s:
            return
        self._last = now
        share = f" ({min(done / self._expected, 1.0):.0%})" if self._expected else ""
        self.write(f"epoch {epoch}: {done:,} samples{share}, {_figures(samples_per_s, data_wait, loss)}")

    def epoch_finished(self, epoch: int, samples: int, seconds: float, data_wait: float, loss: float) -> None:
        rate = samples / seconds if seconds > 0 else 0.0
        self.write(f"epoch {epoch}: trained {samples:,} samples in {seconds:.1f} s, {_figures(rate, data_wait, loss)}")

    def close(self) -> None:
        pass


class BarView:
    """One tqdm bar per epoch on the terminal; it stays on screen as the epoch's line when done."""

    BAR_FORMAT = "epoch {desc} {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} samples [{elapsed}{postfix}]"

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self._epoch: int | None = None

    def _open(self, epoch: int, expected: int | None, done: int) -> Any:
        from tqdm import tqdm

        self._close_bar()
        bar = tqdm(total=expected, initial=done, desc=str(epoch), file=self.terminal.out, unit="",
                   unit_scale=True, dynamic_ncols=True, leave=True, bar_format=self.BAR_FORMAT,
                   mininterval=0.2)
        self.terminal.bar, self._epoch = bar, epoch
        return bar

    def epoch_started(self, epoch: int, expected: int | None, done: int) -> None:
        with self.terminal.lock:
            self._open(epoch, expected, done)

    def update(self, epoch: int, done: int, samples_per_s: float, data_wait: float, loss: float) -> None:
        with self.terminal.lock:
            bar = self.terminal.bar if self._epoch == epoch else self._open(epoch, None, 0)
            if bar.total is not None and done > bar.total:
                bar.total = done
            bar.n = done
            bar.set_postfix_str(_figures(samples_per_s, data_wait, loss), refresh=False)
            bar.refresh()

    def epoch_finished(self, epoch: int, samples: int, seconds: float, data_wait: float, loss: float) -> None:
        with self.terminal.lock:
            bar = self.terminal.bar if self._epoch == epoch else self._open(epoch, None, 0)
            done = max(bar.n, samples)
            bar.total = bar.n = done  # the epoch's real size (the expected one came from file footers)
            rate = samples / seconds if seconds > 0 else 0.0
            bar.set_postfix_str(_figures(rate, data_wait, loss), refresh=False)
            self._close_bar()

    def _close_bar(self) -> None:
        bar, self.terminal.bar, self._epoch = self.terminal.bar, None, None
        if bar is not None:
            bar.refresh()
            bar.close()

    def close(self) -> None:
        with self.terminal.lock:
            self._close_bar()


def make_view(terminal: Terminal, write_line: Callable[[str], None], interval_s: float = 10.0) -> ProgressView:
    """A bar on an interactive terminal, plain lines through ``write_line`` anywhere else."""
    return BarView(terminal) if terminal.is_tty else LineView(write_line, interval_s)
