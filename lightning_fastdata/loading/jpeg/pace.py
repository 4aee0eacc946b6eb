"""The pace of a background build: a bounded share of the CPUs while they are busy, what is idle while some are.

The entropy index's background builder
(:func:`~lightning_fastdata.loading.jpeg.entropy_index_build.start_background_build`) runs beside a training run's
loader. At ``nice 19`` alone (what it did before) it got almost no CPU on a machine the loader saturates, which is
every data-bound run, so the index was never built there. Paced, it works in bursts and sleeps between them:

- while the CPUs are busy, it uses ``BUILD_SHARE`` (2.5%) of the CPUs this process may use (at most one): a
  saturated loader loses about that much, and the build still ends;
- while it sleeps, it reads how long those CPUs were idle (``/proc/stat``); where at least ``IDLE_CPUS`` (half a
  CPU) was idle on average, its next burst is ``FREE_BURST_S`` (a quarter of a second) of work before it looks
  again: spare CPU is taken whole.

Where idle time cannot be read truthfully (no ``/proc/stat``, or a cgroup quota below the affinity set: the idle
CPUs then belong to other containers) only the share is used. The builder keeps the loader's own priority: at a
lower one it could not take its share of CPUs the loader saturates (and measured, nice 10 cost no less than nice 0).
One :class:`Pace` serves one thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lightning_fastdata.loading.workers import CpuBudget

__all__ = ["BUILD_SHARE", "InProcess", "Pace", "idle_cpu_seconds"]

#: The share of this process's usable CPUs a background build takes while they are busy (capped at one CPU).
BUILD_SHARE = 0.025
#: CPU seconds a build works, once it has seen idle CPUs, before it pauses to look again.
FREE_BURST_S = 0.25
#: The shortest pause: long enough for ``/proc/stat``'s clock ticks (10 ms) to tell idle from busy.
MIN_PAUSE_S = 0.05
#: CPUs idle on average during a pause for the next burst to be a free one.
IDLE_CPUS = 0.5


def idle_cpu_seconds(cpus: frozenset[int] | None = None) -> float | None:
    """Seconds the CPUs ``cpus`` (all where ``None``) have been idle since boot (idle + iowait, ``/proc/stat``).

    ``None`` where ``/proc/stat`` cannot be read (not Linux).
    """
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        ticks += int(fields[3]) + int(fields[4])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Pace:
    """Sleeps between pieces of a build's work as the module docstring says; call :meth:`step` after each piece.

    Args:
        share_cpus: CPUs the build may use while the machine is busy (``BUILD_SHARE`` of the usable ones).
        idle: Idle CPU seconds so far of the CPUs the build may use, or ``None`` where unknown (share only).
        sleep, clock, cpu_time: ``time.sleep``, ``time.monotonic`` and this process's CPU time (for tests).
    """

    share_cpus: float
    idle: Callable[[], float | None] = idle_cpu_seconds
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    cpu_time: Callable[[], float] = time.process_time
    free: bool = field(default=False, init=False)
    _mark: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._mark = self.cpu_time()  # the work counted from here

    @classmethod
    def for_this_process(cls, share: float = BUILD_SHARE) -> Pace:
        """The pace for the CPUs this process may use (its affinity set, capped by the cgroup quota)."""
        budget = CpuBudget.detect()
        share_cpus = min(1.0, share * budget.usable)
        if budget.quota is not None and budget.quota < budget.affinity:
            return cls(share_cpus, idle=lambda: None)  # the affinity set's idle time is not ours to take
        cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return cls(share_cpus, idle=lambda: idle_cpu_seconds(cpus))

    def step(self) -> float:
        """After a piece of work: sleep if the pace asks for it; returns the seconds slept (0.0: none)."""
        used = self.cpu_time() - self._mark
        if self.free and used < FREE_BURST_S:
            return 0.0
        pause = MIN_PAUSE_S if self.free else max(MIN_PAUSE_S, used * (1.0 / self.share_cpus - 1.0))
        before, start = self.idle(), self.clock()
        self.sleep(pause)
        after, slept = self.idle(), self.clock() - start
        self.free = before is not None and after is not None and slept > 0 and (after - before) / slept >= IDLE_CPUS
        self._mark = self.cpu_time()
        return slept


class InProcess:
    """A "pool" whose ``imap`` maps in this process (a background build: one process, no children), at ``pace``."""

    def __init__(self, pace: Pace | None = None) -> None:
        self.pace = pace

    def imap(self, fn: Callable[[Any], Any], jobs: Iterable[Any]) -> Iterator[Any]:
        """``fn`` of each job in order, :meth:`Pace.step` after each."""
        for job in jobs:
            yield fn(job)
            if self.pace is not None:
                self.pace.step()
