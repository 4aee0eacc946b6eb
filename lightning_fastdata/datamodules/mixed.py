"""``MixedDataModule``: several DataModules' training sets drawn in given proportions, their validation sets apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.mixed import MixedDataset
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.loading.sampling import EpochDraws, SamplingSettings, Subset
from lightning_fastdata.sources.mixed import MixedWindowed

__all__ = ["MixedDataModule"]


class MixedDataModule(FastDataModule):
    """Train on several DataModules at once (a folder, an HDF5 file, a bucket, a tensor cache), drawn in proportions.

    An epoch draws ``epoch_size`` samples (default: all the sources' samples together) with replacement, source
    ``s`` with probability ``weights[s] / sum(weights)`` and its samples uniformly: a small fine-tuning set next to
    a large one is seen as often as its weight says. The draws are a function of ``(seed, epoch)``, sharded, resumed
    and continued on another world size like any epoch of this package (:mod:`~lightning_fastdata.loading.sampling`).

    **One class space, by name**: the mix's classes are the sources' class names in order of first appearance; a
    class in one source only is fine, a name in several sources is one class. Sources whose classes are named by
    number only (``"0"``, ``"1"``, ...: an HDF5 file without a ``classes`` attribute) are not merged with each
    other: numbers say nothing of what a class is, so the mix refuses them (name the classes).

    **Each source's sampling settings** hold within its share, as MosaicML Streaming's per-stream ``choose`` does:
    its ``classes`` (the other classes' samples are never drawn, nor validated), ``max_per_class``, ``fraction``
    and ``sample_weights`` decide which of its samples are drawn, and how often, inside the draws its weight gives
    it; labels go by class name into the mix's class list. The epoch's length and the draws with replacement are the
    mix's: a source's ``epoch_size`` or ``replacement=False`` is refused, naming it.

    **Augmentation**: each source renders its samples with its own worker-side settings (``image_size`` must be the
    same; crop ``scale``/``ratio``, ``train_transforms``, ``exact_decode``, ``on_corrupt`` are each source's); the
    device side (``device_transforms``, ``batch_transforms``, normalisation) and the loader settings
    (``batch_size``, ``num_workers``, ``seed``, ...) are the mix's own arguments. **Validation**: each source's
    validation set is its own loader (``val_dataloader`` returns them in source order), so a model logs them
    apart (``ImageClassifier``: ``val_acc/dataloader_idx_<k>``).

    **Images and masks, images and boxes**: sources that are all ``SegmentationDataModule`` objects mix the same way,
    their masks' classes renumbered into the mix's class list by name (a class a source's ``classes=`` leaves out
    ignored), their crops of one ``crop_size`` and one ``ignore_index``; the masks are ``int64`` on the device.
    Sources that are all ``DetectionDataModule`` objects likewise: each its own layout and recipe, its boxes' labels
    in the mix's classes by name (a class left out: its boxes dropped), each source's images without a box left out
    as that source leaves them; on the device, torchvision's lists. ``ImageTextDataModule`` sources likewise (no
    class: each source's pairs drawn by its weight, LAION's with CC12M's), ``(images, texts)`` on the device.

    Args:
        datamodules: The sources (any of this package's DataModules, at least one); their own loader arguments
            are not used.
        weights: Each source's share of an epoch's draws (positive); ``None``: in proportion to their sizes (the
            samples taking part under each source's ``classes``, ``max_per_class`` and ``fraction``).
        **kwargs: The loader, device-augmentation and sampling arguments of :class:`FastDataModule`
            (``batch_size``, ``num_workers``, ``seed``, ``epoch_size``, ``device_transforms``, ...).

    Raises:
        ValueError: On an impossible argument or sources that cannot be mixed (the message names them).
    """

    def __init__(self, datamodules: list[FastDataModule], weights: list[float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not datamodules:
            raise InvalidValueError("datamodules should name at least one DataModule to draw from.")
        if weights is not None:
            if len(weights) != len(datamodules):
                raise InvalidValueError(
                    f"weights has {len(weights)} values for {len(datamodules)} datamodules; give one per source."
                )
            if not all(np.isfinite(w) and w > 0 for w in weights):
                raise InvalidValueError(f"weights should be positive numbers, got {list(weights)!r}.")
        if self.sampling.sample_weights is not None or self.sampling.classes is not None:
            raise InvalidValueError(
                "A MixedDataModule draws by its weights=: give sample_weights and classes to its sources instead."
            )
        self.datamodules = list(datamodules)
        self.weights = None if weights is None else [float(w) for w in weights]
        self.names = [f"{k}:{type(dm).__name__}" for k, dm in enumerate(self.datamodules)]
        # images and masks or boxes (Segmentation/DetectionDataModule sources): their classes renumbered into the
        # mix's by name; masks int64 on the device, boxes torchvision's lists
        kinds = {getattr(dm, "target_kind", "labels") for dm in self.datamodules}
        if len(kinds) > 1:
            raise InvalidValueError(
                "A mix takes sources of one kind: images and labels, images and masks (SegmentationDataModule), or "
                f"images and boxes (DetectionDataModule); got {', '.join(self.names)}."
            )
        self.target_kind = kinds.pop()
        self.segmentation = self.target_kind == "masks"
        self.windowed = self.target_kind in ("masks", "boxes", "caption")
        ignored = {getattr(dm, "ignore_index", None) for dm in self.datamodules}
        if len(ignored) > 1:
            raise InvalidValueError(f"The sources' ignore_index differ ({sorted(map(str, ignored))}): give one value.")
        self.ignore_index = ignored.pop()
        sizes = {dm.dataset_kwargs["image_size"] for dm in self.datamodules}
        if len(sizes) > 1:
            raise InvalidValueError(
                f"The sources' image_size differ ({sorted(sizes)}); a batch is one tensor: give every source the same."
            )
        for name, dm in zip(self.names, self.datamodules):
            for argument in ("epoch_size", "replacement"):
                if getattr(dm.sampling, argument) not in (None, True):
                    raise InvalidValueError(
                        f"Source {name} sets {argument}={getattr(dm.sampling, argument)!r}; a mix draws its epoch "
                        f"with replacement, epoch_size= of the MixedDataModule: drop {argument}= from the source."
                    )
            if getattr(dm, "augment_on", "workers") == "device":
                raise InvalidValueError(
                    f"Source {name} crops on the device (augment_on='device'); in a mix every source crops in the "
                    "workers: use augment_on='workers'."
                )
        self._label_maps: list[np.ndarray] | None = None
        self.val_datasets: list[Dataset] = []

    @override
    def find_classes(self) -> tuple[str, ...]:
        """The sources' class names together (a name in several sources is one class), read on first use.

        Raises:
            ValueError: If a source has several labels per sample, or several name their classes by number only.
        """
        for name, dm in zip(self.names, self.datamodules):
            if dm.multi_label:
                raise InvalidValueError(f"Source {name} has several labels per sample; a mix takes one label each.")
        numbered = [
            n for n, dm in zip(self.names, self.datamodules) if dm.classes and all(c.isdigit() for c in dm.classes)
        ]
        if len(numbered) > 1:
            raise InvalidValueError(
                f"Sources {numbered} name their classes by number only ({list(self.datamodules[0].classes)[:3]} ...): "
                "numbers do not say which classes are the same, so they are not merged. Name the classes (the HDF5 "
                "file's classes attribute, class folders, class_names=)."
            )
        union: list[str] = []
        for dm in self.datamodules:
            union += [c for c in dm.classes if c not in union]
        shared = [c for c in union if sum(c in dm.classes for dm in self.datamodules) > 1]
        if shared:  # said, not silent: a name in several sources is one class
            rank_zero_info(
                f"lightning_fastdata: the mix's sources share {len(shared)} class name(s), each one class: "
                f"{', '.join(shared[:10])}{' ...' if len(shared) > 10 else ''}."
            )
        # a source's data labels (its data's class positions) in the mix's list; -1: a class its classes= leaves out
        self._label_maps = [
            np.array([union.index(c) if c in dm.classes else -1 for c in dm.data_classes], dtype=np.int64)
            for dm in self.datamodules
        ]
        return tuple(union)

    @property
    def label_maps(self) -> list[np.ndarray]:
        """Each source's data classes' positions in the mix's list (``-1``: a class its ``classes=`` leaves out)."""
        if self._label_maps is None:
            self.data_classes  # noqa: B018 - reads the sources' classes, which sets the maps
        assert self._label_maps is not None
        return self._label_maps

    @property
    def device_decode(self) -> bool:  # type: ignore[override]
        """Whether the mix takes ``decode_on="device"``: a mix of image-and-label sources does."""
        return all(dm.device_decode for dm in self.datamodules)

    @property
    def num_classes(self) -> int:
        """Number of classes of the mix (the sources' names together)."""
        return len(self.classes)

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """The base device side, then each kind's as its sources do it.

        A mix of segmentation sources' masks made ``int64``; of detection sources', torchvision's lists.
        """
        out = super()._after_transfer(batch)
        boxes: Any = out.labels if isinstance(out, Batch) else None
        if self.target_kind == "boxes" and hasattr(boxes, "targets"):
            images = [image[:, :h, :w] for image, (h, w) in zip(out.images, boxes.sizes.tolist())]
            return images, boxes.targets()  # torchvision's detection models' lists, as each source gives
        return Batch(out[0], out[1].long()) if self.segmentation and isinstance(out, Batch) else out

    @override
    def prepare_data(self) -> None:
        """Every source's ``prepare_data`` (file lists, caches, entropy indexes)."""
        for dm in self.datamodules:
            dm.prepare_data()

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """Every source's datasets: the training sets as one mix, the validation sets apart.

        The mix is a :class:`~lightning_fastdata.datasets.mixed.MixedDataset`.
        """
        trains: list[Any] = []
        self.val_datasets = []
        self.val_maps: list[np.ndarray] = []
        for dm, label_map in zip(self.datamodules, self.label_maps):
            train, val = dm.build_datasets()
            if self.windowed:  # the masks' or boxes' classes into the mix's list by name; a class left out dropped
                train = train.renumbered(label_map)  # type: ignore[attr-defined]
                val = None if val is None else val.renumbered(label_map)  # type: ignore[attr-defined]
            trains.append(train)
            if val is not None:
                self.val_datasets.append(val)
                self.val_maps.append(label_map)
        if self.windowed:
            return MixedWindowed(trains, self.names), None
        return MixedDataset(trains, self.label_maps, self.classes, self.names), None

    @override
    def val_dataloader(self) -> list[DataLoader]:
        """One loader per source with a validation set, in source order (labels in the mix's class list)."""
        return [self._loader(v, train=False, label_map=m) for v, m in zip(self.val_datasets, self.val_maps)]

    @override
    def _sampling_settings(self, dataset: Dataset, train: bool) -> SamplingSettings:
        """The mix's settings; for its training set, each source's weight spread over its samples by its settings."""
        if not train or not isinstance(dataset, (MixedDataset, MixedWindowed)):
            return self.sampling
        parts, taking_part = [], []
        for dm, source in zip(self.datamodules, dataset.sources):
            # each source's own training settings (a detection source's: its images holding a box)
            settings = dm._sampling_settings(source, True)
            targets = np.asarray(source.targets)  # type: ignore[attr-defined]
            shares, subset = settings.shares(targets, dm.data_classes, dm.seed)
            parts.append(shares)
            taking_part.append(len(shares) if subset.rows is None else len(subset.rows))
        weights = np.asarray(taking_part if self.weights is None else self.weights, dtype=np.float64)
        per_sample = np.concatenate([w * part for w, part in zip(weights, parts)])
        return dataclasses.replace(self.sampling, sample_weights=cast(Sequence[float], per_sample), replacement=True)

    @override
    def _sampling_of(self, dataset: Dataset, train: bool) -> tuple[Subset | None, EpochDraws | None]:
        """A source's validation set: only the classes the source takes (its ``classes=``), each sample once."""
        maps = [m for v, m in zip(self.val_datasets, self.val_maps) if v is dataset]
        if train or not maps or self.windowed:  # masks, boxes: a class left out is dropped, its images evaluated
            return super()._sampling_of(dataset, train)
        keep = maps[0][np.asarray(dataset.targets)] >= 0  # type: ignore[attr-defined]
        if keep.all():
            return None, None
        return Subset(np.flatnonzero(keep), self.classes), EpochDraws.in_order(np.flatnonzero(keep))
