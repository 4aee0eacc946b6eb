"""``DetectionDataModule``: images and their boxes (COCO, VOC, YOLO folders; local or in a bucket).

A composition of the folder source (:class:`~lightning_fastdata.sources.folder.PairedFolderDataset`), the box target
(:class:`~lightning_fastdata.detection.target.BoxTarget`) and a recipe of torchvision's detection reference
(:mod:`~lightning_fastdata.detection.recipes`), through this package's loaders (stateful, sharded, resumable,
workers, pinned memory). On the device a batch becomes what torchvision's detection models take: a list of
normalised images (each at its own size) and a list of target dicts (``boxes`` float32 XYXY in the pixels of the
image as it left the loader, ``labels`` int64 in the module's classes, ``iscrowd``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.augment.normalize import IMAGENET_MEAN, IMAGENET_STD
from lightning_fastdata.datamodules.arguments import base_arguments
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.hdf5_file import open_hdf5
from lightning_fastdata.detection.layouts import DetectionLayout, DetectionLayoutName
from lightning_fastdata.detection.recipes import DetectionRecipe, WholeImage, detection_recipe
from lightning_fastdata.detection.target import BoxBatch, BoxTarget, PaddedBoxes
from lightning_fastdata.detection.transforms import BoxTransform, TransformedRecipe
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.loading.jpeg.entropy_index import default_index_dir
from lightning_fastdata.loading.sampling import SamplingSettings
from lightning_fastdata.loading.storage.base import is_url, join_url
from lightning_fastdata.loading.storage.registry import open_storage
from lightning_fastdata.loading.transport.shm_pool import BatchTransport
from lightning_fastdata.sources.cache import CacheDataset, build_cache
from lightning_fastdata.sources.folder import PairedFolderDataset
from lightning_fastdata.sources.hdf5 import HDF5_SUFFIXES, PairedHDF5Dataset, hdf5_split_group
from lightning_fastdata.sources.parquet import PairedParquetDataset, has_parquet_files, load_parquet_files
from lightning_fastdata.sources.predict import PredictBatch, PredictDataset, predict_input_path, predict_input_relpath
from lightning_fastdata.sources.tar import PairedTarDataset, has_tar_shards, load_paired_shards
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["DetectionDataModule"]

#: The layouts of converted data (their classes in the data, or given).
_CONVERTED = ("shards", "parquet", "hdf5")

#: Each layout's split names where none is given (COCO's are its folders').
_SPLITS = {
    "coco": ("train2017", "val2017"),
    "voc": ("train", "val"),
    "yolo": ("train", "val"),
    "csv": ("train", "val"),
    "shards": ("train", "val"),
    "parquet": ("train", "val"),
    "hdf5": ("train", "val"),
}


class DetectionDataModule(FastDataModule):
    """Train and validate a detector on COCO, VOC or YOLO folders as torchvision's detection reference does.

    Training batches: the recipe's window (``"hflip"``: each image at its own size, mirrored with ``hflip_prob``;
    ``"multiscale"``: its shorter side resized to one of 480-800 first), every box following its image exactly
    (clamped, and dropped under a pixel, as ``SanitizeBoundingBoxes``); crowd boxes left out of the training targets
    and kept for evaluation. Validation: each image as it is. ``images, targets = batch`` in ``training_step``: the
    lists torchvision's detection models take.

    Args:
        root: The data: a folder or bucket URL in COCO's, VOC's or YOLO's layout or with a CSV of boxes per split
            (:mod:`~lightning_fastdata.detection.layouts`), or WebDataset tar shards of images and boxes
            (``key.jpg`` + ``key.json``) or Parquet files (``image`` and ``objects`` columns), a sub-folder per
            split, or one HDF5 file (``.h5``: a group per split of ``images`` and ``boxes``, the class names in its
            ``classes`` attribute) (:mod:`~lightning_fastdata.detection.convert`).
        layout: ``"auto"`` (told by the root's folders; local shards and Parquet too; an HDF5 file by its name),
            ``"coco"``, ``"voc"``, ``"yolo"``, ``"csv"`` (``<split>.csv`` of ``image,xmin,ymin,xmax,ymax,label``
            rows), ``"shards"`` or ``"parquet"`` (a bucket's), ``"hdf5"``.
        objects_column: Parquet: the column of each row's boxes (our JSON).
        keep_empty: Train on the images without a box too (their targets ``(0, 4)``); ``False`` (torchvision's
            reference): training leaves them out (an image whose boxes are all crowds is empty then), read from
            every annotation at setup. Evaluation always keeps every image.
        shuffle_buffer: Parquet, and tar shards in a bucket: the training order in windows of row groups (runs of
            members, one request each) holding about this many rows (every row once an epoch); ``None``: a full
            shuffle (each process keeps up to :data:`~lightning_fastdata.datasets.group_reads.FULL_SHUFFLE_CACHE_BYTES`
            of row groups, beyond them a row group's read per row; a bucket's shards: a request an image). Local shards
            are always fully shuffled.
        class_names: The classes in label order (VOC: its 20 by default; YOLO: ``data.yaml``'s; COCO: its file's
            categories, sorted by id, their sparse ids mapped to labels ``0 ..``).
        train_split: The split trained on (default: COCO's ``train2017``, else ``train``). Shards and Parquet: the
            split's sub-folder, or a glob or brace pattern under the root (``train/shard-{000000..000099}.tar``),
            as ``ShardDataModule``'s ``root`` reads them; likewise ``val_split`` and ``test_split``.
        val_split: The split validated on (default: COCO's ``val2017``, else ``val``), skipped with a warning where
            the default is missing; ``None``: none.
        test_split: The split ``trainer.test`` reads, or ``None``.
        data_augmentation: torchvision's detection reference's recipe: ``"hflip"``, ``"multiscale"``, ``"lsj"``,
            ``"ssd"`` or ``"ssdlite"`` (:mod:`~lightning_fastdata.detection.recipes`,
            :mod:`~lightning_fastdata.detection.ssd`).
        image_size: The square recipes' output side (``None``: lsj's 1024, the SSD models' 300 and 320); the others
            keep each image's own size (or the multi-scale one), as the reference's models resize them.
        hflip_prob: The training flip's probability.
        train_transforms: A user's ``torchvision.transforms.v2`` transform (or ``Compose``) run on each training
            sample after the recipe, in the workers: ``(tv_tensors.Image, {"boxes": BoundingBoxes, "labels",
            "iscrowd"})`` in and out, the boxes following by torchvision's dispatch, its randomness seeded from the
            sample's key (:mod:`~lightning_fastdata.detection.transforms`).
        cache_dir: Decode each split once into a uint8 cache here (``prepare_data``; a folder per split and size,
            :mod:`~lightning_fastdata.sources.cache`), then train and evaluate from it with no decode, the recipe's
            windows drawn on the cached images.
        cache_size: The cached images' shorter side, their boxes scaled with them (``None``: each image as it is,
            the batches the source's own where nothing is resized).
        aspect_ratio_group_factor: Batch training images of one aspect-ratio group together, as the reference's
            ``--aspect-ratio-group-factor`` (its default 3; ``0``: portrait and landscape): less padding in a batch
            of images at their own sizes. Each rank's share is grouped, every rank the same number of batches,
            every image once (the unfilled batches close the epoch), resumed exactly. Reads each training image's size
            at setup (the cache's without a read). ``-1``: off.
        batch_format: What a batch is on the device: ``"lists"`` (torchvision's detection models' list of images at
            their sizes and list of target dicts) or ``"padded"``
            (:class:`~lightning_fastdata.detection.target.PaddedBoxes`: one ``N x 3 x H x W`` tensor padded with 0
            after normalisation, the target dicts, and ``image_sizes`` ``N x 2``, each image's height and width), for
            models of a fixed input size or that batch themselves.
        masks: Each box's instance mask too (``masks`` in the target dicts, uint8 ``n x h x w``: what Mask R-CNN
            trains on), from COCO's segmentation (polygons or RLE; pycocotools decodes them), through the same
            windows as the pixels and boxes; other layouts have none (an error naming the annotation).
        storage_options: Object-store settings for a bucket root.
        index_dir: Shards and Parquet: where their indexes are kept (a folder of ours); ``None``: the user cache.

    The loader and sampling arguments (``batch_size`` ... ``fraction``) are the base module's, with its defaults
    (:class:`~lightning_fastdata.FastDataModule`; ``classes=`` keeps the images holding any of those classes, their
    other boxes dropped).
    """

    test_argument = "test_split"
    #: What rides with each image (a mix takes sources of one kind).
    target_kind = "boxes"
    #: No ``decode_on="device"`` here (crops that carry targets are made in the workers).
    device_decode = False
    #: ``predict_root``'s inputs by index: their paths, and their names under it (what a writer names its files).
    predict_path = predict_input_path
    predict_relpath = predict_input_relpath

    def __init__(
        self,
        root: str,
        layout: DetectionLayoutName = "auto",
        class_names: list[str] | None = None,
        train_split: str | None = None,
        val_split: str | None = "",
        test_split: str | None = None,
        data_augmentation: DetectionRecipe = "hflip",
        image_size: int | None = None,
        hflip_prob: float = 0.5,
        train_transforms: Callable[..., Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        index_dir: str | None = None,
        objects_column: str = "objects",
        shuffle_buffer: int | None = 1000,
        keep_empty: bool = False,
        cache_dir: str | None = None,
        cache_size: int | None = None,
        aspect_ratio_group_factor: int = -1,
        batch_format: Literal["lists", "padded"] = "lists",
        masks: bool = False,
        batch_size: int = 2,
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
        super().__init__(
            **base_arguments(
                FastDataModule, locals(), val_fraction=0.0, image_size=image_size or 300, train_transforms=None
            )  # fmt: skip
        )
        save_init_hparams(self)
        self.recipe: Any = detection_recipe(data_augmentation, hflip_prob, image_size)
        if train_transforms is not None:
            self.recipe = TransformedRecipe(self.recipe, BoxTransform(train_transforms, seed))
        self.root = os.fspath(root)
        self.folder_layout = DetectionLayout(layout, None, None if class_names is None else tuple(class_names))
        self.storage_options = storage_options
        self.layout, self.objects_column, self.shuffle_buffer = layout, objects_column, shuffle_buffer
        self.keep_empty = keep_empty
        self.cache_dir, self.cache_size = None if cache_dir is None else os.fspath(cache_dir), cache_size
        self.aspect_ratio_group_factor = aspect_ratio_group_factor
        if batch_format not in ("lists", "padded"):
            raise InvalidValueError(f"batch_format should be 'lists' or 'padded', got {batch_format!r}.")
        self.batch_format = batch_format
        self.masks = masks
        self.index_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir().parent)
        self._splits = (train_split, val_split, test_split)
        self._categories: dict[Any, int] | None = None
        self._labels_to_categories: dict[int, Any] | None = None
        self._coco_ids: dict[str, Any] | None = None
        self._found: str | None = None

    def found_layout(self) -> str:
        """The layout of the data (``"auto"`` resolved once: shards in the training split's folder, else the root's)."""
        if self._found is None:
            found: str = self.layout
            if self.layout == "auto" and self.root.lower().endswith(HDF5_SUFFIXES):
                found = "hdf5"
            elif self.layout == "auto" and not is_url(self.root):
                train = join_url(self.root, self._splits[0] or "train")
                found = "shards" if has_tar_shards(train) else "parquet" if has_parquet_files(train) else "auto"
            if found not in _CONVERTED:  # the folder layout told once, not at each split's pairs
                found = self.folder_layout.found(self.root, self.storage_options)
                self.folder_layout = replace(self.folder_layout, layout=found)
            self._found = found
        return self._found

    def split_names(self) -> tuple[str, str | None, str | None]:
        """The training, validation and test splits (the layout's defaults where not given; the root looked at)."""
        train, val, test = self._splits
        if train is None or val == "":
            found = self.found_layout()
            train = train if train is not None else _SPLITS[found][0]
            val = val if val != "" else _SPLITS[found][1]
        return train, val, test

    @override
    def find_classes(self) -> tuple[str, ...]:
        """The layout's categories (COCO's file, YOLO's ``data.yaml``, VOC's 20 or ``class_names``)."""
        if self.found_layout() not in _CONVERTED:
            names, self._categories = self.folder_layout.categories(
                self.root, self.split_names()[0], self.storage_options
            )
            return names
        given = self.folder_layout.class_names
        if given is None and self.found_layout() == "parquet":
            given = self._hub_class_names()
        if given is None and self.found_layout() == "hdf5":
            with open_hdf5(self.root) as f:
                stored = f.attrs.get("classes")
            if stored is None:
                raise InvalidValueError(f"{self.root} has no 'classes' attribute: give class_names= (in label order).")
            given = tuple(str(n) for n in json.loads(stored))
        if given is None:
            relpath = f"{self.split_names()[0]}/classes.json"
            beside = join_url(self.root, relpath)
            read = next(iter(open_storage(self.root, self.storage_options).read_many([relpath])))
            if isinstance(read, OSError):
                raise InvalidValueError(f"{beside} does not exist: give class_names= (the shards' labels, in order).")
            given = tuple(str(n) for n in json.loads(read))
        self._categories = {k: k for k in range(len(given))}
        return tuple(given)

    def _hub_class_names(self) -> tuple[str, ...] | None:
        """The class names the hubs keep in a local Parquet file's schema (its objects' ``category`` ClassLabel)."""
        import pyarrow.parquet as pq

        where = join_url(self.root, self.split_names()[0])
        if is_url(where):
            return None
        path = load_parquet_files(where, self.index_dir, "image", self.storage_options)[0].path
        try:
            meta = (pq.read_schema(path).metadata or {}).get(b"huggingface", b"{}")
            features = json.loads(meta).get("info", {}).get("features", {})
        except (OSError, ValueError):
            return None
        todo = [features.get(self.objects_column)]
        while todo:  # a Sequence of dicts ({"feature": {...}}) or a dict of Sequences: the names are under category
            node = todo.pop()
            if isinstance(node, dict):
                names = (node.get("category") or {}).get("names") or (node.get("category") or {}).get(
                    "feature", {}
                ).get("names")
                if names:
                    return tuple(str(n) for n in names)
                todo += [v for v in node.values() if isinstance(v, dict)]
        return None

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def categories(self) -> dict[Any, int]:
        """Each raw category (a COCO id, a VOC name, a YOLO index) -> its label in the data's classes."""
        if self._categories is None:
            self.find_classes()
        assert self._categories is not None
        return self._categories

    def _source(self, split: str, train: bool) -> WindowedDataset:
        """``split``'s samples as the source holds them (no recipe yet): a folder, a bucket, shards or Parquet."""
        target = BoxTarget(self.categories(), len(self.data_classes), keep_crowds=not train, masks=self.masks)
        source: WindowedDataset
        found, where, options = self.found_layout(), join_url(self.root, split), self.storage_options
        if found == "shards":
            shards = load_paired_shards(where, self.index_dir, "json", options)
            buffer = self.shuffle_buffer if train else None  # a bucket's shards: read in runs, shuffled in windows
            source = PairedTarDataset(shards, target, options, shuffle_buffer=buffer, seed=self.seed)
        elif found == "hdf5":
            group = hdf5_split_group(self.root, split, "images", self.split_names()[0])
            source = PairedHDF5Dataset(self.root, group, target, "images", "boxes", seed=self.seed)
        elif found == "parquet":
            files = load_parquet_files(where, self.index_dir, "image", options)
            buffer = self.shuffle_buffer if train else None
            source = PairedParquetDataset(files, target, self.objects_column, buffer, options, seed=self.seed)
        else:
            options = self.storage_options
            source = PairedFolderDataset(self.root, split, target, self.folder_layout, options, seed=self.seed)
        return source

    def _dataset(self, split: str, train: bool) -> WindowedDataset:
        """``split`` through the recipe (training) or whole (evaluation), from the cache where there is one."""
        source = self._source(split, train)
        if self.cache_dir is not None:
            folder = build_cache(source, self.cache_dir, self.cache_size)
            source = CacheDataset(folder, source.target, seed=self.seed)
        if train and self.aspect_ratio_group_factor >= 0:
            source = source.grouped_by_aspect(self.aspect_ratio_group_factor)
        source = source.with_recipe(self.recipe if train else WholeImage())
        wanted = self.sampling.classes
        positions = None if wanted is None else [self.data_classes.index(str(c)) for c in wanted]
        presence = wanted is not None or self.sampling.sample_weights is not None or train and not self.keep_empty
        return source.kept(positions, presence)

    @override
    def prepare_data(self) -> None:
        """Build the splits' caches once, before the ranks read them (nothing without ``cache_dir``)."""
        if self.cache_dir is None:
            return
        for split in self.split_names():
            if split is None:
                continue
            try:
                source = self._source(split, False)
            except FileNotFoundError:
                continue  # a missing validation split is said (and skipped) by setup
            build_cache(source, self.cache_dir, self.cache_size)

    @override
    def _sampling_settings(self, dataset: Dataset, train: bool) -> SamplingSettings:
        """The module's settings; training without ``keep_empty`` keeps the images holding a box (of any class).

        Where every image holds one, the epoch stays the plain one (Parquet's windowed order kept); where some do
        not, the others are drawn as ``classes=`` draws them (each once an epoch).
        """
        if train and not self.keep_empty and self.sampling.classes is None:
            present = np.asarray(dataset.targets)  # type: ignore[attr-defined]
            if present.ndim == 2 and not present.any(axis=1).all():
                return replace(self.sampling, classes=list(self.data_classes))
        return self.sampling

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training split, and the validation split (the default one only if it exists)."""
        train_split, val_split, _ = self.split_names()
        train, val = self._dataset(train_split, True), None
        if val_split is not None:
            try:
                val = self._dataset(val_split, False)
            except FileNotFoundError as err:
                if self._splits[1] != "" or self._split_marker_exists(val_split):
                    raise  # a split that is there but cannot be read (an image it names is missing) is an error
                rank_zero_warn(f"No validation: {err} Pass val_split= the split to validate on, or None.")
        return train, val

    def _split_marker_exists(self, split: str) -> bool:
        """Whether the file that makes ``split`` a split in the folder's layout is there.

        COCO's annotations, VOC's list, the CSV; YOLO's and the shards' folders are told by their listing, which fails
        where they are absent.
        """
        found = self.found_layout()
        marker = {"coco": self.folder_layout.annotation_file or f"annotations/instances_{split}.json",
                  "voc": f"ImageSets/Main/{split}.txt", "csv": f"{split}.csv"}.get(found)  # fmt: skip
        if marker is None:
            return False
        read = next(iter(open_storage(self.root, self.storage_options).read_many([marker])))
        return not isinstance(read, OSError)

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_split``'s images as they are (``None`` without ``test_split``)."""
        test = self.split_names()[2]
        return None if test is None else self._dataset(test, False)

    @override
    def build_predict_dataset(self) -> Any:
        """``predict_root``'s images as they are (the model resizes), each batch carrying their sizes and indices.

        A folder of images, a bucket prefix or a ``.txt`` list; an HDF5 file (its ``images``); tar shards or Parquet
        files (a folder, or a bucket prefix with ``layout="shards"``/``"parquet"``).
        """
        if self.predict_root is None:
            return None
        layout = self.layout if self.layout in ("shards", "parquet") else "auto"
        return PredictDataset(self.predict_root, None, self.storage_options, "images", "image", self.index_dir, layout)

    def category_of(self, label: int) -> Any:
        """The raw category of a label (a COCO id, a VOC name, a YOLO index): what a results file names."""
        if self._labels_to_categories is None:
            self._labels_to_categories = {v: k for k, v in self.categories().items()}
        return self._labels_to_categories[int(label)]

    def predict_image_id(self, index: int) -> Any:
        """Prediction input ``index``'s image id in a results file.

        COCO's id where the data is in COCO's layout and the input is one of its images (by file name), else the
        input's name under ``predict_root``.
        """
        relpath = self.predict_relpath(index)
        if self._coco_ids is None:
            self._coco_ids = self._read_coco_ids()
        return self._coco_ids.get(relpath.rsplit("/", 1)[-1], relpath)

    def _read_coco_ids(self) -> dict[str, Any]:
        """Each COCO image's file name -> its id, from the splits' annotation files (none outside COCO's layout)."""
        if self.found_layout() != "coco":
            return {}
        ids: dict[str, Any] = {}
        storage = open_storage(self.root, self.storage_options)
        for split in self.split_names():
            marker = self.folder_layout.annotation_file or f"annotations/instances_{split}.json"
            read = next(iter(storage.read_many([marker]))) if split is not None else None
            if read is not None and not isinstance(read, OSError):
                ids.update({str(im["file_name"]).rsplit("/", 1)[-1]: im["id"] for im in json.loads(read)["images"]})
        return ids

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """Normalised images, each cut to its own size, and torchvision's target dicts: ``(images, targets)``.

        A predict batch stays a :class:`~lightning_fastdata.sources.predict.PredictBatch` (what a writer reads), its
        images the list of normalised images at their sizes.
        """
        out = self.transfer.after_transfer(batch, None)
        if isinstance(out, PredictBatch):
            cut = [image[:, :h, :w] for image, (_, _, h, w) in zip(out.images, out.sizes.tolist())]
            return out._replace(images=cut)  # type: ignore[arg-type]
        if not (isinstance(out, Batch) and isinstance(out.labels, BoxBatch)):
            return out
        sizes = out.labels.sizes.tolist()
        if self.batch_format == "padded":  # one tensor, the padding 0 after normalisation, and each image's size
            images = out.images
            for image, (h, w) in zip(images, sizes):
                image[:, h:, :] = 0
                image[:, :h, w:] = 0
            return PaddedBoxes(images, out.labels.targets(), out.labels.sizes.to(images.device))
        images = [image[:, :h, :w] for image, (h, w) in zip(out.images, sizes)]
        return images, out.labels.targets()
