"""Benchmark scripts run from a checkout (``python -m benchmarks.NAME``); their results go to ``benchmarks/results``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["REPO", "old_worktree", "record"]

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def old_worktree(rev: str, tmp: Path) -> Iterator[Path]:
    """``rev`` checked out in a git worktree under ``tmp`` with its own build of the JPEG extension; removed after.

    What an interleaved A/B runs its "old" side in (``benchmarks/ab_decode.py``, ``benchmarks/ab_suites.py``).
    """
    old = tmp / "old"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), rev], cwd=REPO, check=True)
    try:
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=old, check=True, capture_output=True)
        yield old
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False)


def record(path: str | None, machine_note: str = "", **fields: Any) -> dict[str, Any]:
    """The result every script here returns: the date, the machine, then ``fields``; written as JSON to ``path``.

    Args:
        path: The script's ``--json`` (``None``: not written).
        machine_note: How the script used the machine (e.g. "timed on one CPU"), after its CPU count.
        **fields: The script's own figures, in the order they should appear.
    """
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs" + (f" ({machine_note})" if machine_note else "")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": machine, **fields}
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n")
    return result
