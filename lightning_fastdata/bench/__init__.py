"""The benchmark harness behind ``fastdata bench`` and ``python -m benchmarks.loaders`` (see ``loaders``)."""

from lightning_fastdata.bench.loaders import main

__all__ = ["main"]
