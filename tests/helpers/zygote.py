"""A fork server for process-level tests: imports torch and Lightning once, then forks a fresh child per run.

Each child is a new process, as a rerun after a crash is: its own memory, loader workers, RNG state and
Trainer, nothing left of an earlier run (this server only imported modules and never trained). Sharing the
imports saves ~5 s of the ~6 s a process start costs on 2 cores. DDP runs (which relaunch ``sys.argv``) do not
come here.

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
import sys
import traceback
from typing import Any

import resume_run


def _serve(request: dict[str, Any]) -> int:
    if "cfg" in request:
        resume_run.main(request["cfg"])
        return 0
    os.chdir(request["cwd"])
    os.environ.update(request.get("env", {}))
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


if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("exit"):  # not EOF: a loader worker forked by the test process may hold our stdin open
            break
        pid = os.fork()
        if pid == 0:
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
