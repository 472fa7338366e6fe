"""The terminal of a run: the one place that writes to it, so that lines and a live bar do not garble each other.

Lines (stage lines, warnings, errors) and the progress bar come from different
threads: the main thread logs stages, the progress monitor's thread draws the
bar. Every write takes the same lock and clears the bar first, then redraws it,
which is what ``tqdm.write`` does for a single stream; here lines may go to
stderr while the bar is on stdout.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TextIO

__all__ = ["Terminal"]


class Terminal:
    """stdout for the run's lines and bar, stderr for warnings and errors."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.lock = threading.RLock()
        self.bar: Any = None  # the live tqdm bar, set by progress_view.BarView

    @property
    def is_tty(self) -> bool:
        """A live bar only on an interactive terminal with a size; plain lines under Ray Jobs, CI, pipes.

        A pseudo-terminal of size 0x0 (``script`` without a terminal, some CI runners) counts as none:
        tqdm draws nothing there.
        """
        try:
            if not self.out.isatty():
                return False
            size = os.get_terminal_size(self.out.fileno())
        except (AttributeError, ValueError, OSError):  # a closed or unusual stream
            return False
        return size.columns > 0 and size.lines > 0

    def write(self, text: str, *, err: bool = False) -> None:
        stream = self.err if err else self.out
        with self.lock:
            if self.bar is not None:
                self.bar.clear()
            stream.write(text + "\n")
            stream.flush()
            if self.bar is not None:
                if err:
                    self.out.flush()
                self.bar.refresh()
