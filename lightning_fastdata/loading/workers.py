"""Worker-process setup and the CPU budget that ``num_workers="auto"`` divides."""

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from lightning_fastdata.errors import InvalidValueError

__all__ = ["CpuBudget", "init_build_process", "init_worker", "process_cpu_seconds", "resolve_num_workers"]


def init_worker(worker_id: int) -> None:
    """Give a loader worker one intra-op thread and seed ``random``/numpy from torch's per-worker seed.

    torch seeds each worker with ``base_seed + worker_id``, where ``base_seed`` comes from the loader's
    generator; seeding ``random`` and numpy from it makes any user randomness deterministic too.

    First it freezes what the worker inherited (``gc.freeze()``): a forked worker holds a copy of every object
    of the training process, garbage in reference cycles included. Collected in the worker, a CUDA object among
    them runs its finalizer there, where CUDA cannot be used, and the worker aborts ("CUDA error: initialization
    error", seen on an H100 once the training process had decoded on the GPU). Frozen objects are never
    collected in the worker (the training process frees its own); the collector also stops touching those pages,
    which keeps them shared instead of copied.
    """
    gc.freeze()
    torch.set_num_threads(1)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def init_build_process() -> None:
    """Initialise a process of a build pool (cache build, HDF5 conversion): one intra-op thread.

    One process per CPU already uses every core; and a process forked after its parent ran a parallel torch op
    can hang in the OpenMP runtime at its first parallel region (seen: the benchmark's HDF5 conversion after the
    folder suite). With one thread torch runs every op inline and never enters that runtime.
    """
    torch.set_num_threads(1)


def _read_cgroup_quota(root: str) -> float | None:
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``), or ``None`` if unlimited."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs this process may use: its affinity set, capped by the cgroup quota.

    ``os.cpu_count()`` and ``sched_getaffinity`` both ignore the container quota; this reads it. Construct
    it with fake values in tests.

    Args:
        affinity: Number of CPUs in the process's affinity mask.
        quota: CPUs granted by the cgroup quota, or ``None`` when there is none.
    """

    affinity: int
    quota: float | None = None

    @classmethod
    def detect(cls, cgroup_root: str = "/sys/fs/cgroup") -> CpuBudget:
        """Read this process's affinity and cgroup quota."""
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return cls(affinity=affinity, quota=_read_cgroup_quota(cgroup_root))

    @property
    def usable(self) -> int:
        """Whole CPUs usable (at least 1)."""
        cpus = float(self.affinity) if self.quota is None else min(float(self.affinity), self.quota)
        return max(1, int(cpus))


def resolve_num_workers(num_workers: int | str, devices_per_node: int = 1, budget: CpuBudget | None = None) -> int:
    """Resolve ``"auto"`` to ``usable_cpus // devices_per_node - 1`` (one CPU left for the main process).

    Lightning's ``suggested_max_num_workers`` is the same formula on the affinity count alone (and at least 1);
    ``usable_cpus`` here is that count capped by the cgroup quota, so this is never more than Lightning's
    suggestion, and less where a container's quota is below its affinity.

    Args:
        num_workers: A worker count (returned as it is) or ``"auto"``.
        devices_per_node: Ranks sharing this node's CPUs.
        budget: The CPUs to share; ``None``: :meth:`~lightning_fastdata.CpuBudget.detect`.

    Raises:
        ValueError: If ``num_workers`` is negative or a string other than ``"auto"``.
    """
    if isinstance(num_workers, str):
        if num_workers != "auto":
            raise InvalidValueError(f"num_workers should be a non-negative int or 'auto', got {num_workers!r}.")
        budget = budget or CpuBudget.detect()
        return max(0, budget.usable // max(1, devices_per_node) - 1)
    if num_workers < 0:
        raise InvalidValueError(
            f"num_workers option should be non-negative, got {num_workers!r}; use num_workers=0 to disable "
            "multiprocessing."
        )
    return num_workers


def process_cpu_seconds(pids: list[int]) -> float | None:
    """The CPU time (user + system) the processes ``pids`` have used so far, summed; ``None`` where unreadable.

    Read from ``/proc/<pid>/stat`` (Linux); a process gone meanwhile counts 0.
    """
    if not os.path.isdir("/proc/self"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the whole line)
    return total / tick
