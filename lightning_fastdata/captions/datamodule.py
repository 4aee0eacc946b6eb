"""``ImageTextDataModule``: image-caption pairs from WebDataset tar shards (img2dataset's layout) or Parquet files.

A composition of a source (tar shards: :class:`~lightning_fastdata.sources.tar.PairedTarDataset`, local or in a
bucket; Parquet: :class:`~lightning_fastdata.sources.parquet.PairedParquetDataset`), the caption target
(:class:`~lightning_fastdata.captions.target.CaptionTarget`) and open_clip's image pipeline as one keyed window
(:class:`~lightning_fastdata.captions.recipe.CaptionRecipe`), through this package's loaders (stateful, sharded,
resumable at the exact sample, workers, pinned memory). A batch on the device is ``(images, texts)``: normalised
images and a list of strings, or the tokenizer's tensors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.captions.recipe import CaptionRecipe
from lightning_fastdata.captions.table import CaptionTable
from lightning_fastdata.captions.target import CaptionTarget
from lightning_fastdata.datamodules.arguments import base_arguments
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.batch import Batch
from lightning_fastdata.loading.jpeg.entropy_index import default_index_dir
from lightning_fastdata.loading.storage.base import is_url
from lightning_fastdata.loading.transport.shm_pool import BatchTransport
from lightning_fastdata.sources.folder import PairedFolderDataset
from lightning_fastdata.sources.parquet import PairedParquetDataset, has_parquet_files, load_parquet_files
from lightning_fastdata.sources.predict import PredictBatch, PredictDataset, predict_input_path, predict_input_relpath
from lightning_fastdata.sources.tar import PairedTarDataset, load_paired_shards
from lightning_fastdata.sources.windowed import WindowedDataset

__all__ = ["ImageTextDataModule"]

#: open_clip's normalisation (its OPENAI_DATASET_MEAN / STD).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageTextDataModule(FastDataModule):
    """Train on image-caption pairs as open_clip trains (module docstring).

    Training batches: ``RandomResizedCrop(image_size, scale)`` of each image (no flip), decoded only where the crop
    is, and one of its captions drawn from the sample's key (``text_transform``'d in the workers); validation: the
    centre square. Each epoch every pair once (a resampled order: ``sample_weights``/``epoch_size``), resumable at the
    exact sample on any number of ranks.

    Args:
        root: The training pairs: a folder of tar shards in img2dataset's layout (``key.jpg`` + ``key.txt``, or
            ``key.json`` with ``caption_field``), a glob or brace pattern (``shard-{000000..000099}.tar``), a bucket
            prefix, or Parquet files with an image and a text column.
        val_root: The validation pairs, likewise; ``None``: none.
        layout: ``"auto"`` (a local root's files tell; ``captions_table``: a folder), ``"shards"`` or ``"parquet"``
            (a bucket's).
        captions_table: A folder of images with a table of ``file,caption`` rows beside them (CSV or Parquet, its
            path under ``root``, and under ``val_root`` for validation; a file's several rows its captions):
            :class:`~lightning_fastdata.captions.table.CaptionTable`.
        caption_field: Shards: read each caption from this field of ``key.json`` (a string, or a list of captions
            of which one is drawn per sample); ``None``: ``key.txt``. A key without its image or its caption (a
            failed download) is skipped and counted in the log.
        text_column: Parquet: the caption column (a string, or a list of strings).
        image_column: Parquet: the image column.
        text_transform: Run on each caption in the loader workers: a tokenizer (any picklable callable of a string:
            ``open_clip.get_tokenizer(...)``, a hubs' tokenizer wrapped to return tensors); its outputs are batched
            (tensors stacked, dicts of tensors stacked per key). ``None``: a list of strings.
        image_size: The square side (open_clip's 224).
        scale: The training crop's area range (open_clip's ``(0.9, 1.0)``).
        shuffle_buffer: Parquet, and tar shards in a bucket: the training order in windows of row groups (runs of
            members, one request each) holding about this many pairs (webdataset's ``shuffle(n)``); ``None``: a full
            shuffle (a bucket's shards: a request a pair). Local shards are always fully shuffled.
        storage_options: Object-store settings for a bucket root.
        index_dir: Where the shards' and Parquet files' indexes are kept; ``None``: the user cache.
        predict_root: What ``trainer.predict`` reads: a folder of images (flat or nested), a bucket prefix, a ``.txt``
            list, tar shards or Parquet files; each image's shorter side resized to ``image_size`` and its centre
            square taken (open_clip's evaluation view): batches are
            :class:`~lightning_fastdata.sources.predict.PredictBatch` (``images``, ``indices``, ``sizes``), and
            :meth:`predict_path` names input ``i``. ``None``: nothing to predict on.

    The loader and sampling arguments (``batch_size`` ... ``fraction``) and ``on_corrupt``/``max_corrupt_fraction``
    (an undecodable image raised, or skipped and counted) are the base module's
    (:class:`~lightning_fastdata.FastDataModule`); the default normalisation is open_clip's.
    """

    target_kind = "caption"
    #: No ``decode_on="device"`` here (crops that carry targets are made in the workers).
    device_decode = False
    #: ``predict_root``'s inputs by index: their paths, and their names under it.
    predict_path = predict_input_path
    predict_relpath = predict_input_relpath

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        layout: Literal["auto", "shards", "parquet"] = "auto",
        caption_field: str | None = None,
        captions_table: str | None = None,
        text_column: str = "caption",
        image_column: str = "image",
        text_transform: Callable[[str], Any] | None = None,
        image_size: int = 224,
        scale: tuple[float, float] = (0.9, 1.0),
        shuffle_buffer: int | None = 1000,
        storage_options: dict[str, Any] | None = None,
        index_dir: str | None = None,
        predict_root: str | None = None,
        batch_size: int = 32,
        num_workers: int | Literal["auto"] = "auto",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = CLIP_MEAN,
        std: tuple[float, float, float] = CLIP_STD,
        in_order: bool = True,
        snapshot_every_n_steps: int | None = None,
        batch_transport: BatchTransport = "shm_pool",
        sample_weights: list[float] | Callable[[Any], float] | None = None,
        replacement: bool | None = None,
        epoch_size: int | None = None,
        fraction: float | None = None,
        on_corrupt: Literal["raise", "skip"] = "raise",
        max_corrupt_fraction: float = 0.01,
    ) -> None:
        if layout not in ("auto", "shards", "parquet"):
            raise InvalidValueError(f"layout should be 'auto', 'shards' or 'parquet', got {layout!r}.")
        super().__init__(**base_arguments(FastDataModule, locals(), val_fraction=0.0, train_transforms=None))
        save_init_hparams(self)
        self.root, self.val_root = os.fspath(root), None if val_root is None else os.fspath(val_root)
        self.layout, self.caption_field, self.captions_table = layout, caption_field, captions_table
        self.text_column, self.image_column = text_column, image_column
        self.text_transform, self.image_size = text_transform, image_size
        self.crop_scale: tuple[float, float] = (float(scale[0]), float(scale[1]))
        self.shuffle_buffer, self.storage_options = shuffle_buffer, storage_options
        self.index_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir().parent)
        #: Pairs skipped for a missing image or caption, per split (read at setup).
        self.skipped: dict[str, int] = {}

    def _parquet(self, where: str) -> bool:
        return self.layout == "parquet" or self.layout == "auto" and not is_url(where) and has_parquet_files(where)

    def _dataset(self, where: str, train: bool, split: str) -> WindowedDataset:
        target = CaptionTarget(self.caption_field or "caption")
        source: WindowedDataset
        if self.captions_table is not None:
            source = PairedFolderDataset(where, "", target, CaptionTable(self.captions_table), self.storage_options,
                                         seed=self.seed)  # fmt: skip
        elif self._parquet(where):
            files = load_parquet_files(where, self.index_dir, self.image_column, self.storage_options)
            buffer = self.shuffle_buffer if train else None
            source = PairedParquetDataset(files, target, self.text_column, buffer, self.storage_options,
                                          seed=self.seed)  # fmt: skip
        else:
            payload = "txt?" if self.caption_field is None else "json?"  # a failed download's key skipped
            shards = load_paired_shards(where, self.index_dir, payload, self.storage_options)
            self.skipped[split] = sum(s.skipped for s in shards)
            if self.skipped[split]:
                rank_zero_info(
                    f"lightning_fastdata: {self.skipped[split]} pair(s) of {where} skipped: a key without its image "
                    f"or its caption (.{payload[:-1]}), as img2dataset leaves a failed download."
                )
            buffer = self.shuffle_buffer if train else None  # a bucket's shards: read in runs, shuffled in windows
            source = PairedTarDataset(shards, target, self.storage_options, shuffle_buffer=buffer, seed=self.seed)
        recipe = CaptionRecipe(
            self.image_size, train, self.crop_scale, seed=self.seed, text_transform=self.text_transform
        )
        corrupt = self.dataset_kwargs["on_corrupt"], self.dataset_kwargs["max_corrupt_fraction"]
        return source.with_recipe(recipe).skipping(*corrupt)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training pairs, and the validation pairs where ``val_root`` is given."""
        train = self._dataset(self.root, True, "train")
        val = None if self.val_root is None else self._dataset(self.val_root, False, "val")
        return train, val

    @override
    def build_predict_dataset(self) -> Any:
        """``predict_root``'s images, each shorter side at ``image_size`` (the centre square cut after the transfer)."""
        if self.predict_root is None:
            return None
        layout = self.layout if self.layout in ("shards", "parquet") else "auto"
        return PredictDataset(self.predict_root, self.image_size, self.storage_options, "images", self.image_column,
                              self.index_dir, layout)  # fmt: skip

    @override
    def _after_transfer(self, batch: Any) -> Any:
        """Normalised images and their texts: ``(images, texts)``; a predict batch's images as centre squares."""
        out = self.transfer.after_transfer(batch, None)
        if isinstance(out, PredictBatch):
            side = self.image_size
            squares = []
            for image, (_, _, h, w) in zip(out.images, out.sizes.tolist()):
                top, left = (h - side) // 2, (w - side) // 2
                squares.append(image[:, top : top + side, left : left + side])
            return out._replace(images=torch.stack(squares))
        return (out.images, out.labels) if isinstance(out, Batch) else out
