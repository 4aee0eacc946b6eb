"""The benchmark harness behind ``fastdata bench`` and ``python -m benchmarks.loaders`` (see ``loaders``).

The package imports nothing itself: a suite's module (or ``python -m benchmarks.probes``, which the
scale suite starts once per measurement) loads only what it uses, not every suite's DataModules and Lightning.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``fastdata bench``: see :func:`lightning_fastdata.bench.loaders.main`."""
    from lightning_fastdata.bench.loaders import main as run

    return run(argv)
