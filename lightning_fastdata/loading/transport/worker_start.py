"""A bound on a loader worker's start: past it, the worker that has not started is named and the run fails.

torch waits for a worker's next batch for as long as the worker lives (``DataLoader(timeout=0)``), and a worker that
never started lives: one deadlocked inside ``fork()`` (CPython gh-112275, :mod:`lightning_fastdata._ext.fork`), or
whose ``worker_init_fn`` waits on something that never comes. Each worker records its process id in a shared slot
once its initialiser has run (:class:`StartedWorkerInit`); a :class:`StartWatch` per ``iter()`` that forks workers
checks the slots until every worker has, or ``FASTDATA_WORKER_START_TIMEOUT`` seconds (default 300) have passed.
Past the bound it interrupts the main thread, and the loaders raise :class:`WorkerStartError` naming the workers
(never a rank that waits forever: in DDP the other ranks' launcher sees this one fail).
"""

from __future__ import annotations

import _thread
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["StartWatch", "StartedWorkerInit", "WorkerStartError", "raise_cause", "start_timeout"]

_DEFAULT_TIMEOUT = 300.0


class WorkerStartError(RuntimeError):
    """A loader worker did not start within the bound (its message names it and what to do)."""


def start_timeout() -> float:
    """Seconds a worker may take to start (``FASTDATA_WORKER_START_TIMEOUT``, default 300).

    Raises:
        ValueError: If the variable is set to something other than a positive number.
    """
    raw = os.environ.get("FASTDATA_WORKER_START_TIMEOUT", "")
    try:
        value = float(raw) if raw else _DEFAULT_TIMEOUT
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"FASTDATA_WORKER_START_TIMEOUT={raw!r}: expected a positive number of seconds, e.g. 300.")
    return value


class StartedWorkerInit:
    """A loader's ``worker_init_fn`` that records, after it ran, that its worker started (picklable, for ``spawn``).

    Args:
        inner: The loader's own ``worker_init_fn`` (called first), or ``None``.
        num_workers: The loader's workers (one slot each).
        context: The loader's ``multiprocessing_context`` (its shared slots are made in it).
    """

    def __init__(self, inner: Callable[[int], None] | None, num_workers: int, context: Any = None) -> None:
        self.inner = inner
        ctx = multiprocessing.get_context(context) if isinstance(context, str) or context is None else context
        self.slots = ctx.RawArray("q", num_workers)
        #: Each worker's process id from the moment it runs (before ``inner``): what the watch stops if need be.
        self.forked = ctx.RawArray("q", num_workers)

    def __call__(self, worker_id: int) -> None:
        """Run the loader's own initialiser, then record this worker's process id in its slot."""
        self.forked[worker_id] = os.getpid()
        if self.inner is not None:
            self.inner(worker_id)
        self.slots[worker_id] = os.getpid()

    def __repr__(self) -> str:
        return f"StartedWorkerInit({self.inner!r})"


class StartWatch:
    """Watches the workers one ``iter()`` forks start (made before it: torchdata waits for them inside ``iter()``).

    Past the bound with a worker not started, it records why (:meth:`cause`) and interrupts the main thread as
    Ctrl+C would (torch wakes from its wait within 5 s); the loaders turn that into :class:`WorkerStartError`.

    Args:
        init: The loader's :class:`StartedWorkerInit`; its slots are cleared here, the new workers fill them.
        num_workers: The workers ``iter()`` forks.
    """

    def __init__(self, init: StartedWorkerInit, num_workers: int) -> None:
        for k in range(num_workers):
            init.slots[k] = init.forked[k] = 0
        self.bound = start_timeout()
        # interrupt_main() does nothing where SIGINT is not Python's (ignored, or left to the system: nohup, some
        # launchers); there the workers that have not started are stopped instead, and torch's next status check
        # (within 5 s) raises, which the loaders turn into the same error
        self.interruptible = callable(signal.getsignal(signal.SIGINT))
        self.found: list[str] = []
        self.stopped = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(init, num_workers), name="fastdata-worker-start")
        watcher.daemon = True
        watcher.start()

    def _watch(self, init: StartedWorkerInit, num_workers: int) -> None:
        deadline = time.monotonic() + self.bound
        while not self.stopped.wait(0.2):
            waiting = [k for k in range(num_workers) if init.slots[k] == 0]
            if not waiting:
                return
            if time.monotonic() > deadline:
                named = ", ".join(f"worker {k}" for k in waiting)
                self.found.append(
                    f"DataLoader {named} had not started {self.bound:g} s after iter() forked it: a worker deadlocked "
                    "in fork() (CPython 3.10 and 3.11 before 3.11.10, where the package's fork guard was not built), "
                    "or a worker_init_fn that waits on something that never comes. The run stops instead of waiting "
                    "forever; set FASTDATA_WORKER_START_TIMEOUT higher if this loader's workers take longer to start."
                )
                if self.interruptible:
                    _thread.interrupt_main()
                    return
                for k in waiting:
                    pid = int(init.forked[k])
                    if pid:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                return

    def stop(self) -> None:
        """End the watch (the iterator is gone)."""
        self.stopped.set()

    def cause(self) -> str | None:
        """Why a worker did not start, once the bound has passed; else ``None``."""
        return self.found[0] if self.found else None


def raise_cause(err: BaseException, watch: StartWatch | None) -> None:
    """Raise :class:`WorkerStartError` from ``err`` if ``watch`` found a worker that did not start; else return."""
    cause = None if watch is None else watch.cause()
    if cause is not None:
        raise WorkerStartError(cause) from err
