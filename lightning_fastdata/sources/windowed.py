"""``WindowedDataset``: a source's samples, each an image and what rides with it, through one window.

The base of the windowed sources (a folder or bucket: :mod:`~lightning_fastdata.sources.folder`;
:mod:`~lightning_fastdata.sources.hdf5`, :mod:`~lightning_fastdata.sources.tar`,
:mod:`~lightning_fastdata.sources.parquet`; the decoded cache of :mod:`~lightning_fastdata.sources.cache`). A
source lists its samples and reads a group of them (:meth:`WindowedDataset.read_fields`: each image, encoded bytes or a
decoded ``3 x H x W`` uint8 tensor, and its target's payload, the reads in flight together), names them, and says what
identifies its data (:meth:`WindowedDataset.fingerprint`). What the payload is, this class leaves to its
:class:`~lightning_fastdata.sources.target.TargetKind` (a mask: :mod:`~lightning_fastdata.segmentation.target`).

Each sample's image and target go through one :class:`~lightning_fastdata.sources.window.Window` (torchvision's
segmentation reference: a random resize, a flip and a padded crop in training; the base size in evaluation; or
``RandomResizedCrop``): the image decoded only where the window needs it, the target moved to the same place by the
target kind. A batch is a :class:`~lightning_fastdata.loading.batch.Batch` of uint8 images ``N x 3 x H x W`` and the
target kind's batch (evaluation batches padded to their largest image).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator, Sequence
from typing import Any, Self

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from lightning_fastdata.augment.geometry import crop_draws, random_resized_crop_box, resize_crop_into
from lightning_fastdata.errors import CORRUPT_IMAGE_ADVICE, CorruptImageError, DataError, InvalidValueError
from lightning_fastdata.loading.batch import Batch, DeviceBatch
from lightning_fastdata.loading.corrupt import reset_skips, skip_corrupt, skip_counts, skips_in
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.loading.transport.collate import empty_image_and_mask_batch, empty_image_batch
from lightning_fastdata.sources.target import TargetKind
from lightning_fastdata.sources.window import Window, WindowRecipe, eval_window, train_window, window_draws

__all__ = ["WindowedDataset", "checked_read", "padded_batch", "sample_key"]


def checked_read(value: bytes | OSError, name: str) -> bytes:
    """A storage read's bytes, or the error that read met, raised naming ``name``."""
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


def padded_batch(samples: Sequence[tuple[torch.Tensor, torch.Tensor | None]], fill: int) -> tuple[torch.Tensor, Any]:
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


class WindowedDataset(Dataset):
    """What every windowed source shares: the window settings, each sample's window, a batch rendered through it.

    A subclass lists its samples (``__len__``), reads a group of them (:meth:`read_fields`), names them
    (:meth:`name`) and says what identifies its data (:meth:`fingerprint`); the ``target`` decodes, follows, counts
    and batches what rides with each image.

    Args:
        target: What rides with each image (:class:`~lightning_fastdata.sources.target.TargetKind`).
        train: The training window (random resize, flip, padded crop); else the evaluation one (base size).
        base_size: The reference's base size (its ``--base-size``, 520).
        crop_size: The training crop (its ``--crop-size``, 480).
        hflip_prob: The flip's probability.
        seed: The seed every sample's window is drawn from, with its key ``(epoch, index, repeat)``.

    Raises:
        ValueError: On a bad argument (named).
    """

    def __init__(
        self,
        target: TargetKind,
        train: bool = True,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        seed: int = 0,
    ) -> None:
        if base_size < 1 or crop_size < 1:
            raise InvalidValueError(f"base_size and crop_size should be positive, got {base_size!r}, {crop_size!r}.")
        self.target = target
        self.train, self.base_size, self.crop_size = train, base_size, crop_size
        self.hflip_prob, self.seed = hflip_prob, seed
        #: Whether :attr:`targets` reads every payload (sampling by class), or only counts the samples.
        self.presence_needed = False
        #: Whether batches carry their samples' keys (:meth:`keyed`).
        self.return_keys = False
        #: ``None`` for the reference's training crop (random resize, flip, padded crop), else
        #: ``RandomResizedCrop``'s ``(scale, ratio)`` (:meth:`random_resized`).
        self.random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
        #: A task's own geometry (:meth:`with_recipe`), in place of the settings above; ``None``: theirs.
        self.recipe: WindowRecipe | None = None
        #: Each sample's aspect-ratio group (:meth:`grouped_by_aspect`): the training loader batches by it; or ``None``.
        self.aspect_groups: np.ndarray | None = None
        self._presence: np.ndarray | None = None
        #: This worker's next batches' samples (:meth:`reading_ahead`), or ``None``: no reads ahead.
        self.lookahead: Any = None
        #: What a corrupt image does (:meth:`skipping`): ``"raise"``, or ``"skip"`` up to ``max_corrupt_fraction``.
        self.on_corrupt, self.max_corrupt_fraction = "raise", 0.01
        self._skipped = skip_counts()  # shared by every copy and worker

    # -- what a source provides --------------------------------------------------------------------------
    def __len__(self) -> int:
        raise NotImplementedError

    def read_fields(self, indices: Sequence[int]) -> list[tuple[bytes | torch.Tensor, Any]]:
        """Each sample's image (encoded, or ``3 x H x W`` uint8) and its target's payload, in the order asked.

        Read in whatever order is fastest, a bucket's requests in flight together.

        Raises:
            DataError: If a sample cannot be read (named).
        """
        raise NotImplementedError

    def read_payloads(self, indices: Sequence[int]) -> list[Any]:
        """The payloads alone of ``indices`` (what sampling counts); by default :meth:`read_fields`' second fields."""
        return [payload for _, payload in self.read_fields(indices)]

    def name(self, index: int, what: int = 0) -> str:
        """Sample ``index``'s image (``what=0``) or payload (``1``), as messages name it."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """What identifies the source's data: its samples and their files' sizes and times (a cache's name)."""
        raise NotImplementedError

    def decode_payload(self, payload: Any, name: str) -> Any:
        """A payload as the target's value in the data's classes (a cache of values: as it is)."""
        return self.target.decode(payload, name)

    # -- copies ------------------------------------------------------------------------------------------
    def random_resized(self, scale: tuple[float, float], ratio: tuple[float, float]) -> Self:
        """A copy whose training window is ``RandomResizedCrop(crop_size, scale, ratio)`` then the flip.

        torchvision's box (ten tries, then the centre), its numbers drawn from the sample's key, for the image and
        its target alike; the output is always ``crop_size`` square, without padding.
        """
        twin = copy.copy(self)
        twin.random_resized_crop = (tuple(scale), tuple(ratio))  # type: ignore[assignment]
        return twin

    def skipping(self, on_corrupt: str, max_corrupt_fraction: float) -> Self:
        """A copy that meets a corrupt image as ``on_corrupt`` says: ``"raise"`` (naming it), or ``"skip"``.

        A skipped image is logged and counted (:meth:`skipped_count`, over every worker) and its batch is one
        smaller; past ``max_corrupt_fraction`` of an epoch's samples the epoch stops, naming the last one
        (:func:`~lightning_fastdata.loading.corrupt.skip_corrupt`). A read that failed is never skipped.
        """
        twin = copy.copy(self)
        twin.on_corrupt, twin.max_corrupt_fraction = on_corrupt, max_corrupt_fraction
        return twin

    @property
    def reads_ahead(self) -> bool:
        """Whether the next batches' reads can start early (a source read in windows of groups from a bucket)."""
        return (
            getattr(self, "_storage", None) is not None
            and getattr(self, "windows", None) is not None
            and hasattr(self, "read_groups_ahead")
        )

    def reading_ahead(self, lookahead: Any) -> Self:
        """A copy that requests this worker's next batches' groups while it decodes the current one.

        ``lookahead``: the loader's :class:`~lightning_fastdata.loading.sampler.BatchLookahead` (the loader builds it
        where :attr:`reads_ahead`); a guess that does not match the order starts nothing and decides nothing.
        """
        twin = copy.copy(self)
        twin.lookahead = lookahead
        return twin

    def skipped_count(self, epoch: int | None = None) -> int:
        """Corrupt images skipped so far, over every worker, in ``epoch`` or in total."""
        return skips_in(self._skipped, epoch)

    def reset_skipped_count(self, epoch: int | None = None) -> None:
        """Set :meth:`skipped_count` (of ``epoch``, or all) back to zero."""
        reset_skips(self._skipped, epoch)

    def kept(self, positions: Sequence[int] | None, presence: bool) -> Self:
        """A copy keeping ``positions``' classes, and reading each image's classes as :attr:`targets` (``presence``).

        Its targets are renumbered: class ``positions[k]`` becomes ``k``, the others no class (``None``: unchanged).
        """
        twin = copy.copy(self)
        twin.target, twin.presence_needed = self.target.kept(positions), presence
        return twin

    def renumbered(self, class_map: np.ndarray | None) -> Self:
        """A copy whose classes are relabelled ``c -> class_map[c]`` (``-1``: no class), what a mix sets."""
        twin = copy.copy(self)
        twin.target = self.target.mapped(class_map)
        return twin

    def evaluated(self, base_size: int | None) -> Self:
        """A copy reading each sample whole at the evaluation size ``base_size`` (``None``: as it is), data's classes.

        No recipe's window; the target as evaluation reads it
        (:meth:`~lightning_fastdata.sources.target.TargetKind.evaluating`).
        """
        twin = self.renumbered(None)
        twin.train, twin.base_size, twin.recipe = False, base_size, None  # type: ignore[assignment]
        twin.target = twin.target.evaluating()
        return twin

    def with_recipe(self, recipe: WindowRecipe | None) -> Self:
        """A copy whose windows are ``recipe``'s (a detection recipe's flip, resize, zoom-out, crop), train or not."""
        twin = copy.copy(self)
        twin.recipe = recipe
        return twin

    def image_sizes(self) -> np.ndarray:
        """Each sample's image ``(width, height)`` as stored, ``N x 2``: every image read once for its header.

        Raises:
            DataError: If an image cannot be read (named).
        """
        sizes = np.zeros((len(self), 2), dtype=np.int64)
        for first in range(0, len(self), 64):
            indices = list(range(first, min(first + 64, len(self))))
            for i, (image, _) in zip(indices, self.read_fields(indices)):
                sizes[i] = _image_size(image, self.name(i))
        return sizes

    def grouped_by_aspect(self, factor: int) -> Self:
        """A copy whose training batches are each of one aspect-ratio group (torchvision's ``GroupedBatchSampler``).

        The groups are torchvision's ``create_aspect_ratio_groups(k=factor)``: width / height binned at ``2 **
        linspace(-1, 1, 2 * factor + 1)`` (``factor=0``: portrait and landscape). Reads each image's size
        (:meth:`image_sizes`).
        """
        sizes = self.image_sizes().astype(np.float64)
        bins = sorted((2 ** np.linspace(-1, 1, 2 * factor + 1)).tolist()) if factor > 0 else [1.0]
        twin = copy.copy(self)
        twin.aspect_groups = np.searchsorted(np.asarray(bins), sizes[:, 0] / sizes[:, 1], side="right")
        return twin

    def keyed(self) -> Self:
        """A copy whose batches carry their samples' keys (the device policies draw from them)."""
        twin = copy.copy(self)
        twin.return_keys = True
        return twin

    # -- sampling ----------------------------------------------------------------------------------------
    @property
    def targets(self) -> np.ndarray:
        """What sampling draws by.

        Each sample's classes present (``N x num_classes`` 0/1, in the data's classes; every payload read once) when
        :attr:`presence_needed`, else one 0 per sample (only the count matters).
        """
        if not self.presence_needed:
            return np.zeros(len(self), dtype=np.int64)
        if self._presence is None:
            presence = np.zeros((len(self), self.target.num_classes), dtype=np.uint8)
            for index, value in self.values():
                presence[index] = self.target.present(value)
            self._presence = presence
        return self._presence

    def values(self) -> Iterator[tuple[int, Any]]:
        """Every sample's target value in the data's classes (before ``classes=``), in order: ``(index, value)``."""
        for first in range(0, len(self), 64):
            indices = list(range(first, min(first + 64, len(self))))
            for i, payload in zip(indices, self.read_payloads(indices)):
                yield i, self.decode_payload(payload, self.name(i, 1))

    # -- windows and batches -----------------------------------------------------------------------------
    def window(
        self,
        full_key: tuple[int, int, int],
        width: int,
        height: int,
        draws: np.ndarray | None = None,
        value: Any = None,
    ) -> Window:
        """The sample's window: the recipe's, the training one drawn from its key, or the evaluation one.

        ``draws``: the sample's numbers, drawn already (:meth:`draws_of`); ``value``: its target (a recipe's crop
        may depend on it).
        """
        if self.recipe is not None:
            if draws is None:
                draws = self.recipe.draws(self.seed, [full_key])[0]
            return self.recipe.window(draws, width, height, value)
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
        """Each sample's window numbers, drawn together (training, or a recipe's), or ``None`` each (evaluation)."""
        if self.recipe is not None:
            return self.recipe.draws(self.seed, keys)
        if not self.train:
            return [None] * len(keys)
        if self.random_resized_crop is not None:
            return list(crop_draws(self.seed, keys))
        return list(window_draws(self.seed, keys))

    def render(
        self,
        full_key: tuple[int, int, int],
        image: bytes | torch.Tensor,
        value: Any,
        names: tuple[str, str],
        draws: np.ndarray | None = None,
        entropy_index: bytes | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """One sample through its window: ``image`` (encoded, or ``3 x H x W`` uint8) and its target ``value``.

        ``entropy_index``: the encoded image's entropy index, if one was built (the crop is decoded alone: the same
        pixels, less work).

        Raises:
            DataError: If the value cannot be the image's (``names``: image, payload).
        """
        size = self.target.size_of(value)
        if size is None:
            size = _image_size(image, names[0])
        width, height = size

        def box(w: int, h: int) -> tuple[int, int, int, int]:  # the image is the size its target says, or an error
            if (w, h) != (width, height):
                self.target.check_size(value, w, h, names)
                raise DataError(f"{names[0]} is {w}x{h}, its header said {width}x{height}.")
            return win.box

        value = self.target.sized(value, width, height, names)
        if self.recipe is not None and draws is None:
            draws = self.recipe.draws(self.seed, [full_key])[0]
        win = self.window(full_key, width, height, draws, value)
        out = torch.zeros(*win.size, 3, dtype=torch.uint8).permute(2, 0, 1)  # channels-last, as the resize writes
        if any(win.fill):
            out.copy_(torch.tensor(win.fill, dtype=torch.uint8).view(3, 1, 1))
        top, left, ph, pw = win.place
        place = out[:, top : top + ph, left : left + pw]
        if isinstance(image, torch.Tensor):
            t, l_, h, w = box(int(image.shape[2]), int(image.shape[1]))
            resize_crop_into(place, image[:, t : t + h, l_ : l_ + w], win.flip)
        else:
            decode_resized_crop(image, place, box, win.flip, names[0], entropy_index=entropy_index)
        paint = getattr(self.recipe, "paint", None)
        if paint is not None:  # a recipe's pixel step (detection's photometric distortion): the image, not the fill
            place.copy_(paint(draws, place))
        followed = self.target.follow(value, win)
        after = getattr(self.recipe, "after", None)
        if after is not None:  # a recipe's step on the image and its target together (a user's transform)
            return after(full_key, out, followed)
        return out, followed

    def batch(self, samples: Sequence[tuple[torch.Tensor, Any]], keys: Any = None) -> Any:
        """Rendered samples as one batch (images padded to the largest, the target kind's batch beside them).

        A :class:`~lightning_fastdata.loading.batch.DeviceBatch` carrying the samples' ``keys`` where the device
        draws from them (:meth:`keyed`), else a :class:`~lightning_fastdata.loading.batch.Batch`.
        """
        images, targets = self.target.collate(samples)
        if self.return_keys and keys is not None:
            return DeviceBatch(images, targets, torch.tensor([tuple(k) for k in keys], dtype=torch.int64))
        return Batch(images, targets)

    def entropy_index_of(self, index: int) -> bytes | None:
        """Sample ``index``'s image's entropy index, where the source has one (a folder of files)."""
        return None

    def rendered(self, keys: Sequence[Any]) -> list[tuple[torch.Tensor, Any]]:
        """``keys``' samples, each read, its target decoded and relabelled, both through its window (not batched)."""
        full = [sample_key(k, len(self)) for k in keys]
        fields = self.read_fields([f[1] for f in full])
        if self.lookahead is not None and (info := get_worker_info()) is not None:  # the next window's runs, early
            ahead = self.lookahead.after(full, info.num_workers, getattr(self, "read_ahead_batches", 1))
            if ahead is not None:
                self.read_groups_ahead(ahead)  # type: ignore[attr-defined]
        samples = []
        for f, draws, (image, payload) in zip(full, self.draws_of(full), fields):
            names = (self.name(f[1]), self.name(f[1], 1))
            value = self.target.relabel(self.decode_payload(payload, names[1]))
            try:
                samples.append(self.render(f, image, value, names, draws, self.entropy_index_of(f[1])))
            except CorruptImageError as err:
                skip_corrupt(self._skipped, self.on_corrupt, self.max_corrupt_fraction, f[0], err, names[0], len(self))
        if not samples:
            raise DataError(f"Every image of a batch was corrupt and skipped, the first {self.name(full[0][1])}.")
        return samples

    def __getitems__(self, keys: Sequence[Any]) -> Any:
        """A batch of ``keys``' samples (:meth:`rendered`)."""
        return self.batch(self.rendered(keys), [sample_key(k, len(self)) for k in keys])

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, Any]:
        """``(image, target)`` of one sample, as its window renders them (the target kind's followed value)."""
        return self.rendered([key])[0]


def _image_size(image: bytes | torch.Tensor, name: str) -> tuple[int, int]:
    """An image's ``(width, height)``: a tensor's shape, or an encoded file's header."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[2]), int(image.shape[1])
    try:
        with Image.open(io.BytesIO(image)) as im:
            return im.size
    except OSError as err:
        raise CorruptImageError(f"{name} is not a readable image ({err})." + CORRUPT_IMAGE_ADVICE) from None
