"""Builds the optional ROI JPEG decoder and the fork guard (``_ext/forkguard.c``); the rest is in pyproject.toml.

The extension links the system libjpeg-turbo where its headers are installed (Debian/Ubuntu:
``libjpeg62-turbo-dev`` or ``libjpeg-turbo8-dev``). Where they are not (no root to install them), it is compiled
against the libjpeg-turbo headers shipped in ``lightning_fastdata/_ext/libjpeg-turbo`` and links no libjpeg: at
import the package loads one already installed (Pillow's own copy, else the system's runtime library;
``lightning_fastdata/_ext/native.py``). ``FASTDATA_JPEG_HEADERS=vendored`` takes that path even where system
headers exist. If neither can be built (no C compiler), the install stops with what to do; with
``FASTDATA_ALLOW_NO_DECODER=1`` it goes on without the decoder, and decoding falls back to
``torchvision.io.decode_jpeg`` (slower; a training run warns once, and ``fastdata doctor`` says so).
"""

import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

VENDORED = "lightning_fastdata/_ext/libjpeg-turbo"


def _speed_without() -> str:
    """The measured speed without the decoder, from the one place that states it (native.WITHOUT_DECODER_SPEED)."""
    native = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_fastdata", "_ext", "native.py")
    with open(native, encoding="utf-8") as f:
        found = re.search(r'^WITHOUT_DECODER_SPEED = "([^"]+)"', f.read(), re.M)
    return found.group(1) if found else "half"


NOT_BUILT = """
================================================================================
lightning-fastdata: the fast JPEG decoder could NOT be built ({why}).
Without it the package decodes JPEGs with torchvision's decode_jpeg: about
{factor} as fast, no entropy index. To get it, either
  - install the binary wheel instead of building from source
    (pip install --only-binary=lightning-fastdata lightning-fastdata), or
  - install a C compiler (e.g. conda install -c conda-forge c-compiler, or ask
    for gcc) and reinstall: pip install --no-cache-dir --force-reinstall .
To install without it anyway: FASTDATA_ALLOW_NO_DECODER=1 pip install ...
`fastdata doctor` says whether the decoder is in use.
================================================================================
"""


class OptionalBuildExt(build_ext):
    """Build the extension against the system libjpeg-turbo, else the shipped headers.

    Neither building (no C compiler) fails the install with what to do, unless ``FASTDATA_ALLOW_NO_DECODER=1``:
    then it installs without the decoder and says so. pip shows a build's output only when it fails (or with
    ``-v``), so failing is the one way to say it that cannot go unseen.
    """

    def build_extension(self, ext: Extension) -> None:
        """Build it on the system's libjpeg-turbo, else on the shipped headers, else stop (or go on, if allowed)."""
        if ext.name.endswith("_forkguard"):  # no libjpeg; without a compiler the package goes on without it
            try:
                super().build_extension(ext)
            except Exception as err:  # noqa: BLE001
                print(f"lightning-fastdata: the fork guard was not built ({err})", file=sys.stderr)
            return
        why = ""
        if os.environ.get("FASTDATA_JPEG_HEADERS") != "vendored":
            try:
                super().build_extension(ext)
                return
            except Exception as err:  # noqa: BLE001 - no headers, no library, no compiler
                why = f"system libjpeg-turbo: {err}"
                print(f"lightning-fastdata: {why}; trying the shipped libjpeg-turbo headers", file=sys.stderr)
        ext.include_dirs = [VENDORED, *ext.include_dirs]
        ext.libraries = [name for name in ext.libraries if name != "jpeg"]
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001
            why = f"{why}; shipped headers: {err}" if why else f"shipped headers: {err}"
            print(NOT_BUILT.format(why=why, factor=_speed_without()), file=sys.stderr)
            if os.environ.get("FASTDATA_ALLOW_NO_DECODER") != "1":
                raise SystemExit(
                    "lightning-fastdata: stopping the install (see the box above). To install without the decoder "
                    "anyway, set FASTDATA_ALLOW_NO_DECODER=1."
                ) from err


setup(
    ext_modules=[
        Extension(
            "lightning_fastdata._ext._jpegroi",
            [f"lightning_fastdata/_ext/{name}.c" for name in ("jpegroi", "jpegindex", "imageops")],
            depends=[f"lightning_fastdata/_ext/{name}.h" for name in ("jpegindex", "imageops")],
            libraries=["jpeg", "dl"],  # dl: dladdr, which says which libjpeg the extension runs on
            extra_compile_args=["-O3", "-ffp-contract=off"],  # -O3: vectorised loops; imageops.c: no fused multiply-add
            optional=True,
        ),
        # holds CPython's thread-state lock across fork() where the interpreter deadlocks on it (3.10, 3.11 < 3.11.10)
        Extension("lightning_fastdata._ext._forkguard", ["lightning_fastdata/_ext/forkguard.c"], optional=True),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
