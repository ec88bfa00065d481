"""A one-line progress bar on stderr for long runs."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    """``bar(done, total, label)`` redraws ``[#####     ] 5/19 label  12 s``; the
    last call ends the line. Disabled, it prints nothing."""

    def __init__(self, enabled: bool = True, width: int = 24, stream=None):
        self.enabled = enabled
        self.width = width
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        filled = self.width * done // max(total, 1)
        elapsed = time.perf_counter() - self.start
        line = f"\r[{'#' * filled:<{self.width}}] {done}/{total} {label[:32]:<32} {elapsed:5.0f} s"
        print(line, end="\n" if done >= total else "", file=self.stream, flush=True)
