#!/usr/bin/env bash
# The test suite against the oldest dependency versions pyproject.toml claims (constraints-floor.txt), in its own
# environment (.venv-floor, ~5 GB: torch's CUDA wheels). Not part of CI (the install alone takes minutes); run it
# when a floor in pyproject.toml changes. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-floor/bin/python ] || "$PYTHON" -m venv .venv-floor
.venv-floor/bin/python -m pip install -q --disable-pip-version-check -c constraints-floor.txt -e '.[dev]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv-floor/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|torchvision|torchdata|lightning|numpy|pillow|h5py|jsonargparse) '
.venv-floor/bin/python -m pytest -q -p no:cacheprovider "$@"
