#!/usr/bin/env bash
# The whole test suite: lint, types, the docs site, tests. Run after setup.sh (the README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check lightning_fastdata tests benchmarks scripts setup.py
.venv/bin/ruff format --check lightning_fastdata tests benchmarks scripts setup.py
# the types and the site at once (each keeps one core busy for ~30 s); the site without executing the notebooks
# (tests/test_notebooks.py runs them below); mypy's report printed after the site's
MYPY_LOG=$(mktemp)
trap '[ -z "${MYPY_PID:-}" ] || kill "$MYPY_PID" 2>/dev/null; rm -f "$MYPY_LOG"' EXIT  # a failed step stops mypy
.venv/bin/mypy >"$MYPY_LOG" 2>&1 &
MYPY_PID=$!
FASTDATA_DOCS_RUN_NOTEBOOKS=0 bash scripts/docs.sh
MYPY_RC=0
wait "$MYPY_PID" || MYPY_RC=$?
MYPY_PID=""
cat "$MYPY_LOG"
[ "$MYPY_RC" -eq 0 ]
# two test processes (pytest-xdist): on the 2-core CI machine the suite is ~1.2x faster than one, as many tests
# wait on subprocesses and servers; FASTDATA_TEST_WORKERS=0 runs it in one process
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${FASTDATA_TEST_WORKERS:-2}" --dist worksteal --durations=25 "$@"
# the release steps: sdist and repaired wheel, installed and run without compiler or headers, the source build
# without headers and without a compiler, and the sanitizer fuzz run (FUZZ_SECONDS); only for the whole suite
if [ $# -eq 0 ]; then FUZZ_SECONDS=${FUZZ_SECONDS:-20} bash scripts/release.sh; fi
