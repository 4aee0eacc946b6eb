"""The one adapter to the compiled extension: ``_ext/jpegroi.c``, ``_ext/jpegindex.c`` (libjpeg-turbo), ``imageops.c``.

``setup.py`` builds it where libjpeg-turbo's headers are installed; without them the package installs and works,
slower (PIL and torchvision decode whole images). Every module that calls the extension takes ``jpegroi`` from
here, so that one place says whether it exists.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["entropy_index_available", "jpegroi", "imageops_available", "roi_decode_available"]

jpegroi: ModuleType | None
try:
    from lightning_fastdata._ext import _jpegroi as jpegroi
except ImportError:  # pragma: no cover - depends on the build
    jpegroi = None


def roi_decode_available() -> bool:
    """Whether the compiled region-of-interest decoder is installed."""
    return jpegroi is not None


def entropy_index_available() -> bool:
    """Whether the compiled decoder can build and use entropy indexes (an extension of this version)."""
    return jpegroi is not None and hasattr(jpegroi, "entropy_index")


def imageops_available() -> bool:
    """Whether the compiled uint8 image kernels (``_ext/imageops.c``) are installed (an extension of this version)."""
    return jpegroi is not None and hasattr(jpegroi, "histogram")
