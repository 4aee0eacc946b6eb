"""The tensor cache's manifest: what makes the arrays beside it a current cache, and opening a split.

See :mod:`lightning_fastdata.cache.dataset` for the layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lightning_fastdata.errors import DataError, InvalidValueError, PathNotFoundError
from lightning_fastdata.loading.atomic import atomic_write_text

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CacheParams",
    "cache_is_current",
    "changed_param",
    "open_jpeg_cache",
    "open_tensor_cache",
    "read_manifest",
    "write_json",
    "write_manifest",
]

CACHE_FORMAT_VERSION = 1
SPLITS = ("train", "val")


@dataclass(frozen=True)
class CacheParams:
    """Everything a cache's content depends on; a cache whose parameters differ is stale.

    Args:
        cache_size: Side of the stored training squares.
        image_size: Side of the stored validation crops.
        crop_fraction: Validation crop as a fraction of the shorter side.
        fingerprint: sha256 of the source files' relative paths, sizes and mtimes (train and val lists).
        classes: Class names.
        storage: ``"raw"`` (uint8 arrays) or ``"jpeg"`` (each image re-encoded once, compact).
        quality: JPEG quality (``"jpeg"`` storage).
        exact_decode: Whether the source JPEGs were decoded with the exact IDCT at full size (see
            :func:`~lightning_fastdata.loading.jpeg.decode.decode_resized_crop`).
    """

    cache_size: int
    image_size: int
    crop_fraction: float
    fingerprint: str
    classes: tuple[str, ...]
    storage: str = "raw"
    quality: int = 90
    exact_decode: bool = False


#: What a manifest written before a parameter existed meant by it.
_PARAM_DEFAULTS = {"storage": "raw", "quality": 90, "exact_decode": False}


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    """``cache_dir/manifest.json``, or ``None`` when there is none (no complete cache).

    Raises:
        OSError: If the manifest is unreadable (named, with what to do).
        ValueError: If its format is newer than this package reads.
    """
    try:
        manifest = json.loads((cache_dir / "manifest.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise DataError(
            f"Cache manifest {str(cache_dir / 'manifest.json')!r} is unreadable ({err}); delete "
            f"{str(cache_dir)!r} to rebuild the cache."
        ) from err
    version = int(manifest.get("format_version", 0))
    if version > CACHE_FORMAT_VERSION:
        raise InvalidValueError(
            f"Cache {str(cache_dir)!r} has format_version={version}, newer than this package reads "
            f"({CACHE_FORMAT_VERSION}); upgrade lightning-fastdata or delete the cache to rebuild it."
        )
    return manifest


def changed_param(built: dict[str, Any], params: CacheParams) -> str | None:
    """Which of ``params`` (other than the fingerprint) differs from the manifest's ``built`` ones, if any."""
    for key, value in asdict(params).items():
        was = built.get(key, _PARAM_DEFAULTS.get(key))
        if key != "fingerprint" and was != (list(value) if isinstance(value, tuple) else value):
            return f"{key} changed from {was!r} to {value!r}"
    return None


def cache_is_current(cache_dir: str | os.PathLike[str], params: CacheParams) -> tuple[bool, str]:
    """Whether ``cache_dir`` holds a complete cache built with ``params``, and why not."""
    manifest = read_manifest(Path(cache_dir))
    if manifest is None:
        return False, "no cache yet"
    built = manifest.get("params", {})
    if built.get("fingerprint") != params.fingerprint:
        return False, "the source images changed (file list, sizes or mtimes)"
    changed = changed_param(built, params)
    return (False, changed) if changed else (True, "up to date")


def write_manifest(cache_dir: Path, params: CacheParams, counts: dict[str, int], source: dict[str, Any] | None) -> None:
    """Write ``cache_dir/manifest.json`` (atomically): what makes the arrays beside it a current cache."""
    manifest = {
        "format_version": CACHE_FORMAT_VERSION,
        "params": {**asdict(params), "classes": list(params.classes)},
        "counts": counts,
        "source": source,
    }
    write_json(cache_dir / "manifest.json", manifest)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=1))


def open_jpeg_cache(cache_dir: str | os.PathLike[str], split: Literal["train", "val"]) -> str | None:
    """Validate a ``storage="jpeg"`` cache and return the HDF5 file of ``split`` (``None``: the split is empty).

    Raises:
        FileNotFoundError: If there is no complete cache, or it is not a JPEG cache.
        OSError: If the split's file is missing.
    """
    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir)
    if manifest is None or manifest["params"].get("storage") != "jpeg":
        raise PathNotFoundError(
            f"No complete JPEG tensor cache in {str(cache_dir)!r}; build it with TensorCacheDataModule("
            "storage='jpeg').prepare_data() (the Trainer calls it)."
        )
    if manifest["counts"][split] == 0:
        return None
    path = cache_dir / f"{split}.h5"
    if not path.exists():
        raise DataError(f"{str(path)!r} is missing from the cache; delete {str(cache_dir)!r} to rebuild it.")
    return str(path)


def open_tensor_cache(cache_dir: str | os.PathLike[str], split: Literal["train", "val"]) -> tuple[str, np.ndarray]:
    """Validate ``cache_dir`` and return ``(images_path, labels)`` of ``split``.

    Args:
        cache_dir: A complete tensor cache (what ``TensorCacheDataModule.prepare_data`` builds).
        split: ``"train"`` or ``"val"``.

    Raises:
        FileNotFoundError: If there is no complete cache.
        OSError: If an array file is missing, truncated or does not match the manifest.
        ValueError: If the cache format is newer than this package.
    """
    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir)
    if manifest is None:
        raise PathNotFoundError(
            f"No complete tensor cache in {str(cache_dir)!r}; build it with TensorCacheDataModule.prepare_data() "
            "(the Trainer calls it)."
        )
    path = cache_dir / f"{split}_images.npy"
    try:
        images = np.load(path, mmap_mode="r")
        labels = np.load(cache_dir / f"{split}_labels.npy")
    except (OSError, ValueError) as err:
        raise DataError(
            f"Tensor cache file in {str(cache_dir)!r} is missing, truncated or corrupt ({err}); delete "
            f"{str(cache_dir)!r} to rebuild the cache."
        ) from err
    count = manifest["counts"][split]
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) != count or len(labels) != count:
        raise DataError(
            f"{str(path)!r} does not match the manifest ({count} images expected, found shape {images.shape}); "
            f"delete {str(cache_dir)!r} to rebuild the cache."
        )
    return str(path), labels
