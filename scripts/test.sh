#!/usr/bin/env bash
# The whole test suite: lint, types, the docs site, tests. Run after setup.sh (the README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check lightning_fastdata tests benchmarks scripts setup.py
.venv/bin/ruff format --check lightning_fastdata tests benchmarks scripts setup.py
.venv/bin/mypy
bash scripts/docs.sh
# two test processes (pytest-xdist): on the 2-core CI machine the suite is ~1.2x faster than one, as many tests
# wait on subprocesses and servers; FASTDATA_TEST_WORKERS=0 runs it in one process
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${FASTDATA_TEST_WORKERS:-2}" --durations=25 "$@"
