"""A windowed source decoded once: :func:`build_cache` and :class:`CacheDataset`, for any target kind.

The cache holds each sample at the evaluation size of ``cache_size`` (the shorter side resized to it; ``None``: each
image as it is) with its target
as the target kind keeps it (:meth:`~lightning_fastdata.sources.target.TargetKind.stored`: a mask's classes by nearest
sampling at pixel centres, boxes in the cached pixels): one uint8 file of images (``H x W x 3`` each, one after the
other), one of targets (each sample's bytes), each sample's size and offsets. Training then reads a crop's pixels
straight from the memory-mapped files and resizes only that: no decode at all. A window is drawn on the cached size as
on the original (a random resize is relative to the shorter side, a recipe's crop to the image), so the recipe is the
same; the pixels differ from a decode of the original by the cache's resampling.

A cache is a folder ``cache_dir/<what>-<digest>`` named after what it holds (the source's samples and their files'
sizes and modification times, what the target's values depend on, ``cache_size``): a source that changed gets another
folder, never a stale cache. It is built in a temporary folder and renamed when whole.
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

__all__ = ["CacheDataset", "build_cache", "cache_folder"]

#: The version of the cache's files (2: one targets file for every target kind).
_FORMAT = 2


def cache_folder(source: WindowedDataset, cache_dir: str | os.PathLike[str], cache_size: int | None) -> Path:
    """Where ``source``'s cache at ``cache_size`` lives (module docstring: named after what it holds)."""
    digest = hashlib.sha256()
    digest.update(f"{_FORMAT}|{type(source).__name__}|{cache_size}|{len(source)}".encode())
    digest.update(source.target.cache_key())
    digest.update(source.fingerprint().encode())
    return Path(cache_dir) / f"{source.target.what}-{digest.hexdigest()[:24]}"


def build_cache(
    source: WindowedDataset, cache_dir: str | os.PathLike[str], cache_size: int | None, progress: bool = True
) -> Path:
    """Decode every sample of ``source`` once at ``cache_size`` into its cache folder (kept if whole already).

    Returns the folder. ``source`` is read whole at the evaluation size (its own classes, before any ``classes=``;
    everything its target keeps for evaluation, a detection's crowds too).
    """
    folder = cache_folder(source, cache_dir, cache_size)
    if (folder / "manifest.json").is_file():
        return folder
    reader = source.evaluated(cache_size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    built = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    sizes = np.zeros((len(reader), 2), dtype=np.int64)
    offsets = np.zeros(len(reader) + 1, dtype=np.int64)
    what = f"caching {len(reader)} images ({reader.target.what})"
    with open(built / "images.u8", "wb") as images, open(built / "targets.u8", "wb") as targets:
        for i in _progress(range(len(reader)), progress, what):
            ((image, value),) = reader.rendered([i])
            sizes[i] = image.shape[1:]
            images.write(image.permute(1, 2, 0).contiguous().numpy().tobytes())
            data = reader.target.stored(value)
            targets.write(data.tobytes())
            offsets[i + 1] = offsets[i] + data.nbytes
    np.save(built / "sizes.npy", sizes)
    np.save(built / "target_offsets.npy", offsets)
    manifest = {"format": _FORMAT, "samples": len(reader), "cache_size": cache_size, "target": reader.target.what}
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


class CacheDataset(WindowedDataset):
    """A cache's samples (:func:`build_cache`) through their windows, with no decode.

    Args:
        folder: The cache folder.
        target: The target kind it was built with: the cache holds the data's classes, relabelled by it
            (``classes=``, a mix) when read, and what it keeps for training (a detection's crowds left out).
        **kwargs: The window settings of :class:`~lightning_fastdata.sources.windowed.WindowedDataset`.

    Raises:
        DataError: If the cache is not whole (no manifest), or of an older format (build it again).
    """

    def __init__(self, folder: str | os.PathLike[str], target: TargetKind, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.folder = Path(folder)
        manifest = self.folder / "manifest.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("format") != _FORMAT:
            raise DataError(f"{self.folder} is not a whole cache of this version (manifest.json): build it again.")
        self.sizes = np.load(self.folder / "sizes.npy")
        pixels = self.sizes[:, 0] * self.sizes[:, 1]
        self._image_offsets = 3 * np.concatenate([[0], np.cumsum(pixels)]).astype(np.int64)
        self._target_offsets = np.load(self.folder / "target_offsets.npy")
        self._maps: tuple[np.memmap, np.memmap | None] | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None, "_pid": -1}

    def __len__(self) -> int:
        return len(self.sizes)

    def image_sizes(self) -> np.ndarray:
        """Each cached image's ``(width, height)`` (the cache's sizes; nothing read)."""
        return self.sizes[:, ::-1].copy()

    def fingerprint(self) -> str:
        """The cache folder's name (what it holds)."""
        return self.folder.name

    def name(self, index: int, what: int = 0) -> str:
        """``folder[index]``, image and target alike."""
        return f"{self.folder}[{index}]"

    def _mapped(self) -> tuple[np.memmap, np.memmap | None]:
        if self._maps is None or self._pid != os.getpid():
            # copy-on-write: writable views, the file unchanged; an empty targets file (no boxes at all) maps nothing
            targets = self.folder / "targets.u8"
            self._maps = (
                np.memmap(self.folder / "images.u8", np.uint8, "c"),
                np.memmap(targets, np.uint8, "c") if targets.stat().st_size else None,
            )
            self._pid = os.getpid()
        return self._maps

    def _payload(self, index: int) -> tuple[np.ndarray, int, int]:
        targets = self._mapped()[1]
        start, stop = int(self._target_offsets[index]), int(self._target_offsets[index + 1])
        data = np.zeros(0, np.uint8) if targets is None else np.asarray(targets[start:stop])
        return data, int(self.sizes[index, 0]), int(self.sizes[index, 1])

    def _image(self, index: int) -> torch.Tensor:
        images = self._mapped()[0]
        h, w = (int(v) for v in self.sizes[index])
        start = int(self._image_offsets[index])
        return torch.from_numpy(np.asarray(images[start : start + 3 * h * w]).reshape(h, w, 3)).permute(2, 0, 1)

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image (a view of the memory map) and its stored target with its size."""
        return [(self._image(i), self._payload(i)) for i in indices]

    def read_payloads(self, indices: Sequence[int]) -> list[Any]:
        """The stored targets with their sizes."""
        return [self._payload(i) for i in indices]

    def decode_payload(self, payload: Any, name: str) -> Any:
        """The stored target as the target kind's value: the data's classes already."""
        data, height, width = payload
        return self.target.restored(data, height, width)
