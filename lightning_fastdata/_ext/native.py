"""The one adapter to the compiled extension: ``_ext/jpegroi.c``, ``_ext/jpegindex.c`` (libjpeg-turbo), ``imageops.c``.

How the extension finds its libjpeg-turbo depends on how it was installed:

- the binary wheel: a copy of libjpeg-turbo inside the wheel (``lightning_fastdata.libs/``, put there by
  ``auditwheel repair``; ``scripts/release.sh``);
- built from source where libjpeg-turbo's headers are installed: the system's library, linked at build time;
- built from source without them (``setup.py`` compiles against the headers shipped in ``_ext/libjpeg-turbo``):
  no libjpeg linked; here, before importing it, an installed libjpeg-turbo of the same ABI (``.so.62``) is loaded
  with its symbols global: the copy inside Pillow's wheel first, else the system's runtime library.

Without the extension (no compiler at install time, ``FASTDATA_ALLOW_NO_DECODER=1``) the package works, slower:
PIL and torchvision decode whole images; a training run warns once (:func:`warn_if_missing`). Every module that
calls the extension takes ``jpegroi`` from here, so that one place says whether it exists.
``FASTDATA_DISABLE_DECODER=1`` turns it off (to measure or test the fallback).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import importlib.util
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = [
    "MISSING_DECODER",
    "WITHOUT_DECODER_SPEED",
    "decoder_summary",
    "entropy_index_available",
    "imageops_available",
    "jpegroi",
    "libjpeg_path",
    "roi_decode_available",
    "warn_if_missing",
]

#: The default folder loader's speed without the compiled decoder, as a share of its speed with it (measured:
#: ``benchmarks/results/no-decoder.json``, docs/benchmarks.md); what the install message and the warning say.
WITHOUT_DECODER_SPEED = "0.5-0.7x"

#: What a missing decoder costs and the fix, as ``decoder_summary`` and the doctor's report say it.
MISSING_DECODER = (
    f"JPEGs decode with torchvision's decode_jpeg, about {WITHOUT_DECODER_SPEED} as fast (install the binary "
    "wheel, or reinstall from source with a C compiler)"
)

_MODULE = "lightning_fastdata._ext._jpegroi"


def _libjpeg_candidates() -> list[str]:
    """Installed libjpeg-turbo libraries of the libjpeg 6.2 ABI (the one the shipped headers describe)."""
    found: list[str] = []
    spec = importlib.util.find_spec("PIL")
    if spec is not None and spec.origin:
        libs = Path(spec.origin).parent.parent / "pillow.libs"
        found += sorted(str(p) for p in libs.glob("libjpeg-*.so.62*"))
    system = ctypes.util.find_library("jpeg")
    if system and ".so.62" in system:  # libjpeg.so.8 (Ubuntu's libjpeg-turbo8) has another struct layout
        found.append(system)
    return found


def _turned_off() -> bool:
    return os.environ.get("FASTDATA_DISABLE_DECODER") == "1"


def _off_note() -> str:
    """`` (turned off: FASTDATA_DISABLE_DECODER=1)`` where it is, else nothing: the summary's and the warning's."""
    return " (turned off: FASTDATA_DISABLE_DECODER=1)" if _turned_off() else ""


def _load() -> ModuleType | None:
    if _turned_off():
        return None
    try:
        return importlib.import_module(_MODULE)
    except ImportError as err:
        if "undefined symbol" not in str(err):  # not built, or built for another Python
            return None
    for path in _libjpeg_candidates():  # built against the shipped headers: it needs a libjpeg loaded first
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError:
            continue
        if not hasattr(library, "jpeg_skip_scanlines"):  # libjpeg-turbo 1.5+ only
            continue
        try:
            return importlib.import_module(_MODULE)
        except ImportError:
            continue
    return None


if TYPE_CHECKING:  # the extension's stub (_ext/_jpegroi.pyi): mypy checks every call of it against its signatures
    from lightning_fastdata._ext import _jpegroi as jpegroi  # (at run time: None where it is not built)
else:
    jpegroi = _load()


def roi_decode_available() -> bool:
    """Whether the compiled region-of-interest decoder is installed."""
    return jpegroi is not None


def entropy_index_available() -> bool:
    """Whether the compiled decoder can build and use entropy indexes (an extension of this version)."""
    return jpegroi is not None and hasattr(jpegroi, "entropy_index")


def imageops_available() -> bool:
    """Whether the compiled uint8 image kernels (``_ext/imageops.c``) are installed (an extension of this version)."""
    return jpegroi is not None and hasattr(jpegroi, "histogram")


def libjpeg_path() -> str | None:
    """The file of the libjpeg-turbo the extension runs on (``None`` without the extension)."""
    if jpegroi is None or not hasattr(jpegroi, "library"):
        return None
    return jpegroi.library()


def decoder_summary() -> str:
    """One line: whether the compiled decoder is in use, on which libjpeg-turbo, or what its absence costs."""
    if jpegroi is None:
        return f"no{_off_note()}: {MISSING_DECODER}"
    if not hasattr(jpegroi, "library"):
        return "yes"
    path = libjpeg_path() or "?"
    if "lightning_fastdata.libs" in path:
        where = "the wheel's own"
    elif "pillow.libs" in path:
        where = "Pillow's"
    else:
        where = "the system's"
    return f"yes: {where} libjpeg-turbo ({path})"


_warn_lock = threading.Lock()
_warned = False


def warn_if_missing() -> None:
    """Warn once per process (rank zero only) when JPEGs will decode without the compiled decoder."""
    global _warned
    if jpegroi is not None:
        return
    with _warn_lock:
        if _warned:
            return
        _warned = True
    from lightning.pytorch.utilities import rank_zero_warn

    rank_zero_warn(
        f"lightning-fastdata: the compiled JPEG decoder is not in use{_off_note()}, so JPEGs decode with torchvision's "
        f"decode_jpeg: the loader runs at about {WITHOUT_DECODER_SPEED} of its speed with it, without the entropy "
        "index. Fix: install the binary wheel (pip install --force-reinstall --only-binary=lightning-fastdata "
        "lightning-fastdata), or reinstall from source with a C compiler; `fastdata doctor` checks it."
    )
