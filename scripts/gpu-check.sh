#!/usr/bin/env bash
# The GPU check: the CUDA tests and the GPU benchmark (benchmarks/gpu.py), from a clean checkout.
#
#   bash scripts/gpu-check.sh stage     # where there is a network: wheels and the libjpeg-turbo .debs into .gpu-stage/
#   bash scripts/gpu-check.sh diagnose --out DIR   # ~5 min on one H100: CUDA tests, the recipe part at short epochs,
#                                                  # its reference loader, four variants, the op recorder
#   bash scripts/gpu-check.sh prove --out DIR      # ~9 min after diagnose on the same machine (its data kept):
#                                                  # the CUDA tests, then ImageNet-length epochs (500 steps of 256),
#                                                  # 3 each (reference: 2)
#   bash scripts/gpu-check.sh device-decode --out DIR  # ~3 min: nvJPEG on the GPU vs the workers' decode, fed to
#                                                    # ResNet-50, on 2,000 large q95 photos (1000x750) x 8 links
#   bash scripts/gpu-check.sh [--parts tests,fed,mechanisms,correctness,decode,recipe,scale,device-decode]
#                             [--out DIR] [--data DIR] [--images N] [--copies K] [--large-images N]
#                             [--large-copies K] [--quick] [-- BENCH-ARGS]
#
# The run mode needs no network. It installs what .gpu-stage/ holds (if present) into /tmp, builds the ROI JPEG
# decoder in place if it is not built, generates an ImageNet-like folder (N photo-like JPEGs, 1,000 classes), runs
# `pytest -m cuda`, then the benchmark parts (BENCH-ARGS go to `python -m benchmarks.gpu`, e.g.
# `-- --folder-workers 12,9 --scale-workers 8,15`), and writes gpu.json, cuda-tests.txt/.xml and gpu-check.log to
# --out (default benchmarks/results). --copies K hard-links each generated image K times in its class folder
# (generating is the slow step, ~20 images/s a core): ImageNet-length epochs (>= 500 steps of 256) from
# N x K files, each decoded as its own sample; the page cache holds one copy. The data stays in --data (default /tmp/fastdata-gpu), so a second run with other --parts reuses it. Without a GPU it says so and runs
# everything on the CPU; --quick (tiny data and model, output to DATA/results) is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.gpu-stage

if [ "${1:-}" = stage ]; then
  rm -rf "$STAGE" && mkdir -p "$STAGE/wheels" "$STAGE/deb"
  # what the device image lacks (it has torch, torchvision, lightning, h5py, pillow, pytest, pyyaml, requests)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$STAGE/wheels" \
    torchdata==0.11.0 jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.14.0
  (cd "$STAGE/deb" && { apt-get download libjpeg62-turbo-dev libjpeg62-turbo 2>/dev/null \
    || { apt-get update -q >/dev/null && apt-get download libjpeg62-turbo-dev libjpeg62-turbo; }; })
  du -sh "$STAGE"; ls "$STAGE"/*
  exit 0
fi

PARTS=tests,fed,mechanisms,correctness,decode,recipe,scale,device-decode
OUT=""
DATA=/tmp/fastdata-gpu
IMAGES=20000
COPIES=1
LARGE_IMAGES=2000
LARGE_COPIES=1
QUICK=""
EXTRA=()
# the two prepared commands of the recipe's GPU issue; the arguments given after them still win (--out, --parts,
# and BENCH-ARGS after --, which come after the preset's)
PRESET=()
case "${1:-}" in
  diagnose) shift; set -- --parts tests,recipe --images 4000 --copies 34 "$@"
    PRESET=(--steps 60 --epochs 2 --recipe-variants graphed,static-policy,policy-in-workers,policy-in-workers-14w,policy-in-workers-13w) ;;
  prove) shift; set -- --parts tests,recipe --images 4000 --copies 34 "$@"
    PRESET=(--steps 500 --epochs 3 --reference-epochs 2 --no-recipe-diagnose --recipe-variants policy-in-workers) ;;
  device-decode) shift; set -- --parts device-decode --images 4000 --copies 34 --large-images 2000 --large-copies 8 "$@"
    PRESET=(--steps 60 --epochs 2) ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    run) ;;
    --parts) PARTS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --data) DATA=$2; shift ;;
    --images) IMAGES=$2; shift ;;
    --copies) COPIES=$2; shift ;;
    --large-images) LARGE_IMAGES=$2; shift ;;
    --large-copies) LARGE_COPIES=$2; shift ;;
    --quick) QUICK=--quick ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "gpu-check.sh: unknown argument $1 (see the comment at the top of scripts/gpu-check.sh)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$OUT" ]; then OUT=$([ -n "$QUICK" ] && echo "$DATA/results" || echo benchmarks/results); fi
mkdir -p "$OUT" "$DATA"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1

PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$STAGE/wheels" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fastdata-site \
    "$STAGE"/wheels/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/fastdata-site"
fi
if [ -d "$STAGE/deb" ] && [ ! -f /usr/include/jpeglib.h ]; then
  for f in "$STAGE"/deb/*.deb; do dpkg -x "$f" /tmp/fastdata-jpeg; done  # not into /: it could break the image
  J=/tmp/fastdata-jpeg/usr
  export CPATH="$J/include:$J/include/x86_64-linux-gnu" LIBRARY_PATH="$J/lib/x86_64-linux-gnu"
  export LDFLAGS="-Wl,-rpath,$J/lib/x86_64-linux-gnu"
fi
# the decoder's check imports no torch; the version line imports torch alone (each import costs seconds)
ROI='from lightning_fastdata._ext import native; raise SystemExit(0 if native.jpegroi is not None else 1)'
"$PY" -c "$ROI" 2>/dev/null || "$PY" setup.py -q build_ext --inplace >/dev/null
"$PY" - <<'EOF'
from importlib.metadata import version
import torch
from lightning_fastdata._ext import native
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none: everything runs on the CPU"
print(f"gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {version('torchvision')}, "
      f"GPU {gpu}, ROI JPEG decoder {'built' if native.jpegroi is not None else 'MISSING (slower fallback)'}")
EOF

NPROC=$(nproc)
if [ -n "$QUICK" ]; then
  ROOT=$DATA/quick
  "$PY" -m lightning_fastdata.cli make-data "$ROOT" --num-classes 4 --per-class 12 --processes 2
else
  ROOT=$DATA/imagenet-like-$IMAGES
  "$PY" -m lightning_fastdata.cli make-data "$ROOT" --num-classes 1000 --per-class $((IMAGES / 1000)) --processes "$NPROC"
fi
# each image of folder $1 hard-linked $3 times into folder $2 (once: a .complete marker), as its own file name
link_copies() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import os, sys
src, dst, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not os.path.exists(os.path.join(dst, ".complete")):
    for c in sorted(e.name for e in os.scandir(src) if e.is_dir() and not e.name.startswith(".")):
        os.makedirs(os.path.join(dst, c), exist_ok=True)
        for f in os.listdir(os.path.join(src, c)):
            stem, ext = os.path.splitext(f)
            for i in range(k):
                link = os.path.join(dst, c, f"{stem}.c{i}{ext}")
                if not os.path.exists(link):
                    os.link(os.path.join(src, c, f), link)
    open(os.path.join(dst, ".complete"), "w").close()
print(f"gpu-check: {dst}: each image of {src} linked {k} times")
EOF
}
if [ "$COPIES" -gt 1 ]; then
  link_copies "$ROOT" "$ROOT-x$COPIES" "$COPIES"
  ROOT=$ROOT-x$COPIES
fi
LARGE_ARGS=()
if [[ ",$PARTS," == *,device-decode,* ]]; then
  # large quality-95 photos (1000x750, the CPU benchmarks' large set), where the workers' decode is the limit
  LARGE=$DATA/large-q95-$([ -n "$QUICK" ] && echo quick || echo "$LARGE_IMAGES")
  "$PY" - "$LARGE" "$([ -n "$QUICK" ] && echo 24 || echo "$LARGE_IMAGES")" "$NPROC" <<'EOF'
import os, sys
from lightning_fastdata.demos import make_image_folder
root, count, procs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if not os.path.exists(os.path.join(root, ".complete")):
    n = min(100, max(2, count // 12))
    make_image_folder(root, num_classes=n, per_class=count // n, size=(1000, 750), quality=95, processes=procs)
    open(os.path.join(root, ".complete"), "w").close()
print(f"gpu-check: {root}: large quality-95 photos")
EOF
  if [ "$LARGE_COPIES" -gt 1 ]; then
    link_copies "$LARGE" "$LARGE-x$LARGE_COPIES" "$LARGE_COPIES"
    LARGE=$LARGE-x$LARGE_COPIES
  fi
  LARGE_ARGS=(--large-root "$LARGE")
fi

if [[ ",$PARTS," == *,tests,* ]]; then
  set +e
  # --quick (CI, no GPU) collects the CUDA tests' own file only: collecting the whole suite took longer than the rest
  "$PY" -m pytest "$([ -n "$QUICK" ] && echo tests/test_cuda.py || echo tests)" -m cuda -q -p no:cacheprovider \
    -o addopts=-ra --junitxml="$OUT/cuda-tests.xml" \
    2>&1 | tee "$OUT/cuda-tests.txt"
  TESTS_RC=${PIPESTATUS[0]}
  set -e
  echo "gpu-check: CUDA tests exit code $TESTS_RC"
fi
BENCH=$(echo ",$PARTS," | sed 's/,tests,/,/; s/^,//; s/,$//')
if [ -n "$BENCH" ]; then
  "$PY" -m benchmarks.gpu --root "$ROOT" --scratch "$DATA/scratch" \
    --json "$OUT/gpu.json" --parts "$BENCH" $QUICK "${LARGE_ARGS[@]}" "${PRESET[@]}" "${EXTRA[@]}"
fi
echo "gpu-check: done; results in $OUT"
exit "${TESTS_RC:-0}"
