"""A fork server for the resume tests: imports torch and Lightning once, then forks a fresh child per run.

Each child is a new process, as a rerun after a crash is: its own memory, loader workers, RNG state and
Trainer, nothing left of an earlier run (this server only imported modules and never trained). Sharing the
imports saves ~5 s of the ~6 s a process start costs on 2 cores. DDP runs (which relaunch ``sys.argv``) do not
come here.

Protocol: one JSON line per run on stdin, ``{"cfg": {...}, "log": path}``; the child's stdout and stderr go to
``log``; the answer is one line: the child's exit code (negative: the signal that killed it).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

import resume_run

if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                resume_run.main(request["cfg"])
            except BaseException:  # noqa: BLE001 - report whatever ended the run, as a process would
                traceback.print_exc()
                code = 1
            gc.collect()  # loaders' iterators shut their workers down
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
