"""A plain torch ``Dataset`` over an image folder that returns whole uint8 batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from lightning_fastdata.loading.collate import empty_image_batch
from lightning_fastdata.loading.decode import Box, center_crop_box, decode_resized_crop, random_resized_crop_box
from lightning_fastdata.loading.index import FileIndex, scan_image_folder
from lightning_fastdata.loading.sampler import SampleKey

__all__ = ["ImageFolderDataset"]

log = logging.getLogger("lightning_fastdata")

# Skip counters: one row per epoch (mod _EPOCH_ROWS) plus one for plain-index keys; column 0 for the main
# process, 1 + worker_id for workers, so no two processes ever write the same cell.
_EPOCH_ROWS = 8
_MAX_SLOTS = 64


class ImageFolderDataset(Dataset):
    """Images under ``root/<class>/`` with torchvision ``ImageFolder``'s class-to-index mapping.

    Each sample is decoded straight into its resized crop (see :mod:`lightning_fastdata.loading.decode`):
    ``RandomResizedCrop(image_size)`` + horizontal flip when ``train``, else the central crop of
    ``Resize(image_size / crop_fraction) + CenterCrop(image_size)``. Items are uint8 ``3 x S x S`` tensors;
    ``__getitems__`` returns a whole batch ``(images N x 3 x S x S uint8, labels N int64)``, which the
    loaders of this package pass through without another copy. Normalise on the device, after transfer.

    Keys are plain indices or ``(epoch, index)`` pairs (from :class:`~lightning_fastdata.EpochSampler`). With
    pairs, a sample's crop and flip are a function of ``(seed, epoch, index)``: the same whatever the worker
    count or prefetch depth, and different every epoch. With plain indices they are drawn from torch's
    global generator (seeded per worker by the ``DataLoader``).

    Args:
        root: Folder of class sub-folders, or a prebuilt :class:`FileIndex`.
        train: Random crop and flip if ``True``; central crop if ``False``.
        image_size: Side of the square output.
        scale: Area range of the random crop, as in ``RandomResizedCrop``.
        ratio: Aspect-ratio range of the random crop, as in ``RandomResizedCrop``.
        crop_fraction: Evaluation crop as a fraction of the shorter side (0.875 is 224 of 256).
        seed: Seed of the per-sample augmentation.
        on_corrupt: ``"raise"`` (default) raises an error naming the file; ``"skip"`` logs the file, leaves it
            out of its batch (which is then one shorter) and counts it in :meth:`skipped_count`.

    Raises:
        ValueError: On an impossible argument.
        FileNotFoundError: If ``root`` is missing, has no class folder, or a class has no image.
    """

    def __init__(
        self,
        root: str | FileIndex,
        train: bool = True,
        image_size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        crop_fraction: float = 0.875,
        seed: int = 0,
        on_corrupt: Literal["raise", "skip"] = "raise",
    ) -> None:
        if image_size <= 0:
            raise ValueError(f"image_size should be a positive int, got {image_size!r}.")
        if not (0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale should satisfy 0 < min <= max <= 1, got {scale!r}.")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio should satisfy 0 < min <= max, got {ratio!r}.")
        if not 0 < crop_fraction <= 1:
            raise ValueError(f"crop_fraction should be in (0, 1], got {crop_fraction!r}.")
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt should be 'raise' or 'skip', got {on_corrupt!r}.")
        self.index = root if isinstance(root, FileIndex) else scan_image_folder(os.fspath(root))
        self.train = train
        self.image_size = image_size
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.crop_fraction = crop_fraction
        self.seed = seed
        self.on_corrupt = on_corrupt
        # Shared memory, so that counts made in worker processes are visible to the main process.
        self._skipped = torch.zeros((_EPOCH_ROWS + 1, _MAX_SLOTS), dtype=torch.int64).share_memory_()

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a label is a position in this tuple."""
        return self.index.classes

    @property
    def targets(self) -> np.ndarray:
        """All labels, in sample order (torchvision's name)."""
        return self.index.labels

    def __len__(self) -> int:
        return len(self.index)

    def skipped_count(self, epoch: int | None = None) -> int:
        """Corrupt images skipped so far across all worker processes, in ``epoch`` or in total."""
        return int(self._skipped.sum() if epoch is None else self._skipped[epoch % _EPOCH_ROWS].sum())

    def reset_skipped_count(self, epoch: int | None = None) -> None:
        """Set :meth:`skipped_count` (of ``epoch``, or all) back to zero."""
        (self._skipped if epoch is None else self._skipped[epoch % _EPOCH_ROWS]).zero_()

    def _plan(self, key: int | SampleKey) -> tuple[int, np.random.Generator | None]:
        if isinstance(key, (tuple, list)):
            epoch, index = int(key[0]), int(key[1])
            entropy = [self.seed, epoch, index]
        else:
            index = int(key)
            entropy = [self.seed, int(torch.randint(2**62, ()).item()), index]
        if not 0 <= index < len(self.index):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self.index)} images.")
        return index, (np.random.default_rng(entropy) if self.train else None)

    def _decode_into(self, out: torch.Tensor, index: int, rng: np.random.Generator | None) -> None:
        path = self.index.path(index)
        with open(path, "rb") as f:
            data = f.read()
        if rng is None:
            decode_resized_crop(data, out, self._center_box, name=path)
            return
        flip = bool(rng.random() < 0.5)

        def box_fn(w: int, h: int) -> Box:
            return random_resized_crop_box(rng, w, h, self.scale, self.ratio)

        decode_resized_crop(data, out, box_fn, flip=flip, name=path)

    def _center_box(self, w: int, h: int) -> Box:
        return center_crop_box(w, h, self.crop_fraction)

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int]:
        index, rng = self._plan(key)
        out = torch.empty((self.image_size, self.image_size, 3), dtype=torch.uint8).permute(2, 0, 1)
        self._decode_into(out, index, rng)
        return out, int(self.index.labels[index])

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode a whole batch into one shared uint8 tensor; return ``(images, labels)``."""
        images = empty_image_batch(len(keys), self.image_size, self.image_size)
        indices = np.empty(len(keys), dtype=np.int64)
        kept = np.ones(len(keys), dtype=bool)
        for slot, key in enumerate(keys):
            index, rng = self._plan(key)
            indices[slot] = index
            try:
                self._decode_into(images[slot], index, rng)
            except OSError as err:
                if self.on_corrupt == "raise":
                    raise
                kept[slot] = False
                info = get_worker_info()
                row = key[0] % _EPOCH_ROWS if isinstance(key, (tuple, list)) else _EPOCH_ROWS
                self._skipped[row, 0 if info is None else 1 + info.id % (_MAX_SLOTS - 1)] += 1
                log.warning("Skipped corrupt image %s (on_corrupt='skip'): %s", self.index.path(index), err.__cause__)
        labels = torch.from_numpy(self.index.labels[indices])
        if not kept.all():
            mask = torch.from_numpy(kept)
            return images[mask].contiguous(memory_format=torch.channels_last), labels[mask]
        return images, labels
