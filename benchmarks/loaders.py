"""Run the benchmark from a checkout: ``python -m benchmarks.loaders [--root DIR] [--json PATH] [--plot PATH]``.

The harness lives in ``lightning_fastdata/bench/`` so that ``fastdata bench`` (same arguments) works wherever the
package is installed; this module is the same command for people who look in ``benchmarks/`` first.
"""

from lightning_fastdata.bench.loaders import main

if __name__ == "__main__":
    main()
