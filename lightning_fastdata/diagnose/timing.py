"""How the doctor times: a shared time budget, one rank's share of the CPUs, the worker counts to try."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_fastdata.measure import count_images, time_loader

__all__ = ["Budget", "rank_share", "sweep_counts"]


class Budget:
    """Shares what is left of ``seconds`` among the timed runs still to come (builds and ceilings use it up too).

    A run takes longer than the time it is given: a warm-up batch, worker start-up and the end of the pass under
    way. The largest such overrun so far is kept back from each later run's share, so the whole stays near the
    budget.
    """

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds
        self.overrun = 0.0

    def time(self, make: Callable[[], Any], runs_left: int) -> float:
        """Images/s of ``make()``'s loader, given its share of the time left."""
        given = max(0.3, (self.deadline - time.perf_counter()) / max(1, runs_left) - self.overrun)
        start = time.perf_counter()
        rate = time_loader(make, count_images, warmup=1, min_seconds=given)
        self.overrun = max(self.overrun, time.perf_counter() - start - given)
        return rate


@contextlib.contextmanager
def rank_share(cpus: int) -> Iterator[None]:
    """Pin this process (and so the loader workers it starts) to one rank's share of the CPUs while timing.

    With ``--devices 8`` on 16 CPUs a rank's loader gets 2 CPUs in training; timing it alone on all 16 would
    overstate it. Not thread-safe: it changes the whole process's affinity and torch's intra-op threads.
    """
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    if cpus >= len(before):
        yield
        return
    os.sched_setaffinity(0, sorted(before)[:cpus])
    # more intra-op threads than CPUs spin against each other
    torch.set_num_threads(min(threads, cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def sweep_counts(share: int, workers: int) -> list[int]:
    """Worker counts to try for one rank with ``share`` CPUs: none, a few, the per-rank count, one per CPU."""
    counts = {1, max(1, share // 2), workers, share}
    if share <= 2:
        counts.add(0)
    return sorted(counts)
