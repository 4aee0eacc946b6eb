"""A fork server for process-level tests: imports torch and Lightning once, then forks a fresh child per run.

Each child is a new process, as a rerun after a crash is: its own memory, loader workers, RNG state and
Trainer, nothing left of an earlier run (this server only imported modules and never trained). Sharing the
imports saves ~5 s of the ~6 s a process start costs on 2 cores.

Several processes at once: a request may carry ``"procs": [{"env": {...}, "argv": [...]}, ...]``, one child each,
forked together (its environment added to the request's, its ``argv`` instead of the request's if given): a DDP
run of ``resume_run`` whose ranks are told their rank by the environment as ``torchrun`` tells a script's
(``fork_client.rank_procs``; Lightning then launches no process of its own), or the simulated nodes of
``test_ddp.py``, whose one-node DDP runs keep Lightning's own launcher (it relaunches ``sys.argv`` as scripts).
Their output goes to one log, appended; the answer is the first one's exit code, or a failed one's.

Protocol: one JSON line per run on stdin, either ``{"cfg": {...}, "log": path}`` (``resume_run.main(cfg)``) or
``{"script": path | "module": name, "argv": [...], "cwd": dir, "env": {...}, "path": [...], "log": path}`` (run
as ``python SCRIPT ARGV...`` / ``python -m MODULE ARGV...`` would); the child's stdout and stderr go to ``log``;
``{"exit": true}`` ends the server; the answer is one line: the child's exit code (negative: the signal that killed
it). With ``"finalize": true`` a
script runs in the real ``__main__`` (its globals live until shutdown, as a script's do) and the child ends
through the interpreter's shutdown (atexit handlers, module teardown, daemon threads stopped) instead of
``os._exit``: for tests of what happens at exit.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import time
import traceback
from typing import Any

import resume_run


def _serve(request: dict[str, Any]) -> int:
    os.environ.update(request.get("env", {}))
    if "cfg" in request:
        resume_run.main(request["cfg"])
        return 0
    os.chdir(request["cwd"])
    sys.path[:0] = request.get("path", [])
    sys.argv = [request.get("script") or request["module"], *request["argv"]]
    try:
        if "script" in request and request.get("finalize"):
            # run_path's temporary module would free the script's globals, and what they hold, before shutdown.
            main = sys.modules["__main__"].__dict__
            main["__file__"] = path = request["script"]
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), main)
        elif "script" in request:
            runpy.run_path(request["script"], run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as err:  # as the interpreter maps it
        return err.code if isinstance(err.code, int) else 0 if err.code is None else 1
    return 0


#: Seconds the other ranks of a DDP run get to end after one of them failed, before they are killed (a rank
#: waiting in a collective for a dead peer would otherwise wait for the process group's timeout).
GRACE_S = 20


def _wait_ranks(pids: list[int]) -> int:
    """Wait for every rank; rank 0's exit code, or the first failure's if rank 0 succeeded."""
    codes: dict[int, int] = {}
    failed_at: float | None = None
    while len(codes) < len(pids):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in pids:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and failed_at is None:
                failed_at = time.monotonic()
            continue
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for p in pids:
                if p not in codes:
                    os.kill(p, signal.SIGKILL)
            failed_at = float("inf")  # killed once; their statuses come in the loop above
        time.sleep(0.05)
    first = codes[pids[0]]
    return first if first != 0 else next((c for c in codes.values() if c != 0), 0)


def _child(request: dict[str, Any], rank: int | None) -> None:
    """A forked run: its output to the log (appended by every rank of a DDP run), then its exit."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if rank is None else os.O_APPEND)
    log = os.open(request["log"], flags, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        code = _serve(request)
    except BaseException:  # noqa: BLE001 - report whatever ended the run, as a process would
        traceback.print_exc()
        code = 1
    if request.get("finalize"):
        sys.exit(code)  # out of the loop: the interpreter shuts down as after any script
    gc.collect()  # loaders' iterators shut their workers down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("exit"):  # not EOF: a loader worker forked by the test process may hold our stdin open
            break
        procs = request.get("procs")
        if procs:  # several processes at once (a DDP run's ranks, or nodes), each with its own environment
            open(request["log"], "w").close()
            pids = []
            for k, proc in enumerate(procs):
                pid = os.fork()
                if pid == 0:
                    _child({**request, **proc, "env": {**request.get("env", {}), **proc.get("env", {})}}, k)
                pids.append(pid)
            print(_wait_ranks(pids), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            _child(request, None)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
