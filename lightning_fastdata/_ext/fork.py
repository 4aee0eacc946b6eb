"""The fork guard: no process that imported the package forks while another thread holds CPython's thread-state lock.

CPython 3.10 and 3.11 before 3.11.10 deadlock the child of ``fork()`` when, at that moment, another thread holds the
runtime's thread-state lock (gh-112275): the child waits forever inside ``os.fork()``, and a ``DataLoader`` worker
forked so never starts while its parent waits for it. The lock is taken without the GIL by a C thread entering
Python; torch's gloo work thread does so after every collective, so a DDP rank that forks its loader workers right
after an all-reduce hung one run in a few (``_ext/forkguard.c`` says how). :func:`install_fork_guard` registers the
compiled guard (``pthread_atfork`` handlers holding the lock across ``fork``), once per process, at the package's
import; elsewhere (3.12+, or no compiler at install time) it does nothing.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["fork_guard_needed", "install_fork_guard"]


def fork_guard_needed() -> bool:
    """Whether this interpreter has the fork deadlock the guard prevents (CPython 3.10, and 3.11 before 3.11.10)."""
    return sys.implementation.name == "cpython" and (3, 10) <= sys.version_info < (3, 11, 10)


def install_fork_guard() -> bool:
    """Register the guard in this process if this interpreter needs it; whether it is registered."""
    if not fork_guard_needed():
        return False
    try:
        guard = importlib.import_module("lightning_fastdata._ext._forkguard")
    except ImportError:  # installed without a compiler: the workers' start bound still names a stuck worker
        return False
    return bool(guard.install())
