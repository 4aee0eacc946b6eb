#!/usr/bin/env bash
# Create .venv and install the package with its dev tools, torch pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch, torchvision, lightning_fastdata; print('fastdata ready: torch', torch.__version__, 'torchvision', torchvision.__version__)"
