"""``SegmentationDataModule``: images and masks (VOC, ADE20K, Cityscapes, paired folders; local or in a bucket).

A composition of a source (:mod:`~lightning_fastdata.sources`: a folder or bucket, HDF5, tar shards, Parquet, the
decoded cache) and the mask target (:class:`~lightning_fastdata.segmentation.target.MaskTarget`); it goes through this
package's loaders (stateful, sharded, resumable, workers, pinned memory); its batches are normalised on the device with
their masks made ``int64`` there. ``trainer.predict`` reads ``predict_root``'s images at the base size
(:class:`~lightning_fastdata.sources.predict.PredictDataset`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.augment.normalize import IMAGENET_MEAN, IMAGENET_STD
from lightning_fastdata.augment.pipeline import as_transform_list
from lightning_fastdata.datamodules.arguments import base_arguments, entropy_index_setting
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.batch import Batch, DeviceBatch
from lightning_fastdata.loading.jpeg.entropy_index import PendingEntropyIndex, default_index_dir, load_entropy_index
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index, start_background_build
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.transport.shm_pool import BatchTransport
from lightning_fastdata.segmentation.layouts import (
    CITYSCAPES_CLASSES,
    LAYOUTS,
    Layout,
    MaskLayout,
    classes_of_layout,
    detect_layout,
    join_url,
)
from lightning_fastdata.segmentation.policy import SegmentationDeviceAugment
from lightning_fastdata.segmentation.target import IGNORE_INDEX, MaskTarget
from lightning_fastdata.sources.cache import CacheDataset, build_cache
from lightning_fastdata.sources.folder import PairedFolderDataset
from lightning_fastdata.sources.hdf5 import HDF5_SUFFIXES, PairedHDF5Dataset, hdf5_split_group
from lightning_fastdata.sources.parquet import PairedParquetDataset, has_parquet_files, load_parquet_files
from lightning_fastdata.sources.predict import PredictDataset, predict_input_path, predict_input_relpath
from lightning_fastdata.sources.tar import PairedTarDataset, has_tar_shards, load_paired_shards
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["SegmentationDataModule"]


class SegmentationDataModule(FastDataModule):
    """Train and validate on a segmentation folder or bucket as torchvision's segmentation reference does.

    Training batches: the reference's random resize (0.5-2x ``base_size``), flip and ``crop_size`` crop, the image's
    crop decoded alone and its mask sampled through the same window; validation at ``base_size``, padded to the
    batch's largest image (images 0, masks ``ignore_index``). On the device the images become normalised floats and
    the masks ``int64``: ``images, masks = batch`` in ``training_step``.

    Args:
        root: The data: a folder or bucket URL in VOC's, ADE20K's, Cityscapes' or a paired layout
            (:mod:`~lightning_fastdata.segmentation.layouts`), or an HDF5 file (``.h5``) whose splits are
            groups holding ``images_key`` and ``masks_key`` (a file without groups: the training split at its top
            level; a split may also name another HDF5 file) (:mod:`~lightning_fastdata.sources.hdf5`),
            or WebDataset tar shards of images and masks in a sub-folder (or bucket prefix) per split
            (``layout="shards"``, found by ``"auto"`` locally; :mod:`~lightning_fastdata.sources.tar`),
            or Parquet files with an image and a mask column, likewise (``layout="parquet"``;
            :mod:`~lightning_fastdata.sources.parquet`).
        num_classes: The classes the masks hold; ``None``: told by ``class_names``, a named ``label_map``, or the
            layout (VOC: 21, ADE20K: 150, Cityscapes: 19; ``"auto"`` looks at the root when first needed); other
            layouts (paired folders, shards, Parquet, HDF5) need it given.
        class_names: Their names, in index order; ``None``: Cityscapes' with ``layout="cityscapes"``, else numbers.
        base_size: The reference's base size (520).
        crop_size: The training crop (480).
        hflip_prob: The training flip's probability.
        train_split: The split trained on: VOC's list ``ImageSets/Segmentation/<train_split>.txt``, else the
            split's sub-folder (ADE20K: ``training``; paired folders without splits: ``""``); shards and Parquet:
            the split's sub-folder, or a glob or brace pattern under the root (``train/shard-{000000..000099}.tar``),
            as ``ShardDataModule``'s ``root`` reads them (likewise ``val_split`` and ``test_split``).
        val_split: The split validated on (ADE20K: ``validation``), or ``None``; a missing default ``"val"`` is
            skipped with a warning.
        test_split: The split ``trainer.test`` reads, or ``None``.
        ignore_index: The mask value of borders and padding (the loss ignores it).
        layout: ``"auto"`` (told by the root's folders), ``"voc"``, ``"ade20k"``, ``"cityscapes"``, ``"paired"``,
            ``"shards"`` or ``"parquet"``.
        images_dir: Paired folders: the images' folder under ``root``.
        masks_dir: Paired folders: the masks' folder under ``root``.
        label_map: Mask value -> class (or -> ``ignore_index``), replacing the layout's own meaning of the values;
            or ``"ade20k"``/``"cityscapes"``: that layout's table, for masks coded so in shards, Parquet or HDF5 (the
            hubs' ADE20K Parquet keeps ADE20K's values: read it with ``label_map="ade20k"``).
        storage_options: Object-store settings for bucket roots (as :class:`~lightning_fastdata.ImageFolderDataModule`).
        images_key: An HDF5 ``root``: the images dataset in each split's group (or at the top level).
        masks_key: An HDF5 ``root``: the masks dataset beside it.
        mask_ext: Tar shards: the mask member's extension (``key.seg.png``).
        index_dir: Tar shards and Parquet files: where their indexes are kept (a folder of ours, never the data's);
            ``None``: the user cache folder (``$LIGHTNING_FASTDATA_CACHE``, ...). The entropy index goes there too.
        entropy_index: Index the training images' JPEG entropy data (kept in ``index_dir``) so each training crop is
            entropy-decoded alone: the same pixels, less work where a crop is a part of its photo (the random
            resize's upper half). Folders and buckets of image files, as on every module: ``True`` builds it in
            ``prepare_data``; ``"auto"`` builds a local folder's in the background while training starts (taken up
            as it grows) and uses a bucket's if one was built, and does nothing for other sources or a cache;
            ``False``: none.
        image_column: Parquet files: the images' column (bytes, or the hubs' ``{bytes, path}`` structs).
        mask_column: Parquet files: the masks' column (PNG bytes or structs; ADE20K on the hubs: ``annotation``).
        shuffle_buffer: Parquet files, and tar shards in a bucket: the training order in windows of row groups (runs
            of members, one request each) holding about this many rows (every row once an epoch); ``None``: a full
            shuffle (each process keeps up to :data:`~lightning_fastdata.datasets.group_reads.FULL_SHUFFLE_CACHE_BYTES`
            of row groups, beyond them a row group's read per row; a bucket's shards: a request a scene). Local shards
            are always fully shuffled.
        cache_dir: Decode each split once into a uint8 cache here (``prepare_data``; a folder per source and size,
            :mod:`~lightning_fastdata.sources.cache`), then train and evaluate from it with no decode;
            ``None``: decode every epoch.
        cache_size: The cache's shorter side (default ``base_size``: evaluation reads the cache as it is).
        device_transforms: Per-sample policies on the training device (``TrivialAugmentWide``, ``RandAugment``:
            their geometric ops move the mask too, by nearest sampling, filled with ``ignore_index``; colour ops
            touch the image alone; ``ColorJitter``; torchvision's objects become these;
            :mod:`~lightning_fastdata.segmentation.policy`).
        train_crop: ``"reference"`` (torchvision's segmentation reference: random resize, flip, padded crop) or
            ``"random_resized"`` (``RandomResizedCrop(crop_size, scale, ratio)`` and the flip, ``scale``/``ratio``
            the module's arguments, for image and mask alike).
        scale: ``train_crop="random_resized"``: the crop's area range (``RandomResizedCrop``'s).
        ratio: ``train_crop="random_resized"``: the crop's aspect-ratio range.

    The loader and sampling arguments (``batch_size`` ... ``fraction``) are :class:`FastDataModule`'s, with its
    defaults. What an image and its mask cannot follow is not in the signature (a per-sample ``train_transforms``, a
    validation crop, ``val_fraction``: splits are named), so LightningCLI and ``help()`` show only what works.

    **Sampling** (the arguments of :class:`FastDataModule`): ``classes=`` keeps the images holding any of those
    classes and renumbers their masks (``classes[k]`` becomes class ``k``; every other class ``ignore_index``), for
    training and evaluation alike; ``sample_weights`` (a mapping class name -> weight: an image weighs the largest of
    its classes' weights; a callable of its classes-present row; one weight per image), ``epoch_size``,
    ``replacement`` and ``fraction`` draw images as on every module, exactly resumable. Sampling by class reads every
    mask of a split once at setup. ``max_per_class`` and ``sample_weights="balanced"`` are refused (one class per
    image).

    Raises:
        ValueError: On a bad argument, or ``max_per_class``/``sample_weights="balanced"`` (one class per image).
    """

    test_argument = "test_split"
    #: What rides with each image (a mix takes sources of one kind).
    target_kind = "masks"
    #: No ``decode_on="device"`` here (crops that carry targets are made in the workers).
    device_decode = False
    #: ``predict_root``'s inputs by index: their paths, and their names under it (what a writer names its files).
    predict_path = predict_input_path
    predict_relpath = predict_input_relpath

    def __init__(
        self,
        root: str,
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        base_size: int = 520,
        crop_size: int = 480,
        hflip_prob: float = 0.5,
        train_split: str = "train",
        val_split: str | None = "val",
        test_split: str | None = None,
        ignore_index: int = IGNORE_INDEX,
        layout: Layout = "auto",
        images_dir: str = "images",
        masks_dir: str = "annotations",
        label_map: dict[int, int] | Literal["ade20k", "cityscapes"] | None = None,
        storage_options: dict[str, Any] | None = None,
        images_key: str = "images",
        masks_key: str = "masks",
        mask_ext: str = "seg.png",
        index_dir: str | None = None,
        image_column: str = "image",
        mask_column: str = "annotation",
        shuffle_buffer: int | None = 1000,
        cache_dir: str | None = None,
        cache_size: int | None = None,
        entropy_index: bool | Literal["auto"] = "auto",
        device_transforms: Callable[..., Any] | list[Callable[..., Any]] | None = None,
        train_crop: Literal["reference", "random_resized"] = "reference",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = None,
        block_shuffle: int | None = None,
        batch_transport: BatchTransport = "shm_pool",
        repeated_augmentations: int = 1,
        predict_root: str | None = None,
        sample_weights: str | dict[str, float] | list[float] | Callable[[Any], float] | None = None,
        replacement: bool | None = None,
        epoch_size: int | None = None,
        classes: list[str] | None = None,
        max_per_class: int | None = None,
        fraction: float | None = None,
    ) -> None:
        if train_crop not in ("reference", "random_resized"):
            raise InvalidValueError(f"train_crop should be 'reference' or 'random_resized', got {train_crop!r}.")
        if train_crop == "reference" and (tuple(scale), tuple(ratio)) != ((0.08, 1.0), (3 / 4, 4 / 3)):
            raise InvalidValueError(
                f"scale={scale!r}, ratio={ratio!r} shape train_crop='random_resized' (RandomResizedCrop); the "
                "reference crop draws its own resize (0.5-2x base_size). Give train_crop='random_resized', or drop "
                "them."
            )
        # the device policies are this module's own (they warp the masks too): not the base's
        super().__init__(**base_arguments(FastDataModule, locals(), image_size=crop_size, val_fraction=0.0,
                                          device_transforms=None))  # fmt: skip
        self.train_crop = train_crop
        policies = as_transform_list(device_transforms, "device_transforms")
        self.segmentation_augment = SegmentationDeviceAugment(policies, self.seed, ignore_index)
        save_init_hparams(self)
        if self.sampling.max_per_class is not None or self.sampling.sample_weights == "balanced":
            raise InvalidValueError(
                "SegmentationDataModule: max_per_class and sample_weights='balanced' need one class per image, and an "
                "image holds several. Weigh images by the classes they hold with sample_weights={class: weight} (an "
                "image's weight: the largest of its classes'), or a callable of its classes-present row."
            )
        if layout not in LAYOUTS:
            raise InvalidValueError(f"layout should be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}.")
        if class_names is not None and num_classes is not None and len(class_names) != num_classes:
            raise InvalidValueError(f"class_names names {len(class_names)} classes, num_classes is {num_classes}.")
        if num_classes is not None or class_names is not None:  # checked now (the table, the ignore index)
            MaskTarget(num_classes or len(class_names or ()), ignore_index, label_map)
        self.root = os.fspath(root)
        self._class_settings = (num_classes, None if class_names is None else [str(c) for c in class_names])
        self.label_map = label_map
        self._mask_target: MaskTarget | None = None
        self.settings_of_windows: dict[str, Any] = dict(base_size=base_size, crop_size=crop_size, hflip_prob=hflip_prob)
        self.layout = layout
        self.folder_layout = MaskLayout(layout, images_dir, masks_dir)
        self.images_key, self.masks_key, self.mask_ext = images_key, masks_key, mask_ext
        self.image_column, self.mask_column, self.shuffle_buffer = image_column, mask_column, shuffle_buffer
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_size = cache_size
        if entropy_index is True and cache_dir is not None:
            raise InvalidValueError(
                "entropy_index=True with cache_dir: the cache holds decoded pixels, there is no JPEG to index. Give "
                "one of them."
            )
        self.entropy_index: bool | str = entropy_index_setting(entropy_index)
        self.index_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir().parent)
        self.entropy_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir())
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        self.ignore_index, self.base_size, self.storage_options = ignore_index, base_size, storage_options

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    @override
    def find_classes(self) -> tuple[str, ...]:
        """``class_names``, or numbers up to ``num_classes`` (Cityscapes' names on its layout).

        ``num_classes`` not given: told by ``class_names``, a ``label_map`` or the layout (the root looked at when
        ``layout="auto"``).

        Raises:
            ValueError: If nothing tells the classes (paired folders, shards, Parquet, HDF5: give num_classes).
        """
        num_classes, class_names = self._class_settings
        if class_names is not None:
            return tuple(class_names)
        found = self._found_layout() if num_classes is None or self.layout == "auto" else self.layout
        if num_classes is None:
            num_classes = classes_of_layout(
                found, self.label_map, self.ignore_index, f"SegmentationDataModule of {self.root}"
            )
        if found == "cityscapes" and num_classes == len(CITYSCAPES_CLASSES):
            return CITYSCAPES_CLASSES
        return tuple(str(k) for k in range(num_classes))

    def _found_layout(self) -> str:
        """The layout of the training split's data: the one given, or what ``"auto"`` finds (the root looked at)."""
        where = join_url(self.root, self.train_split)
        if self.root.lower().endswith(HDF5_SUFFIXES):
            return "hdf5"
        if self.layout != "auto":
            return self.layout
        if not is_url(where) and has_parquet_files(where):
            return "parquet"
        if not is_url(where) and has_tar_shards(where):
            return "shards"
        return detect_layout(self.root, self.storage_options)

    @property
    def mask_target(self) -> MaskTarget:
        """The target kind of every split's samples (a class per pixel, of :attr:`num_classes` before ``classes=``)."""
        if self._mask_target is None:
            self._mask_target = MaskTarget(len(self.data_classes), self.ignore_index, self.label_map)
        return self._mask_target

    def _dataset(self, split: str, train: bool) -> WindowedDataset:
        """``split`` of the folder, bucket or HDF5 file, its masks in ``classes=``'s classes if given."""
        wanted = self.sampling.classes
        positions = None if wanted is None else [self.data_classes.index(str(c)) for c in wanted]
        # sampling by class reads which classes each image holds (every mask once, at setup)
        presence = wanted is not None or self.sampling.sample_weights is not None
        source = self._source(split, train)
        if train and self.entropy_index is True:
            files = self._indexable(source)
            source = files.with_entropy_index(load_entropy_index(self.entropy_dir, files.image_files()))
        elif train and self.entropy_index == "auto" and isinstance(source, PairedFolderDataset):
            # taken up as it is built (the same pixels before and after); a bucket's only if one was built
            source = source.with_entropy_index(PendingEntropyIndex(self.entropy_dir, source.image_files()))
        if train and self.train_crop == "random_resized":
            source = source.random_resized(self.dataset_kwargs["scale"], self.dataset_kwargs["ratio"])
        if train and self.segmentation_augment:
            source = source.keyed()  # the device policies draw from the samples' keys
        if self.cache_dir is not None:
            folder = build_cache(source, self.cache_dir, self.cache_size or self.base_size)
            cached = CacheDataset(folder, self.mask_target, train=train, seed=self.seed,
                                              **self.settings_of_windows)  # fmt: skip
            if source.random_resized_crop is not None:
                cached = cached.random_resized(*source.random_resized_crop)
            source = cached.keyed() if source.return_keys else cached
        return source.kept(positions, presence)

    def _indexable(self, source: WindowedDataset) -> PairedFolderDataset:
        """The training source as image files an entropy index is built for, or an error naming what it is."""
        if not isinstance(source, PairedFolderDataset):
            raise InvalidValueError(
                f"entropy_index=True indexes image files (a folder or a bucket of a known layout); {self.root} "
                f"holds {type(source).__name__}'s data. Drop entropy_index (or convert the images back to files)."
            )
        return source

    @override
    def prepare_data(self) -> None:
        """Build the training images' entropy index and the splits' caches once, before the ranks read them.

        ``entropy_index="auto"``: a local folder's index is started in the background. Nothing without
        ``entropy_index`` or ``cache_dir``.
        """
        if self.entropy_index is True:
            files = self._indexable(self._source(self.train_split, True))
            build_entropy_index(files.image_files(), files.storage, self.entropy_dir)
        elif self.entropy_index == "auto" and self.cache_dir is None:
            source = self._source(self.train_split, True)
            if isinstance(source, PairedFolderDataset) and not is_url(source.root):  # training does not wait for it
                start_background_build(source.image_files(), source.storage, self.entropy_dir)
        if self.cache_dir is None:
            return
        for split in (self.train_split, self.val_split, self.test_split):
            if split is None:
                continue
            try:
                source = self._source(split, False)
            except FileNotFoundError:
                continue  # a missing validation split is said (and skipped) by setup
            build_cache(source, self.cache_dir, self.cache_size or self.base_size)

    def _source(self, split: str, train: bool) -> WindowedDataset:
        """``split`` of the folder, bucket, shards or HDF5 file (a split may name another HDF5 file), with masks."""
        where, options = join_url(self.root, split), self.storage_options
        windows = dict(train=train, seed=self.seed, **self.settings_of_windows)
        if self.layout == "parquet" or self.layout == "auto" and not is_url(where) and has_parquet_files(where):
            files = load_parquet_files(where, self.index_dir, self.image_column, options)
            shuffle_buffer = self.shuffle_buffer if train else None
            return PairedParquetDataset(files, self.mask_target, self.mask_column, shuffle_buffer, options, **windows)
        if self.layout == "shards" or self.layout == "auto" and not is_url(where) and has_tar_shards(where):
            shards = load_paired_shards(where, self.index_dir, self.mask_ext, options)
            buffer = self.shuffle_buffer if train else None  # a bucket's shards: read in runs, shuffled in windows
            return PairedTarDataset(shards, self.mask_target, options, shuffle_buffer=buffer, **windows)
        if self.root.lower().endswith(HDF5_SUFFIXES):
            if split.lower().endswith(HDF5_SUFFIXES):
                path, group = split, ""
            else:
                path, group = self.root, hdf5_split_group(self.root, split, self.images_key, self.train_split)
            return PairedHDF5Dataset(path, group, self.mask_target, self.images_key, self.masks_key, **windows)
        return PairedFolderDataset(self.root, split, self.mask_target, self.folder_layout, options, **windows)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training split, and the validation split (the default ``"val"`` only if it exists)."""
        train = self._dataset(self.train_split, True)
        val = None
        if self.val_split is not None:
            try:
                val = self._dataset(self.val_split, False)
            except FileNotFoundError as err:
                if self.val_split != "val":
                    raise
                rank_zero_warn(f"No validation: {err} Pass val_split= the split to validate on, or None.")
        return train, val

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_split``'s samples at the base size (``None`` without ``test_split``)."""
        return None if self.test_split is None else self._dataset(self.test_split, False)

    @override
    def build_predict_dataset(self) -> Any:
        """``predict_root``'s images at the base size (batches carry each image's size for the prediction writer).

        A folder of images, a bucket prefix or a ``.txt`` list; an HDF5 file (``images_key``); tar shards or Parquet
        files (a folder, or a bucket prefix with ``layout="shards"``/``"parquet"``).
        """
        if self.predict_root is None:
            return None
        return PredictDataset(
            self.predict_root, self.base_size, self.storage_options, self.images_key, self.image_column,
            self.index_dir, self.layout if self.layout in ("shards", "parquet") else "auto",
        )  # fmt: skip

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """The device policies (a training batch with keys), normalised float images and ``int64`` masks."""
        if isinstance(batch, DeviceBatch) and batch.keys is not None and batch.images.dtype == torch.uint8:
            images, masks = self.segmentation_augment(batch.images, batch.labels, batch.keys)
            batch = Batch(images, masks)
        out = self.transfer.after_transfer(batch, None)  # the images normalised (channels-last by default)
        return Batch(out[0], self.mask_target.on_device(out[1])) if isinstance(out, Batch) else out
