"""How long a training loop waits for data: a framework-free meter with an injectable clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DataWaitMeter", "DataWaitStats"]


@dataclass(frozen=True)
class DataWaitStats:
    """Totals over a window of steps.

    Args:
        steps: Steps measured.
        samples: Samples in those steps.
        wait_s: Seconds spent between the end of one step and the start of the next (fetch + transfer).
        total_s: Seconds from the start of the first measured step's wait to the end of the last step.
    """

    steps: int
    samples: int
    wait_s: float
    total_s: float

    @property
    def data_wait_fraction(self) -> float:
        """Fraction of wall time spent waiting for data (0 when nothing was measured)."""
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def samples_per_sec(self) -> float:
        """Throughput over the window."""
        return self.samples / self.total_s if self.total_s > 0 else 0.0


class DataWaitMeter:
    """Accumulate per-step wait and step time from ``step_start``/``step_end`` calls.

    The wait of a step is the time from the previous ``step_end`` (or the last :meth:`reset_reference`, e.g.
    the epoch start) to this ``step_start``. Every step is counted; a step before any reference point (no
    ``reset_reference`` call yet) is measured from its own start, with no wait.

    Args:
        clock: Monotonic seconds; ``time.perf_counter`` unless a test injects a fake.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last_end: float | None = None
        self._pending: int = 0
        self._window = [0, 0, 0.0, 0.0]
        self._total = [0, 0, 0.0, 0.0]

    def reset_reference(self) -> None:
        """Measure the next wait from now (e.g. at an epoch start, so validation is not counted as waiting)."""
        self._last_end = self.clock()

    def step_start(self, batch_size: int) -> None:
        """Call when a step's batch is ready (Lightning: ``on_train_batch_start``)."""
        now = self.clock()
        if self._last_end is None:
            self._last_end = now
        self._wait = now - self._last_end
        self._pending = batch_size
        self._start = now

    def step_end(self) -> None:
        """Call when a step is done (Lightning: ``on_train_batch_end``)."""
        now = self.clock()
        if self._pending and self._last_end is not None:
            elapsed = now - self._last_end
            for acc in (self._window, self._total):
                acc[0] += 1
                acc[1] += self._pending
                acc[2] += self._wait
                acc[3] += elapsed
        self._last_end = now

    def window(self, reset: bool = True) -> DataWaitStats:
        """Stats since the last reset of the window."""
        stats = DataWaitStats(int(self._window[0]), int(self._window[1]), self._window[2], self._window[3])
        if reset:
            self._window = [0, 0, 0.0, 0.0]
        return stats

    def total(self) -> DataWaitStats:
        """Stats over everything measured."""
        return DataWaitStats(int(self._total[0]), int(self._total[1]), self._total[2], self._total[3])
