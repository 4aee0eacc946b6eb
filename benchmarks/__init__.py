"""Benchmark scripts run from a checkout (``python -m benchmarks.NAME``); their results go to ``benchmarks/results``."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["record"]


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
