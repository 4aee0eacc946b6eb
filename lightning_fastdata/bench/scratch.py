"""Where the suites keep what they build from the benchmark folder."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["scratch_path"]


def scratch_path(args: argparse.Namespace, name: str) -> Path:
    """Where a suite keeps a file or folder it builds from ``args.root``: in ``args.scratch``, never beside the data."""
    return Path(args.scratch) / f"{Path(args.root).name}-{name}"
