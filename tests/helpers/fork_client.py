"""The test side of ``zygote.py``: one fork server for the whole session, started on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HELPERS = Path(__file__).parent


class ForkServer:
    """Runs each request as a fresh process forked from a server that has torch and Lightning imported."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None

    def request(self, request: dict[str, Any]) -> tuple[int, str]:
        """Run one request (see ``zygote.py``); return the child's exit code and its output."""
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen(
                [sys.executable, str(HELPERS / "zygote.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=HELPERS,
            )
        assert self.server.stdin is not None and self.server.stdout is not None
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        code = int(self.server.stdout.readline())
        return code, Path(request["log"]).read_text()

    def command(
        self,
        argv: list[str],
        cwd: Path,
        log: Path,
        env: dict[str, str] | None = None,
        module: str | None = None,
        finalize: bool = False,
        procs: list[dict[str, Any]] | None = None,
    ) -> tuple[int, str]:
        """``python SCRIPT ARGV...`` (``argv[0]`` is the script), or ``python -m MODULE ARGV...``, in ``cwd``.

        ``finalize``: the script's process ends through the interpreter's shutdown, as a script's does. ``procs``:
        one process each, at once: ``{"env": {...}, "argv": [...]}`` (its environment added to ``env``, its
        arguments instead of ``argv[1:]`` if given); the exit code is the first's, or a failed one's; the output is
        every process's.
        """
        request: dict[str, Any] = {"cwd": str(cwd), "env": env or {}, "path": [str(HELPERS)], "log": str(log)}
        if finalize:
            request["finalize"] = True
        if procs:
            request["procs"] = procs
        if module is None:
            request.update(script=argv[0], argv=argv[1:])
        else:
            request.update(module=module, argv=argv)
        return self.request(request)

    def close(self) -> None:
        """End the server by a message, not by closing its stdin: a process forked from this one (a DataLoader
        worker a test left alive until the garbage collector frees its loader) holds the pipe open, and the
        server would never see the end of its input."""
        if self.server is not None:
            if self.server.poll() is None and self.server.stdin is not None:
                self.server.stdin.write(json.dumps({"exit": True}) + "\n")
                self.server.stdin.flush()
            self.server.communicate(timeout=60)
            self.server = None


def rank_procs(n: int) -> list[dict[str, Any]]:
    """The ``procs`` of an ``n``-rank run on one node: each rank's environment, as ``torchrun`` gives a script's."""
    from benchmarks.s3_server import free_ports

    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0]), "WORLD_SIZE": str(n), "NODE_RANK": "0"}
    return [{"env": {**common, "RANK": str(k), "LOCAL_RANK": str(k)}} for k in range(n)]


SERVER = ForkServer()
