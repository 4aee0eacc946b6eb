#!/usr/bin/env bash
# The whole test suite: lint, types, the docs site, tests. Run after setup.sh (the README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check lightning_fastdata tests benchmarks scripts setup.py
.venv/bin/ruff format --check lightning_fastdata tests benchmarks scripts setup.py
.venv/bin/mypy
bash scripts/docs.sh
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
