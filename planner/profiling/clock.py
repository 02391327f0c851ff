"""A stopwatch for device work: perf_counter on the CPU, CUDA events on a GPU.

GPU kernels run asynchronously, so host timestamps would measure the launch, not the work; CUDA
events are recorded on the stream and read after a synchronise.
"""

from __future__ import annotations

import time

import numpy as np


class Clock:
    """Accumulates named intervals (``start(name)`` .. ``stop(name)``); ``read()`` returns seconds per
    name since the last read and starts over. Intervals of one name must not nest."""

    def __init__(self, xp=np):
        self._gpu = xp is not np
        self._xp = xp
        self._open: dict[str, object] = {}
        self._done: dict[str, list] = {}

    def _mark(self):
        if self._gpu:
            event = self._xp.cuda.Event()
            event.record()
            return event
        return time.perf_counter()

    def start(self, name: str) -> None:
        self._open[name] = self._mark()

    def stop(self, name: str) -> None:
        self._done.setdefault(name, []).append((self._open.pop(name), self._mark()))

    def read(self) -> dict[str, float]:
        if self._gpu:
            self._xp.cuda.Device().synchronize()
            elapsed = self._xp.cuda.get_elapsed_time
            out = {k: sum(elapsed(a, b) for a, b in v) / 1e3 for k, v in self._done.items()}
        else:
            out = {k: sum(b - a for a, b in v) for k, v in self._done.items()}
        self._done = {}
        return out

    def sync(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""
        if self._gpu:
            self._xp.cuda.Device().synchronize()
