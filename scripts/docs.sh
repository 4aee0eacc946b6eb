#!/usr/bin/env bash
# Build the documentation site into docs/_build/html (warnings are errors: a broken link or reference fails).
# Needs the `docs` extra (setup.sh installs it). Open docs/_build/html/index.html afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m sphinx -E -W --keep-going -q -b html docs docs/_build/html "$@"
echo "docs: docs/_build/html/index.html"
