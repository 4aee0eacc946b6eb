"""The object-store helper process: makes obstore's calls for a process that must never run obstore itself.

obstore's runtime (tokio) does not survive ``fork``, and the process that starts DataLoader workers forks them, so
it never runs obstore (see :mod:`lightning_fastdata.loading.storage.object_store`). Its calls (listing, HEAD, downloads,
reads with ``num_workers=0``) go over a pipe to this helper, forked once, on first use, while that process is still
clean; the helper runs them with obstore directly and sends back the answers.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Helper", "allow_direct_calls", "direct_calls_allowed", "first_line", "helper"]

T = TypeVar("T")

_direct_pid: int | None = None


def allow_direct_calls() -> None:
    """Declare that this process forks no workers, so it may run obstore itself (a build-pool initialiser)."""
    global _direct_pid
    _direct_pid = os.getpid()


def direct_calls_allowed() -> bool:
    """Whether :func:`allow_direct_calls` was called in this process (not inherited through ``fork``)."""
    return _direct_pid == os.getpid()


def first_line(err: BaseException) -> str:
    """The error's first line, without the server's XML body (obstore appends a debug dump)."""
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line.split(": <?xml")[0][:300]


class Helper:
    """A process forked (once, on first use) from the clean main process that makes its obstore calls.

    Calls are serialised (one at a time, under a lock); each one is itself concurrent inside the helper. The
    helper is stopped at exit as a daemon, and ends by itself when this process ends any other way (SIGKILL,
    ``os._exit``): when its pipe closes, or, within :data:`_PARENT_CHECK_S`, when its parent is gone (processes
    forked from this one later, such as loader workers, also hold the pipe open while they live).
    """

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_helper_main, args=(child, self.conn, os.getpid()), daemon=True, name="fastdata-object-store"
        )
        self.process.start()
        child.close()
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run in the helper process; its result or its exception comes back."""
        with self.lock:
            try:
                self.conn.send((fn, args))
                ok, value = self.conn.recv()
            except (EOFError, OSError) as err:
                raise OSError(
                    f"The object-store helper process (pid {self.process.pid}) ended unexpectedly "
                    f"(exit code {self.process.exitcode}); the call {fn.__name__} was not completed."
                ) from err
        if not ok:
            raise value
        return value


_PARENT_CHECK_S = 2.0
"""How often an idle object-store helper checks that the process it serves still exists."""


def _helper_main(conn: Any, parent_end: Any, parent_pid: int) -> None:
    gc.freeze()  # the parent's objects copied by the fork are never collected here (their owners live there)
    parent_end.close()  # forked with the parent's end open: it would never see the pipe close
    _close_inherited_fds(keep=conn.fileno())
    allow_direct_calls()
    while True:
        try:
            if not conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent_pid:  # reparented: the process it served is gone
                    return
                continue
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = (True, fn(*args))
        except BaseException as err:  # noqa: BLE001 - sent back to the caller, which raises it
            reply = (False, err if _picklable(err) else OSError(first_line(err)))
        conn.send(reply)


def _close_inherited_fds(keep: int) -> None:
    """Close the pipes and sockets the fork copied from the parent, but ``keep`` (the helper's own pipe).

    Held in a forked child for the parent's lifetime, a pipe the parent's program opened (to a subprocess it
    started, say) would never see its end: the subprocess waiting for EOF on its stdin would wait as long as the
    helper lives; a socket would stay connected. Files stay open: a shared-memory tensor the parent held at the fork
    (a loader's batch) owns its file's descriptor, and torch aborts the process when it frees such a tensor whose
    descriptor was closed underneath it.
    """
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every descriptor number up to the limit
        fds = list(range(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536))
    for fd in fds:
        if fd <= 2 or fd == keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # not open (or /proc's own listing descriptor, closed by now)
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.close(fd)


def _picklable(err: BaseException) -> bool:
    import pickle

    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001 - any failure means no
        return False
    return True


_helpers: dict[int, Helper] = {}
_helpers_lock = threading.Lock()


def helper() -> Helper:
    """This process's helper, started (forked) on first use and again if it died."""
    with _helpers_lock:
        found = _helpers.get(os.getpid())
        if found is None or not found.process.is_alive():
            found = _helpers[os.getpid()] = Helper()
        return found
