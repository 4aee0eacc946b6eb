"""A segmentation split decoded once: ``build_segmentation_cache`` and ``SegmentationCacheDataset``.

The cache holds each sample at the evaluation size of ``cache_size`` (the shorter side resized to it, the mask by
nearest sampling at pixel centres): one uint8 file of images (``H x W x 3`` each, one after the other), one of masks
(``H x W``, the classes after the source's mask table), each sample's size and offset. Training then reads a crop's
pixels straight from the memory-mapped files and resizes only that: no decode at all. A window is drawn on the cached
size as on the original (the random resize is relative to the shorter side), so the recipe is the same; the pixels
differ from a decode of the original by the cache's resampling.

A cache is a folder ``cache_dir/<digest>`` named after what it holds (the source's samples and their files' sizes
and modification times, its mask table and ``cache_size``): a source that changed gets another folder, never a
stale cache. It is built in a temporary folder and renamed when whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_fastdata.errors import DataError
from lightning_fastdata.loading.atomic import atomic_write_text, replace_folder
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["SegmentationCacheDataset", "build_segmentation_cache", "cache_folder"]

#: The version of the cache's files.
_FORMAT = 1


def cache_folder(source: WindowedDataset, cache_dir: str | os.PathLike[str], cache_size: int) -> Path:
    """Where ``source``'s cache at ``cache_size`` lives (module docstring: named after what it holds)."""
    digest = hashlib.sha256()
    digest.update(f"{_FORMAT}|{type(source).__name__}|{cache_size}|{len(source)}".encode())
    digest.update(source.target.cache_key())
    digest.update(source.fingerprint().encode())
    return Path(cache_dir) / f"segmentation-{digest.hexdigest()[:24]}"


def build_segmentation_cache(
    source: WindowedDataset, cache_dir: str | os.PathLike[str], cache_size: int, progress: bool = True
) -> Path:
    """Decode every sample of ``source`` once at ``cache_size`` into its cache folder (kept if whole already).

    Returns the folder. ``source`` is read at the evaluation size (its own classes, before any ``classes=``).
    """
    folder = cache_folder(source, cache_dir, cache_size)
    if (folder / "manifest.json").is_file():
        return folder
    reader = source.evaluated(cache_size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    built = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    sizes = np.zeros((len(reader), 2), dtype=np.int64)
    with open(built / "images.u8", "wb") as images, open(built / "masks.u8", "wb") as masks:
        for i in _progress(range(len(reader)), progress, f"caching {len(reader)} images and masks"):
            image, mask = reader[i]
            sizes[i] = mask.shape
            images.write(image.permute(1, 2, 0).contiguous().numpy().tobytes())
            masks.write(mask.numpy().tobytes())
    np.save(built / "sizes.npy", sizes)
    manifest = {"format": _FORMAT, "samples": len(reader), "cache_size": cache_size}
    atomic_write_text(built / "manifest.json", json.dumps(manifest))
    replace_folder(built, folder)
    return folder


def _progress(items: range, show: bool, what: str) -> Iterator[int]:
    if not show:
        return iter(items)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with Lightning; without it, no bar
        return iter(items)
    return iter(tqdm(items, desc=what, unit="img"))


class SegmentationCacheDataset(WindowedDataset):
    """A cache's samples (:func:`build_segmentation_cache`) through their windows, with no decode.

    Args:
        folder: The cache folder.
        target: The masks' target kind (:class:`~lightning_fastdata.segmentation.target.MaskTarget`): the cache holds
            the data's classes, relabelled by it (``classes=``, a mix) when read.
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`.

    Raises:
        FileNotFoundError: If the cache is not whole (no manifest).
    """

    def __init__(self, folder: str | os.PathLike[str], target: TargetKind, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.folder = Path(folder)
        if not (self.folder / "manifest.json").is_file():
            raise DataError(f"{self.folder} is not a whole segmentation cache (no manifest.json): build it again.")
        self.sizes = np.load(self.folder / "sizes.npy")
        pixels = self.sizes[:, 0] * self.sizes[:, 1]
        self._mask_offsets = np.concatenate([[0], np.cumsum(pixels)]).astype(np.int64)
        self._image_offsets = 3 * self._mask_offsets
        self._maps: tuple[np.memmap, np.memmap] | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None, "_pid": -1}

    def __len__(self) -> int:
        return len(self.sizes)

    def fingerprint(self) -> str:
        """The cache folder's name (what it holds)."""
        return self.folder.name

    def name(self, index: int, what: int = 0) -> str:
        """``folder[index]``, image and mask alike."""
        return f"{self.folder}[{index}]"

    def _mapped(self) -> tuple[np.memmap, np.memmap]:
        if self._maps is None or self._pid != os.getpid():
            self._maps = (
                np.memmap(self.folder / "images.u8", np.uint8, "c"),  # copy-on-write: writable views, file unchanged
                np.memmap(self.folder / "masks.u8", np.uint8, "c"),
            )
            self._pid = os.getpid()
        return self._maps

    def _sample(self, index: int) -> tuple[torch.Tensor, np.ndarray]:
        images, masks = self._mapped()
        h, w = (int(v) for v in self.sizes[index])
        start = int(self._image_offsets[index])
        image = torch.from_numpy(np.asarray(images[start : start + 3 * h * w]).reshape(h, w, 3)).permute(2, 0, 1)
        start = int(self._mask_offsets[index])
        return image, np.asarray(masks[start : start + h * w]).reshape(h, w)

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image and mask, views of the memory maps."""
        return [self._sample(i) for i in indices]

    def read_payloads(self, indices: Sequence[int]) -> list[Any]:
        """The cached masks (copies)."""
        return [np.array(self._sample(i)[1]) for i in indices]

    def decode_payload(self, payload: Any, name: str) -> Any:
        """The cached mask as it is: the data's classes already."""
        return payload
