"""What every image dataset of this package shares: keys, per-sample augmentation, whole-batch fetch."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from lightning_fastdata.augment.geometry import (
    Box,
    center_crop_box,
    crop_draws,
    flip_of,
    random_resized_crop_box,
    resize_crop_into,
)
from lightning_fastdata.augment.sample import SampleTransform
from lightning_fastdata.datasets.settings import AugmentSettings
from lightning_fastdata.errors import DataError, InvalidValueError, StorageError
from lightning_fastdata.loading.batch import Batch, DeviceBatch, EncodedBatch, PredictBatch
from lightning_fastdata.loading.corrupt import reset_skips, skip_corrupt, skip_counts, skips_in
from lightning_fastdata.loading.index.identity import DataIdentity, label_hashes, mix
from lightning_fastdata.loading.jpeg.decode import decode_resized_crop
from lightning_fastdata.loading.jpeg.device import plan_crop
from lightning_fastdata.loading.sampler import BatchLookahead, SampleKey
from lightning_fastdata.loading.sampling import map_labels
from lightning_fastdata.loading.transport.collate import EncodedRows, empty_image_batch

__all__ = ["AugmentedImageDataset", "LoaderPlan", "Source"]

log = logging.getLogger("lightning_fastdata")

#: What a subclass hands over for one sample. Encoded file bytes, a decoded ``3 x H x W`` tensor, or the
#: ``OSError`` met while reading it (raised as a :class:`~lightning_fastdata.errors.StorageError` when its turn
#: comes, whatever ``on_corrupt`` says: a read that failed is not a corrupt image).
Source = bytes | torch.Tensor | OSError


@dataclass(frozen=True)
class LoaderPlan:
    """How one loader reads an :class:`AugmentedImageDataset` (:meth:`AugmentedImageDataset.for_loader`).

    Known when the loader is built (its sampler, its workers, the device work), not when the dataset is.

    Attributes:
        return_keys: Batches carry each sample's key (``N x 3`` int64 ``(epoch, index, repeat)``) in a
            :class:`~lightning_fastdata.loading.batch.DeviceBatch`: the device augmentation draws from them.
        lookahead: The loader's next batch's samples, for :meth:`AugmentedImageDataset.read_ahead` (a bucket read
            by workers); ``None``: no reads ahead.
        epoch_samples: Samples one epoch of this loader reads (this rank's), what ``max_corrupt_fraction`` is a
            fraction of; ``None``: the whole dataset.
        label_map: The batches' labels in a subset's class list (``classes=``): an ``int64`` lookup of class
            positions, or the columns of multi-hot rows kept
            (:class:`~lightning_fastdata.loading.sampling.Subset`); ``None``: the dataset's labels.
        predicting: A ``trainer.predict`` loader: batches are :class:`~lightning_fastdata.loading.batch.PredictBatch`
            (the second field each image's index in the input list), not ``Batch`` (labels).
        decode_on_device: Batches are :class:`~lightning_fastdata.loading.batch.EncodedBatch`: JPEG bytes, crop
            boxes and flips, decoded on the training device (``decode_on="device"``).
    """

    return_keys: bool = False
    lookahead: BatchLookahead | None = None
    epoch_samples: int | None = None
    label_map: np.ndarray | None = None
    predicting: bool = False
    decode_on_device: bool = False


class AugmentedImageDataset(Dataset):
    """Base of the image datasets: returns whole uint8 batches with per-sample random resized crops.

    Subclasses say how many samples there are, their labels, and how to fetch a batch of sources
    (:meth:`read_sources`); this class plans each sample's crop and flip, decodes or resizes into one
    shared uint8 ``N x 3 x S x S`` channels-last batch, and applies the corrupt-image policy.

    Keys are plain indices or ``(epoch, index)`` pairs (from :class:`~lightning_fastdata.EpochSampler`; ``(epoch,
    index, repeat)`` with repeated augmentation). With pairs, a sample's crop, flip and ``transform`` are a function
    of ``(seed, epoch, index, repeat)``: the same whatever the worker count or prefetch depth, and different every
    epoch (and every repeat). With plain indices they are drawn from torch's global generator (seeded per worker by
    the ``DataLoader``).

    Args:
        train: ``RandomResizedCrop`` + horizontal flip if ``True``; central crop if ``False``.
        image_size: Side of the square output.
        scale: Area range of the random crop, as in ``RandomResizedCrop``.
        ratio: Aspect-ratio range of the random crop.
        crop_fraction: Evaluation crop as a fraction of the shorter side (0.875 is 224 of 256).
        seed: Seed of the per-sample augmentation.
        on_corrupt: ``"raise"`` (default) raises an error naming the sample; ``"skip"`` logs it, leaves it out of
            its batch (which is then one shorter) and counts it in :meth:`skipped_count`. Only images that were read
            and do not decode are corrupt: a read that fails (network, throttling, timeout, permission, a file gone)
            raises a :class:`~lightning_fastdata.errors.StorageError` either way.
        max_corrupt_fraction: With ``on_corrupt="skip"``: the most images one epoch may skip, as a fraction of the
            samples it reads (:attr:`epoch_samples`, rounded up: at least one for any fraction above 0); one more
            stops with a ``DataError`` that says how many were skipped and why. 0 stops at the first, 1 never.
        exact_decode: Decode JPEGs at full size with the exact IDCT (see
            :func:`~lightning_fastdata.loading.jpeg.decode.decode_resized_crop`'s ``exact``).
        transform: Applied to each sample after the crop (and flip): a uint8 ``3 x S x S`` tensor in, the same shape
            and dtype out (a ``torchvision.transforms.v2`` transform, a ``Compose``, any callable); its randomness
            comes from torch's generator seeded from the sample's key
            (``lightning_fastdata.augment.sample.SampleTransform``).

    Raises:
        ValueError: On an impossible argument (:class:`~lightning_fastdata.datasets.settings.AugmentSettings`).
    """

    def __init__(
        self,
        train: bool = True,
        image_size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        crop_fraction: float = 0.875,
        seed: int = 0,
        on_corrupt: Literal["raise", "skip"] = "raise",
        exact_decode: bool = False,
        max_corrupt_fraction: float = 0.01,
        transform: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        settings = AugmentSettings(
            image_size, scale, ratio, crop_fraction, seed, on_corrupt, exact_decode, max_corrupt_fraction
        )
        self.train = train
        self.image_size = settings.image_size
        self.scale = settings.scale
        self.ratio = settings.ratio
        self.crop_fraction = settings.crop_fraction
        self.seed = settings.seed
        self.on_corrupt = settings.on_corrupt
        self.exact_decode = settings.exact_decode
        self.max_corrupt_fraction = settings.max_corrupt_fraction
        self.transform = None if transform is None else SampleTransform(transform, self.seed)
        self._loading = LoaderPlan()
        self._identity: DataIdentity | None = None
        # Shared memory, so that counts made in worker processes are visible to the main process.
        self._skipped = skip_counts()

    def for_loader(self, plan: LoaderPlan) -> Self:
        """This dataset as one loader reads it: a shallow copy with ``plan``; this object is left as it is.

        The copy shares the data, the identity and the corrupt-image counts (:meth:`skipped_count` of either is the
        same); per-process handles are opened by whichever process reads.
        """
        twin = object.__new__(type(self))  # not copy.copy: that goes through __getstate__, which drops the handles
        twin.__dict__.update(self.__dict__, _loading=plan)
        return twin

    @property
    def return_keys(self) -> bool:
        """Whether batches carry their samples' keys (:attr:`LoaderPlan.return_keys`)."""
        return self._loading.return_keys

    @property
    def epoch_samples(self) -> int | None:
        """Samples one epoch reads (:attr:`LoaderPlan.epoch_samples`); ``None``: the whole dataset."""
        return self._loading.epoch_samples

    @property
    def lookahead(self) -> BatchLookahead | None:
        """The next batch's samples, for :meth:`read_ahead` (:attr:`LoaderPlan.lookahead`)."""
        return self._loading.lookahead

    #: Attributes that hold per-process handles such as open files and memory maps. Never pickled, and dropped in a
    #: process that inherited them through ``fork``, so that each process opens its own.
    per_process_attrs: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update({name: None for name in (*self.per_process_attrs, "_pid", "_identity")})
        return state

    def _handles_open(self) -> bool:
        """Whether this process opened the handles; if not, drop any inherited ones (call, then open, then mark)."""
        if self.__dict__.get("_pid") == os.getpid():
            return True
        for name in self.per_process_attrs:
            setattr(self, name, None)
        return False

    def _mark_handles_open(self) -> None:
        self._pid = os.getpid()

    # -- what subclasses provide -----------------------------------------------------------------------
    @property
    def targets(self) -> np.ndarray:
        """All labels (int64), in sample order (torchvision's name)."""
        raise NotImplementedError

    def read_sources(self, indices: np.ndarray) -> list[Source] | Iterator[Source]:
        """Return the sources of ``indices``, in that order (read them in whatever order is fastest).

        A list, or an iterator of encoded bytes (or ``OSError``) that may still be fetching later ones.
        """
        raise NotImplementedError

    @property
    def reads_ahead(self) -> bool:
        """Whether :meth:`read_ahead` does anything (the DataModule plans a :attr:`lookahead` only then)."""
        return False

    #: How many of this worker's next batches :meth:`read_ahead` is given (their indices, in order).
    read_ahead_batches = 1

    def read_ahead(self, indices: np.ndarray) -> None:
        """Start reading the sources of ``indices`` (this worker's next batch) now; by default nothing.

        Called once the current batch's reads have started; a subclass whose reads wait on a network (a bucket)
        starts the next batch's requests so they arrive while this batch decodes.
        """

    def describe(self, index: int) -> str:
        """Name sample ``index`` in messages (a file path, or ``file[key][index]``)."""
        return f"sample {index}"

    def entropy_index_of(self, index: int) -> bytes | None:
        """Sample ``index``'s entropy index (:mod:`lightning_fastdata.loading.jpeg.entropy_index`), if it has one."""
        return None

    def make_identity(self) -> DataIdentity:
        """Which sample each index names (see :mod:`lightning_fastdata.loading.index.identity`); by default the labels.

        Subclasses add what names a sample: a file's path and version, an HDF5 row and its length.
        """
        samples = mix(np.arange(len(self), dtype=np.uint64)) ^ label_hashes(self.targets)
        return DataIdentity.of(type(self).__name__, samples)

    # -- shared ----------------------------------------------------------------------------------------
    def labels_of(self, indices: np.ndarray) -> torch.Tensor:
        """The labels of ``indices`` as a batch carries them: in the loader's class list (``label_map``)."""
        return torch.from_numpy(np.ascontiguousarray(map_labels(self.targets[indices], self._loading.label_map)))

    def __len__(self) -> int:
        return len(self.targets)

    def identity(self) -> DataIdentity:
        """:meth:`make_identity`, computed once per process (a resume state carries it)."""
        if self._identity is None:
            self._identity = self.make_identity()
        return self._identity

    def skipped_count(self, epoch: int | None = None) -> int:
        """Corrupt images skipped so far across all worker processes, in ``epoch`` or in total."""
        return skips_in(self._skipped, epoch)

    def reset_skipped_count(self, epoch: int | None = None) -> None:
        """Set :meth:`skipped_count` (of ``epoch``, or all) back to zero."""
        reset_skips(self._skipped, epoch)

    def _key(self, key: int | SampleKey) -> tuple[int, int, int]:
        """``(epoch, index, repeat)`` of a key; a plain index gets a random epoch (torch's generator) and repeat 0."""
        if isinstance(key, (tuple, list)):
            full = (int(key[0]), int(key[1]), int(key[2]) if len(key) > 2 else 0)
        else:
            full = (int(torch.randint(2**62, ()).item()) if self.train else 0, int(key), 0)
        if not 0 <= full[1] < len(self):
            raise IndexError(f"index {full[1]} is out of range for a dataset of {len(self)} images.")
        return full

    def _crop_draws(self, full_keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray | None]:
        """Each sample's crop-and-flip draws (training), or ``None`` per sample (the centre crop, no flip)."""
        if not self.train:
            return [None] * len(full_keys)
        return list(crop_draws(self.seed, full_keys))

    def _crop_plan(self, draws: np.ndarray | None) -> tuple[bool, Callable[[int, int], Box]]:
        """A sample's flip and its crop box as a function of the image's ``(width, height)``."""
        if draws is None:
            return False, lambda w, h: center_crop_box(w, h, self.crop_fraction)
        return flip_of(draws), lambda w, h: random_resized_crop_box(draws, w, h, self.scale, self.ratio)

    def _render(
        self,
        out: torch.Tensor,
        source: bytes | torch.Tensor,
        draws: np.ndarray | None,
        name: str,
        entropy_index: bytes | None = None,
    ) -> None:
        """Write the (augmented) resized crop of ``source`` into ``out``."""
        flip, box_fn = self._crop_plan(draws)
        if isinstance(source, torch.Tensor):
            top, left, h, w = box_fn(int(source.shape[2]), int(source.shape[1]))
            resize_crop_into(out, source[:, top : top + h, left : left + w], flip)
        else:
            decode_resized_crop(
                source, out, box_fn, flip=flip, name=name, exact=self.exact_decode, entropy_index=entropy_index
            )

    def skip_sample(self, key: int | SampleKey, index: int, err: BaseException) -> None:
        """A corrupt sample: raised (``on_corrupt="raise"``), or logged and counted (past the bound: raised)."""
        samples = len(self) if self.epoch_samples is None else self.epoch_samples
        epoch = key[0] if isinstance(key, (tuple, list)) else None
        skip_corrupt(self._skipped, self.on_corrupt, self.max_corrupt_fraction, epoch, err, self.describe(index),
                     samples)  # fmt: skip

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int | torch.Tensor]:
        """``(image, label)``: the label an int, or a multi-hot ``uint8`` row where samples have several labels."""
        images, labels = self.__getitems__([key])[:2]
        if len(labels) == 0:
            raise DataError(f"{self.describe(self._key(key)[1])} is corrupt and was skipped (on_corrupt='skip').")
        return images[0], (int(labels[0]) if labels.dim() == 1 else labels[0])

    def _finish(self, images: torch.Tensor, slot: int, full_key: tuple[int, int, int]) -> None:
        """Apply the user's per-sample ``transform`` to the rendered ``images[slot]``, in place."""
        if self.transform is not None:  # (the transform gets a contiguous copy: torch's ops on it are 1.3-2x faster)
            self.transform.apply_into(images[slot], full_key)

    def _batch(
        self, images: torch.Tensor, labels: torch.Tensor, full_keys: list[tuple[int, int, int]], **crop: torch.Tensor
    ) -> Batch | PredictBatch | DeviceBatch:
        """A ``Batch`` (``PredictBatch`` in predict), or a ``DeviceBatch`` when the training device has work on it.

        That work: the policies, which draw from the samples' keys (``return_keys``); the cache's crop (``crop``:
        ``boxes`` and ``flips``).
        """
        keys = torch.tensor(full_keys, dtype=torch.int64).view(-1, 3) if self.return_keys else None
        if keys is None and not crop:
            return PredictBatch(images, labels) if self._loading.predicting else Batch(images, labels)
        return DeviceBatch(images, labels, keys, **crop)

    def __getitems__(self, keys: Sequence[int | SampleKey]) -> tuple[torch.Tensor, ...] | DeviceBatch | EncodedBatch:
        """Fetch and render a whole batch into one shared uint8 tensor; ``(images, labels)`` or a ``DeviceBatch``.

        With the device decode (``decode_on="device"``), an ``EncodedBatch`` of the JPEGs and their crops instead.
        """
        if self._loading.decode_on_device:
            return self.encode(keys).pack(self.return_keys, self._loading.predicting)
        images, labels, full_keys, kept = self.render(keys)
        if not kept.all():
            mask = torch.from_numpy(kept)
            full_keys = [k for k, keep in zip(full_keys, kept) if keep]
            return self._batch(images[mask].contiguous(memory_format=torch.channels_last), labels[mask], full_keys)
        return self._batch(images, labels, full_keys)

    def render(
        self, keys: Sequence[int | SampleKey], out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]], np.ndarray]:
        """Render the samples of ``keys`` into ``out`` (``len(keys) x 3 x S x S``; default: a new shared batch).

        Returns ``(images, labels, full keys, kept)``: every row's label and key, and which rows hold an image (a
        corrupt one skipped with ``on_corrupt="skip"`` leaves its row unwritten). A mix of datasets renders each
        source's samples into its slice of one batch this way (``datasets.mixed``).

        Raises:
            ValueError: If ``out`` has another dtype than this dataset's images (uint8 against float arrays).
        """
        full_keys = [self._key(key) for key in keys]
        draws = self._crop_draws(full_keys)
        indices = np.fromiter((key[1] for key in full_keys), dtype=np.int64, count=len(full_keys))
        sources = self.read_sources(indices)
        # a list may hold decoded tensors (their dtype sets the batch's); an iterator yields encoded bytes as they
        # arrive, decoded while the rest are still being fetched
        first = next((s for s in sources if isinstance(s, torch.Tensor)), None) if isinstance(sources, list) else None
        dtype = torch.uint8 if first is None else first.dtype
        if out is None:
            images = empty_image_batch(len(keys), self.image_size, self.image_size, dtype=dtype)
        elif out.dtype != dtype:
            raise InvalidValueError(
                f"{self.describe(int(indices[0]))} decodes to {dtype} images, the batch is {out.dtype}: a mix takes "
                "sources of one pixel type (uint8 images, or float arrays, not both)."
            )
        else:
            images = out
        kept = np.ones(len(keys), dtype=bool)
        for slot, key, index, sample_draws, source in self._in_order(keys, indices, draws, sources):
            try:
                self._render(images[slot], source, sample_draws, self.describe(index), self.entropy_index_of(index))
            except OSError as err:
                self.skip_sample(key, index, err)
                kept[slot] = False
                continue
            self._finish(images, slot, full_keys[slot])
        return images, self.labels_of(indices), full_keys, kept

    def encode(self, keys: Sequence[int | SampleKey]) -> EncodedRows:
        """Plan the samples of ``keys`` for the device decode: each JPEG's bytes, crop box and flip, nothing decoded.

        The boxes and flips are the ones :meth:`render` draws for the same keys; a sample the device cannot decode (a
        PNG, a CMYK JPEG, pixels) is rendered here, and a corrupt one (an unreadable header) handled as
        ``on_corrupt`` says.

        Raises:
            ValueError: If the dataset has a per-sample ``transform`` (it runs on the crop, which the device makes).
        """
        if self.transform is not None:
            raise InvalidValueError(
                "decode_on='device' crops on the training device, after the loader workers: a per-sample "
                "train_transforms/val_transforms cannot run on the crop there. Pass the policy as device_transforms "
                "(TrivialAugmentWide, RandAugment, ...), or decode in the workers (decode_on='workers')."
            )
        full_keys = [self._key(key) for key in keys]
        draws = self._crop_draws(full_keys)
        indices = np.fromiter((key[1] for key in full_keys), dtype=np.int64, count=len(full_keys))
        rows = EncodedRows(self.image_size, full_keys=full_keys, indices=indices, labels=self.labels_of(indices))
        for slot, key, index, sample_draws, source in self._in_order(keys, indices, draws, self.read_sources(indices)):
            name = self.describe(index)
            flip, box_fn = self._crop_plan(sample_draws)
            if isinstance(source, torch.Tensor) and source.dtype != torch.uint8:
                raise InvalidValueError(
                    f"{name} holds {source.dtype} pixels: decode_on='device' decodes JPEG bytes (uint8 images); "
                    "use decode_on='workers'."
                )
            try:
                box = None if isinstance(source, torch.Tensor) else plan_crop(source, box_fn, name)
                if box is not None:
                    rows.add(source, box, flip, name)  # type: ignore[arg-type]  # bytes: plan_crop read them
                    continue
                pixels = torch.empty((self.image_size, self.image_size, 3), dtype=torch.uint8).permute(2, 0, 1)
                self._render(pixels, source, sample_draws, name, self.entropy_index_of(index))
                rows.rendered[slot] = pixels
            except OSError as err:
                self.skip_sample(key, index, err)
            rows.add(None, (0, 0, 0, 0), False, name)
        return rows

    def _in_order(
        self, keys: Sequence[Any], indices: np.ndarray, draws: list[np.ndarray | None], sources: Any
    ) -> Iterator[tuple[Any, Any, int, np.ndarray | None, bytes | torch.Tensor]]:
        """``(slot, key, index, draws, source)`` of each sample as its source arrives; the next batch's reads started.

        Raises:
            StorageError: For a source that could not be read (never a corrupt image: ``on_corrupt`` does not apply).
        """
        for slot, (key, index, sample_draws, source) in enumerate(zip(keys, indices.tolist(), draws, sources)):
            if slot == 0 and self.lookahead is not None and (info := get_worker_info()) is not None:
                # this batch's reads are under way now
                ahead = self.lookahead.after(keys, info.num_workers, self.read_ahead_batches)
                if ahead is not None:
                    self.read_ahead(ahead)
            if isinstance(source, OSError):
                raise StorageError(
                    f"Could not read {self.describe(index)}: {str(source).rstrip('.')}. A failed read is not a "
                    "corrupt image, so on_corrupt='skip' does not skip it: check the storage (network, credentials, "
                    "the file) and resume from the last checkpoint."
                ) from source
            yield slot, key, index, sample_draws, source
