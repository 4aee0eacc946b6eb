#!/usr/bin/env bash
# Create .venv and install the package with its dev and docs tools, torch pinned by constraints.txt.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# libjpeg-turbo's headers, to link the compiled JPEG decoder against the system's library (without them, as without
# root, setup.py compiles it against the headers shipped in the package and it runs on Pillow's libjpeg-turbo).
if [ ! -f /usr/include/jpeglib.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { apt-get install -y -q libjpeg62-turbo-dev || { apt-get update -q && apt-get install -y -q libjpeg62-turbo-dev; }; } \
    >/dev/null 2>&1 || echo "setup.sh: could not install libjpeg62-turbo-dev; the decoder will use the shipped headers"
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,docs]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch, torchvision, lightning_fastdata; from lightning_fastdata import decoder_summary as d; print('fastdata ready: torch', torch.__version__, 'torchvision', torchvision.__version__, '| JPEG decoder:', d())"
