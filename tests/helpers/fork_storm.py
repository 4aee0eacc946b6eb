"""Fork while C threads keep entering Python for the first time; report how many children never got out of fork().

Each C thread (``pthread_create`` through ctypes) calls a Python function, so CPython makes it a thread state
(``PyGILState_Ensure`` -> ``PyThreadState_New``, under the runtime's thread-state lock and without the GIL), and starts
the next thread before it ends: what torch's gloo work thread does after every collective. argv: FORKS CHAINS GUARD
(``1``: import the package, which installs its fork guard; ``0``: plain interpreter). Prints ``forks=N hung=H``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

if __name__ == "__main__":
    forks, chains, guard = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    if guard:
        import lightning_fastdata  # noqa: F401 - installs the guard
    libc = ctypes.CDLL(None)
    thread_fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    running = [True]

    def start() -> None:
        tid = ctypes.c_ulong()
        libc.pthread_create(ctypes.byref(tid), None, entry, None)
        libc.pthread_detach(tid)

    def body(_: object) -> None:
        if running[0]:
            start()

    entry = thread_fn(body)
    for _ in range(chains):
        start()
    hung = done = 0
    while done < forks and not hung:
        done += 1
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:  # deadlocked inside os.fork() in the child
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.0005)
    running[0] = False
    print(f"forks={done} hung={hung}", flush=True)
