"""``SegmentationFolderDataset``: a split's images and masks, through one window each; ``SegmentationPredictDataset``.

The layouts (VOC, ADE20K, Cityscapes, paired folders; local or in a bucket) and what a mask's values mean are
:mod:`~lightning_fastdata.segmentation.layouts`'. Each sample's image and mask go through one
:class:`~lightning_fastdata.segmentation.window.Window` (torchvision's segmentation reference: a random resize, a
flip and a padded crop in training; the base size in evaluation): the image decoded only where the window needs it,
the mask decoded once and sampled into the same place. A batch is a :class:`~lightning_fastdata.loading.batch.Batch`
of uint8 images ``N x 3 x H x W`` and uint8 masks ``N x H x W`` (evaluation batches padded to their largest image:
images with 0, masks with the ignore index).
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightning_fastdata.augment.geometry import crop_draws, random_resized_crop_box, resize_crop_into
from lightning_fastdata.errors import DataError, InvalidValueError
from lightning_fastdata.loading.batch import Batch, DeviceBatch
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.loading.jpeg.entropy_index import EntropyIndexes
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.loading.transport.collate import empty_image_and_mask_batch, empty_image_batch
from lightning_fastdata.segmentation.layouts import find_pairs, map_mask, mask_table
from lightning_fastdata.segmentation.window import (
    IGNORE_INDEX,
    Window,
    eval_window,
    render_mask,
    train_window,
    window_draws,
)

__all__ = [
    "SegmentationFolderDataset",
    "SegmentationPredictBatch",
    "WindowedSegmentation",
    "read_mask",
    "sample_key",
]


def read_mask(data: bytes, name: str) -> np.ndarray:
    """A mask file's values (``H x W`` uint8): a palette or grey PNG's values as they are.

    Raises:
        DataError: For an RGB mask (its colours are not classes: give a palette PNG) or an unreadable file (named).
    """
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode not in ("P", "L"):
                raise DataError(
                    f"{name} is a {im.mode} mask: its pixels are colours, not classes. Give palette (P) or grey (L) "
                    "PNGs whose values are the class indices (VOC's SegmentationClass), or convert it with a colour "
                    "table first."
                )
            return np.asarray(im, dtype=np.uint8).copy()
    except OSError as err:
        raise DataError(f"{name} is not a readable mask ({err}).") from None


def _checked(value: bytes | OSError, name: str) -> bytes:
    if isinstance(value, OSError):
        raise DataError(f"Cannot read {name}: {value}.") from value
    return value


def sample_key(key: Any, n: int) -> tuple[int, int, int]:
    """A loader's key (an index, or ``(epoch, index[, repeat])``) as ``(epoch, index, repeat)``, checked."""
    if isinstance(key, (tuple, list)):
        full = (int(key[0]), int(key[1]), int(key[2]) if len(key) > 2 else 0)
    else:
        full = (0, int(key), 0)
    if not 0 <= full[1] < n:
        raise IndexError(f"index {full[1]} is out of range for a dataset of {n} samples.")
    return full


def _padded(samples: Sequence[tuple[torch.Tensor, torch.Tensor | None]], fill: int) -> tuple[torch.Tensor, Any]:
    """The samples' images (and masks) in one batch, padded to the largest: images 0, masks ``fill``.

    The images' batch is channels-last and, in a loader worker, in shared memory with the masks' (a pooled buffer
    where the loader pools them: :func:`~lightning_fastdata.loading.transport.collate.empty_image_and_mask_batch`), so
    both cross to the main process without a copy; every pixel is written (a pooled buffer holds an earlier batch).
    """
    h = max(int(image.shape[1]) for image, _ in samples)
    w = max(int(image.shape[2]) for image, _ in samples)
    if samples[0][1] is None:
        images, masks = empty_image_batch(len(samples), h, w), None
    else:
        images, masks = empty_image_and_mask_batch(len(samples), h, w)
    for k, (image, mask) in enumerate(samples):
        _place(images[k], image, 0)
        if masks is not None and mask is None:
            masks[k] = fill
        elif masks is not None:
            _place(masks[k], mask, fill)
    return images, masks


def _place(dst: torch.Tensor, src: Any, fill: int) -> None:
    """``src`` (``... x h x w``) at the top left of ``dst`` (``... x H x W``), the rest ``fill``."""
    h, w = int(src.shape[-2]), int(src.shape[-1])
    dst[..., :h, :w] = src
    dst[..., h:, :] = fill
    dst[..., :h, w:] = fill


class WindowedSegmentation(Dataset):
    """What every segmentation source shares: the settings, each sample's window, a sample rendered through it.

    A subclass finds its samples and reads a batch (``__getitems__``): each image (encoded bytes, or a decoded
    ``3 x H x W`` uint8 tensor) and its mask's values, rendered by :meth:`render`.

    Raises:
        ValueError: On a bad argument (named).
    """

    def __init__(
        self,
        num_classes: int = 21,
        train: bool = True,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        seed: int = 0,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if not 0 < num_classes <= 255 or not 0 <= ignore_index <= 255 or ignore_index < num_classes:
            raise InvalidValueError(
                f"num_classes={num_classes!r} and ignore_index={ignore_index!r}: masks are uint8, so classes are "
                "0 .. num_classes - 1 below the ignore index (at most 255)."
            )
        if base_size < 1 or crop_size < 1:
            raise InvalidValueError(f"base_size and crop_size should be positive, got {base_size!r}, {crop_size!r}.")
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.train, self.base_size, self.crop_size = train, base_size, crop_size
        self.hflip_prob, self.seed = hflip_prob, seed
        self.table = mask_table("", num_classes, ignore_index, None)
        #: Classes -> the subset's classes (``classes=``; the others ignored), applied after :attr:`table`.
        self.renumber: np.ndarray | None = None
        #: Whether :attr:`targets` reads every mask (sampling by class), or only counts the samples.
        self.presence_needed = False
        #: Whether batches carry their samples' keys (:meth:`keyed`).
        self.return_keys = False
        #: ``None`` for the reference's training crop (random resize, flip, padded crop), else
        #: ``RandomResizedCrop``'s ``(scale, ratio)`` (:meth:`random_resized`).
        self.random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
        self._presence: np.ndarray | None = None

    def random_resized(self, scale: tuple[float, float], ratio: tuple[float, float]) -> WindowedSegmentation:
        """A copy whose training window is ``RandomResizedCrop(crop_size, scale, ratio)`` then the flip.

        torchvision's box (ten tries, then the centre), its numbers drawn from the sample's key, for the image and
        its mask alike; the output is always ``crop_size`` square, without padding.
        """
        twin = copy.copy(self)
        twin.random_resized_crop = (tuple(scale), tuple(ratio))  # type: ignore[assignment]
        return twin

    def kept(self, positions: Sequence[int] | None, presence: bool) -> WindowedSegmentation:
        """A copy keeping ``positions``' classes, and reading each image's classes as :attr:`targets` (``presence``).

        Its masks are renumbered: class ``positions[k]`` becomes ``k``, every other class ``ignore_index``
        (``None``: unchanged).
        """
        renumber = None
        if positions is not None:
            renumber = np.full(256, self.ignore_index, dtype=np.uint8)
            renumber[np.asarray(positions, dtype=np.int64)] = np.arange(len(positions), dtype=np.uint8)
        return self.renumbered(renumber, presence)

    def renumbered(self, renumber: np.ndarray | None, presence: bool | None = None) -> WindowedSegmentation:
        """A copy whose classes go through ``renumber`` (256 entries) after the mask table (what a mix sets)."""
        twin = copy.copy(self)
        twin.renumber = renumber
        if presence is not None:
            twin.presence_needed = presence
        return twin

    @property
    def targets(self) -> np.ndarray:
        """What sampling draws by.

        Each sample's classes present (``N x num_classes`` 0/1, in the data's classes; every mask read once) when
        :attr:`presence_needed`, else one 0 per sample (only the count matters).
        """
        if not self.presence_needed:
            return np.zeros(len(self), dtype=np.int64)
        if self._presence is None:
            presence = np.zeros((len(self), self.num_classes), dtype=np.uint8)
            for index, mask in self.masks():
                counts = np.bincount(mask.ravel(), minlength=256)[: self.num_classes]
                presence[index] = counts > 0
            self._presence = presence
        return self._presence

    def masks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every sample's mask as classes (the data's, before ``classes=``), in order, as ``(index, mask)``."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """What identifies the source's data: its samples and their files' sizes and times (a cache's name)."""
        raise NotImplementedError

    def evaluated(self, base_size: int) -> WindowedSegmentation:
        """A copy reading each sample whole at the evaluation size ``base_size``, in the data's classes."""
        twin = self.renumbered(None)
        twin.train, twin.base_size = False, base_size
        return twin

    def __len__(self) -> int:
        raise NotImplementedError

    def window(
        self, full_key: tuple[int, int, int], width: int, height: int, draws: np.ndarray | None = None
    ) -> Window:
        """The sample's window: the training one drawn from its key, or the evaluation one.

        ``draws``: the sample's numbers, drawn already (:meth:`draws_of`).
        """
        if not self.train:
            return eval_window(width, height, self.base_size)
        if draws is None:
            draws = self.draws_of([full_key])[0]
        assert draws is not None  # training: a row of numbers
        if self.random_resized_crop is not None:
            box = random_resized_crop_box(draws, width, height, *self.random_resized_crop)
            size = (self.crop_size, self.crop_size)
            return Window(box, (0, 0, *size), size, float(draws[0]) < self.hflip_prob)
        return train_window(draws, width, height, self.base_size, self.crop_size, hflip_prob=self.hflip_prob)

    def draws_of(self, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """Each sample's window numbers, drawn together (training), or ``None`` each (evaluation)."""
        if not self.train:
            return [None] * len(keys)
        if self.random_resized_crop is not None:
            return list(crop_draws(self.seed, keys))
        return list(window_draws(self.seed, keys))

    def classes_of(self, values: np.ndarray, name: str) -> np.ndarray:
        """A mask's values as classes (``H x W`` uint8) through this source's table.

        Raises:
            DataError: On a value that is no class (named with ``name``).
        """
        classes = map_mask(values, self.table, name, self.num_classes, self.ignore_index)
        return classes if self.renumber is None else self.renumber[classes]

    def render(
        self,
        full_key: tuple[int, int, int],
        image: bytes | torch.Tensor,
        mask: np.ndarray,
        names: tuple[str, str],
        draws: np.ndarray | None = None,
        entropy_index: bytes | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample through its window: ``image`` (encoded, or ``3 x H x W`` uint8) and ``mask`` (classes).

        ``entropy_index``: the encoded image's entropy index, if one was built (the crop is decoded alone: the same
        pixels, less work).

        Raises:
            DataError: If the image is not the mask's size (both named by ``names``: image, mask).
        """
        height, width = mask.shape

        def box(w: int, h: int) -> tuple[int, int, int, int]:  # the mask's size is the image's, or it is an error
            if (w, h) != (width, height):
                raise DataError(
                    f"{names[1]} is {width}x{height}, its image {names[0]} is {w}x{h}: a mask must be its image's size."
                )
            return win.box

        win = self.window(full_key, width, height, draws)
        out = torch.zeros(*win.size, 3, dtype=torch.uint8).permute(2, 0, 1)  # channels-last, as the resize writes
        top, left, ph, pw = win.place
        place = out[:, top : top + ph, left : left + pw]
        if isinstance(image, torch.Tensor):
            t, l_, h, w = box(int(image.shape[2]), int(image.shape[1]))
            resize_crop_into(place, image[:, t : t + h, l_ : l_ + w], win.flip)
        else:
            decode_resized_crop(image, place, box, win.flip, names[0], entropy_index=entropy_index)
        return out, render_mask(mask, win, fill=self.ignore_index)

    def batch(self, samples: Sequence[tuple[torch.Tensor, torch.Tensor]], keys: Any = None) -> Any:
        """Rendered samples as one batch, padded to the largest (images 0, masks the ignore index).

        A :class:`~lightning_fastdata.loading.batch.DeviceBatch` carrying the samples' ``keys`` where the device
        draws from them (:meth:`keyed`), else a :class:`~lightning_fastdata.loading.batch.Batch`.
        """
        images, masks = _padded(samples, self.ignore_index)
        if self.return_keys and keys is not None:
            return DeviceBatch(images, masks, torch.tensor([tuple(k) for k in keys], dtype=torch.int64))
        return Batch(images, masks)

    def keyed(self) -> WindowedSegmentation:
        """A copy whose batches carry their samples' keys (the device policies draw from them)."""
        twin = copy.copy(self)
        twin.return_keys = True
        return twin

    def __getitems__(self, keys: Sequence[Any]) -> Batch:
        """A batch: images (uint8 ``N x 3 x H x W``) and masks (uint8 ``N x H x W``), padded to the largest."""
        raise NotImplementedError

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(image, mask)`` of one sample."""
        images, masks = self.__getitems__([key])
        return images[0], masks[0]


class SegmentationFolderDataset(WindowedSegmentation):
    """A segmentation split as whole batches of images and masks (module docstring).

    Args:
        root: The data's root: a folder or a bucket URL in one of the layouts of
            :mod:`~lightning_fastdata.segmentation.layouts`.
        split: The split: VOC's list ``ImageSets/Segmentation/<split>.txt``, else the split's sub-folder.
        num_classes: The classes a mask holds (``0 .. num_classes - 1``, and ``ignore_index``).
        train: The reference's training window (random resize, flip, padded crop); else its evaluation (base size).
        base_size: The reference's base size (its ``--base-size``, 520).
        crop_size: The training crop (its ``--crop-size``, 480).
        hflip_prob: The flip's probability.
        seed: The seed every sample's window is drawn from, with its key ``(epoch, index, repeat)``.
        ignore_index: The mask value of borders and padding.
        layout: ``"auto"``, ``"voc"``, ``"ade20k"``, ``"cityscapes"`` or ``"paired"``.
        images_dir: Paired folders: the images' folder under ``root``.
        masks_dir: Paired folders: the masks' folder under ``root``.
        label_map: Mask value -> class (or -> ``ignore_index``), replacing the layout's own meaning of the values; a
            value it does not name is an error. ``"ade20k"``/``"cityscapes"``: that layout's table.
        storage_options: Object-store settings for a bucket ``root``.

    Raises:
        FileNotFoundError: If the split, or an image or mask it names, is missing (named).
        ValueError: On a bad argument (named).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str = "train",
        num_classes: int = 21,
        train: bool = True,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        seed: int = 0,
        ignore_index: int = IGNORE_INDEX,
        layout: str = "auto",
        images_dir: str = "images",
        masks_dir: str = "annotations",
        label_map: Mapping[int, int] | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(num_classes, train, base_size, crop_size, hflip_prob, seed, ignore_index)
        self.root = os.fspath(root)
        options = None if storage_options is None else dict(storage_options)
        self.pairs = find_pairs(self.root, split, layout, images_dir, masks_dir, options)
        if not self.pairs.images:
            raise InvalidValueError(f"The split {split!r} of {self.root} holds no image.")
        self.storage = open_storage(self.root, options)
        self.table = mask_table(self.pairs.layout, num_classes, ignore_index, label_map)
        if self.pairs.layout == "paired" and label_map is None and ignore_index == 255:
            self._refuse_binary_masks()
        #: The images' entropy indexes (:meth:`with_entropy_index`), or ``None``.
        self.entropy_indexes: EntropyIndexes | None = None

    def _refuse_binary_masks(self) -> None:
        """Refuse paired masks that look coded 0/255 (the common binary convention) unless a ``label_map`` says so.

        255 is the ignore index: such masks would lose every foreground pixel from the loss and metrics, silently.

        Raises:
            ValueError: If the first (up to 8) masks hold no value but 0 and 255, and some 255.
        """
        first = range(min(8, len(self)))
        values: set[int] = set()
        for i, data in zip(first, self.storage.read_many([self.pairs.masks[i] for i in first])):
            values.update(np.unique(read_mask(_checked(data, self.mask_path(i)), self.mask_path(i))).tolist())
        if values <= {0, 255} and 255 in values:
            raise InvalidValueError(
                f"The masks of {self.root} (e.g. {self.mask_path(0)}) hold only 0 and 255: binary masks coded 0/255? "
                "255 is the ignore index, so every foreground pixel would be left out of the loss and the metrics. "
                "For binary masks give label_map={0: 0, 255: 1} (and num_classes=2); if 255 means 'ignore' here, "
                "say so with label_map={0: 0, 255: 255}."
            )

    @property
    def layout(self) -> str:
        """The layout read (``"auto"`` resolved)."""
        return self.pairs.layout

    def image_path(self, index: int) -> str:
        """Sample ``index``'s image (path or URL)."""
        return self.storage.url(self.pairs.images[index])

    def mask_path(self, index: int) -> str:
        """Sample ``index``'s mask (path or URL)."""
        return self.storage.url(self.pairs.masks[index])

    def __len__(self) -> int:
        return len(self.pairs.images)

    def image_files(self) -> FileIndex:
        """The split's images as a file list, in order (what their entropy index is built from)."""
        return FileIndex.of_paths(self.root, list(self.pairs.images))

    def with_entropy_index(self, indexes: EntropyIndexes | None) -> SegmentationFolderDataset:
        """A copy whose training crops are decoded with the images' entropy ``indexes`` (of :meth:`image_files`).

        Raises:
            ValueError: If ``indexes`` holds another number of files.
        """
        if indexes is not None and len(indexes) != len(self):
            raise InvalidValueError(f"The entropy index holds {len(indexes)} files, the split {len(self)}.")
        twin = copy.copy(self)
        twin.entropy_indexes = indexes
        return twin

    def fingerprint(self) -> str:
        """The root, the pairs, and each local file's size and modification time (a bucket's: the names only)."""
        parts = [self.root, *self.pairs.images, *self.pairs.masks]
        if not is_url(self.root):
            for rel in (*self.pairs.images, *self.pairs.masks):
                st = os.stat(os.path.join(self.root, rel))
                parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def masks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every sample's mask as the data's classes, read in groups (a bucket's requests in flight together)."""
        for start in range(0, len(self), 64):
            indices = range(start, min(start + 64, len(self)))
            read = self.storage.read_many([self.pairs.masks[i] for i in indices])
            for i, value in zip(indices, read):
                name = self.mask_path(i)
                yield i, map_mask(read_mask(_checked(value, name), name), self.table, name, self.num_classes,
                                  self.ignore_index)  # fmt: skip

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """A batch: images (uint8 ``N x 3 x H x W``) and masks (uint8 ``N x H x W``), padded to the largest."""
        full = [sample_key(k, len(self)) for k in keys]
        paths = [p for f in full for p in (self.pairs.images[f[1]], self.pairs.masks[f[1]])]
        read = list(self.storage.read_many(paths))  # a bucket's reads in flight together
        samples = []
        for j, (f, draws) in enumerate(zip(full, self.draws_of(full))):
            names = (self.image_path(f[1]), self.mask_path(f[1]))
            data, mask_data = _checked(read[2 * j], names[0]), _checked(read[2 * j + 1], names[1])
            mask = self.classes_of(read_mask(mask_data, names[1]), names[1])
            entropy = None if self.entropy_indexes is None else self.entropy_indexes.get(f[1])
            samples.append(self.render(f, data, mask, names, draws, entropy))
        return self.batch(samples, full)


class SegmentationPredictBatch(NamedTuple):
    """A segmentation ``trainer.predict`` batch: uint8 ``images``, their ``indices``, and ``sizes``.

    ``sizes`` (``N x 4`` int64): each image's own height and width, then the height and width it was resized to
    (at the batch's top left; the rest is padding): what a prediction is cut to and resized back from.
    """

    images: torch.Tensor
    indices: torch.Tensor
    sizes: torch.Tensor
