"""``ShardDataModule``: train from WebDataset tar shards or Parquet files on a local disk, resumable."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.arguments import entropy_index_setting, refuse_old_names
from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.parquet_shards import ParquetShardDataset, common_classes
from lightning_fastdata.datasets.shard_sources import ShardSources, shard_file_index
from lightning_fastdata.datasets.shards import TarShardDataset
from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.index.parquet_index import ParquetIndex, load_parquet_index
from lightning_fastdata.loading.index.tar_index import TarIndex, load_tar_index
from lightning_fastdata.loading.jpeg.entropy_index import (
    PendingEntropyIndex,
    default_index_dir,
    load_entropy_index,
)
from lightning_fastdata.loading.jpeg.entropy_index_build import build_entropy_index, start_background_build
from lightning_fastdata.loading.sampler import window_mix
from lightning_fastdata.loading.storage.base import expand_braces, is_url, local_files
from lightning_fastdata.loading.storage.ranged import (
    RemoteShard,
    index_remote_parquet,
    index_remote_tar,
    list_remote_shards,
    split_url,
)

__all__ = ["ShardDataModule", "expand_shards", "shard_format"]

#: The shard formats, by file extension.
_FORMATS = {".tar": "tar", ".parquet": "parquet"}


def expand_shards(spec: str | list[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The shard files (or objects) ``spec`` names, in order.

    ``spec``: a folder (its ``*.tar``, or its ``*.parquet``, sorted), a glob, a brace pattern
    (``train-{000000..000099}.tar``), or a list of any of these; or the same as bucket URLs (``s3://b/train/``, a
    prefix: its objects directly under it), listed with ``storage_options``.

    Raises:
        FileNotFoundError: If a named shard does not exist or nothing matches (naming the pattern).
        ValueError: If ``spec`` mixes local paths and URLs.
    """
    return [s if isinstance(s, str) else s.url for s in _expand(spec, storage_options)]


def _expand(spec: str | list[str], storage_options: Mapping[str, Any] | None) -> list[str] | list[RemoteShard]:
    items = [spec] if isinstance(spec, str) else list(spec)
    urls = [is_url(item) for item in items]
    if any(urls):
        if not all(urls):
            raise InvalidValueError(f"{items!r}: give shards all local or all in a bucket, not both.")
        return list_remote_shards([p for item in items for p in expand_braces(item)], storage_options)
    out: list[str] = []
    for item in items:
        found = local_files(item, (".tar", ".parquet"))
        missing = [p for p in found if not os.path.isfile(p)]
        if missing:
            raise PathNotFoundError(f"The shard {missing[0]!r} (of {item!r}) does not exist.")
        if not found:
            raise PathNotFoundError(
                f"{item!r} names no .tar or .parquet shard (a folder of them, a glob or a brace pattern)."
            )
        out += found
    return out


def shard_format(paths: list[str]) -> str:
    """``"tar"`` or ``"parquet"``: the format of ``paths`` (by extension, one format for all).

    Raises:
        ValueError: If a path is of neither, or the paths mix them (naming one of each).
    """
    kinds = {path: _FORMATS.get(os.path.splitext(path)[1].lower()) for path in paths}
    unknown = [p for p, k in kinds.items() if k is None]
    if unknown:
        raise InvalidValueError(f"{unknown[0]!r} is not a shard: expected .tar (WebDataset) or .parquet files.")
    found = sorted({k for k in kinds.values() if k is not None})
    if len(found) > 1:
        one = {k: p for p, k in kinds.items()}
        raise InvalidValueError(f"The shards mix formats ({one['tar']!r}, {one['parquet']!r}); give one format.")
    return found[0]


class ShardDataModule(FastDataModule):
    """Train, validate and test from WebDataset tar shards or the hubs' Parquet files of encoded images.

    **Tar** (``<key>.jpg`` + ``<key>.cls`` members): a per-shard index of its members is built once and kept in
    ``index_dir``; a sample is read by its offset, and an epoch is a global shuffle of all the shards' samples.
    **Parquet** (an image column of bytes or ``{bytes, path}`` structs, a label column of integers, a ``ClassLabel`` or
    class names): rows are read with their row group, so a training epoch shuffles windows of row groups holding about
    ``shuffle_buffer`` rows together (each row group in random order, each window a uniform permutation; every row once
    an epoch). Both resume exactly mid-epoch and on another world size, with sampling and mixes as every module; each
    image goes through the folder module's decode path (the crop decoded alone). Shards in a bucket are read in place
    (a sample, or a row group's image column, one ranged request; their indexes kept in ``index_dir``).

    Args:
        root: The training shards: a folder of ``.tar`` (or ``.parquet``) files, a glob, a brace pattern
            (``data/train-{000000..000146}.tar``), a bucket prefix or pattern (``s3://bucket/imagenet/train/``), or a
            list of them (``expand_shards``).
        val_root: Validation shards, or ``None`` (then ``val_fraction`` of the training samples, seeded).
        test_root: Test shards for ``trainer.test``, or ``None``.
        predict_root: What ``trainer.predict`` reads, in order, with the validation transforms: shards (labelled or
            not; :meth:`predict_path` names sample ``i``: ``shard.tar:key``, ``file.parquet:row N``), or, where it
            names no shard, a folder (or bucket prefix, or ``.txt`` list) of images as on every module.
        index_dir: Where the shards' indexes (and their entropy index, in its ``entropy-index`` folder's place) are
            kept (a folder of ours, never the data's); ``None``: the user cache (``~/.cache/lightning-fastdata``).
        class_names: The class names in label order; ``None``: ``classes.json`` beside the first shard (written by
            ``lightning_fastdata.convert.shards.write_tar_shards``), else a Parquet file's ``ClassLabel`` (or
            the sorted names a string label column holds), else the labels as numbers.
        json_label: The label's field in a tar sample's ``.json`` member (where it has no ``.cls``).
        image_column: Parquet: the column of encoded images (binary, or a struct with a ``bytes`` field).
        label_column: Parquet: the label column.
        shuffle_buffer: Parquet: rows per window of the training order (webdataset's ``.shuffle(n)``, but a
            permutation); each worker keeps a window's row groups in memory. ``None``: a full shuffle, which reads a
            row group per row. Sampling settings (``sample_weights``, ``epoch_size``, ``classes``) and a mix draw rows
            one by one, each read with its row group: small row groups, or tar shards, serve them faster.
        block_bytes: Tar shards in a bucket: members read in runs of about this many bytes, one request each, and
            the training order shuffles windows of runs holding about ``shuffle_buffer`` samples, as Parquet's row
            groups; ``None``: one request per member and a full shuffle (scattered reads such as weighted draws fall
            back to it by themselves). Local shards are read member by member whatever this says.
        entropy_index: Decode each JPEG crop from its own bits alone, with an entropy index of the training shards'
            samples kept in ``index_dir`` (as :class:`~lightning_fastdata.ImageFolderDataModule`'s: the same pixels,
            less decode): ``True`` builds it in ``prepare_data``; ``"auto"`` builds local shards' in the background
            while training starts (taken up as it grows) and uses a bucket's if one was built; ``False``: none.
        storage_options: Object-store settings for ``s3://`` (``gs://``, ``az://``) shards, as
            :class:`~lightning_fastdata.ImageFolderDataModule` takes them (``endpoint``, ``max_inflight``, ...).
        **kwargs: Augmentation, split, sampling and loader arguments of :class:`FastDataModule`.

    The shards are listed, and their indexes and classes read, on first use (``prepare_data`` indexes them once per
    node; ``setup``, or LightningCLI's ``num_classes`` link), never in ``__init__``.

    Raises:
        ValueError: On an impossible argument (the shards are checked when first read: a missing shard, one that
            cannot be read, truncated or compressed, a sample without a label, named).
    """

    test_argument = "test_root"

    def __init__(
        self,
        root: str | list[str],
        val_root: str | list[str] | None = None,
        test_root: str | list[str] | None = None,
        index_dir: str | None = None,
        class_names: list[str] | None = None,
        json_label: str = "label",
        image_column: str = "image",
        label_column: str = "label",
        shuffle_buffer: int | None = 1000,
        storage_options: dict[str, Any] | None = None,
        predict_root: str | list[str] | None = None,
        block_bytes: int | None = 8 * 2**20,
        entropy_index: bool | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        refuse_old_names(type(self).__name__, kwargs)
        super().__init__(predict_root=predict_root if isinstance(predict_root, (str, os.PathLike)) else None, **kwargs)
        save_init_hparams(self)
        self.storage_options = storage_options
        self._remote: dict[str, RemoteShard] = {}
        self._loaded: dict[tuple[str, bool], Any] = {}  # (shard, labelled) -> its index, once loaded
        self._specs = {"train": root, "val": val_root, "test": test_root, "predict": predict_root}
        self._expanded: dict[str, list[str] | None] = {}
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        self.index_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir().parent)
        self.entropy_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir())
        self.json_label = json_label
        self.image_column, self.label_column = image_column, label_column
        if shuffle_buffer is not None and (not isinstance(shuffle_buffer, int) or shuffle_buffer < 1):
            raise InvalidValueError(
                f"shuffle_buffer should be a positive number of rows or None, got {shuffle_buffer!r}."
            )
        self.shuffle_buffer = shuffle_buffer
        if block_bytes is not None and (not isinstance(block_bytes, int) or block_bytes < 1):
            raise InvalidValueError(f"block_bytes should be a positive size in bytes or None, got {block_bytes!r}.")
        self.block_bytes = block_bytes
        #: True (built in prepare_data), "auto" (built in the background, local shards) or False
        self.entropy_index: bool | str = entropy_index_setting(entropy_index)
        self._format: str | None = None

    def _paths(self, split: str) -> list[str] | None:
        """``split``'s shards, listed on first use (a folder, a glob, braces, a bucket prefix), or ``None``."""
        if split not in self._expanded:
            spec = self._specs[split]
            if split == "predict" and spec is not None and not isinstance(spec, list):
                try:  # shards, or else a folder of images (the base's predict_root)
                    self._expanded[split] = self._expand(spec)
                except FileNotFoundError:
                    self._expanded[split] = None
            else:
                self._expanded[split] = None if spec is None else self._expand(spec)
        return self._expanded[split]

    @property
    def shard_paths(self) -> list[str]:
        """The training shards, listed on first use."""
        paths = self._paths("train")
        assert paths is not None
        return paths

    @property
    def val_shard_paths(self) -> list[str] | None:
        """The validation shards, or ``None``."""
        return self._paths("val")

    @property
    def test_shard_paths(self) -> list[str] | None:
        """The test shards, or ``None``."""
        return self._paths("test")

    @property
    def predict_shard_paths(self) -> list[str] | None:
        """The shards ``predict_root`` names, or ``None`` (none given, or a folder of images)."""
        return self._paths("predict")

    @property
    def format(self) -> str:
        """``"tar"`` or ``"parquet"`` (every split's shards are of one format), told on first use."""
        if self._format is None:
            given = [self.shard_paths, self.val_shard_paths, self.test_shard_paths, self.predict_shard_paths]
            self._format = shard_format([p for paths in given for p in paths or []])
        return self._format

    @override
    def find_classes(self) -> tuple[str, ...]:
        """``class_names``, else ``classes.json`` beside the first shard, a Parquet ``ClassLabel``, or numbers."""
        if self.class_names is not None:
            return tuple(self.class_names)
        beside = self._classes_beside()
        if beside is not None:
            return tuple(str(c) for c in json.loads(beside))
        files: Any = self._indexes(self.shard_paths) if self.format == "parquet" else []
        named = common_classes(files) if files else None
        if named is not None:
            return tuple(named)
        # numbers, up to the largest label of any training shard (shards sorted by class are common)
        files = files or self._indexes(self.shard_paths)  # kept: not indexed again
        return tuple(str(k) for k in range(max(int(f.labels.max(initial=-1)) for f in files) + 1))

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.data_classes)

    def _expand(self, spec: str | list[str]) -> list[str]:
        found = _expand(spec, self.storage_options)
        self._remote.update({s.url: s for s in found if isinstance(s, RemoteShard)})
        return [s if isinstance(s, str) else s.url for s in found]

    def _storage(self, url: str) -> Any:
        from lightning_fastdata.loading.storage.object_store import ObjectStorage

        return ObjectStorage(split_url(url)[0], self.storage_options)

    def _classes_beside(self) -> bytes | None:
        """``classes.json`` beside the first shard (a file, or an object in the bucket), if there is one."""
        first = self.shard_paths[0]
        if not self._remote:
            beside = Path(first).parent / "classes.json"
            return beside.read_bytes() if beside.is_file() else None
        key = split_url(first)[1].rpartition("/")[0]
        data = next(iter(self._storage(first).read_many([f"{key}/classes.json" if key else "classes.json"])))
        return None if isinstance(data, OSError) else data

    def _indexes(self, paths: list[str], labelled: bool = True) -> list[TarIndex] | list[ParquetIndex]:
        """The shards' indexes, kept in ``index_dir`` and loaded once per module (the splits share them)."""
        out: Any = []
        for p in paths:
            index = self._loaded.get((p, labelled))
            if index is None:
                index = self._loaded[(p, labelled)] = self._load_index(p, labelled)
            out.append(index)
        return out

    def _load_index(self, path: str, labelled: bool) -> TarIndex | ParquetIndex:
        if self.format == "parquet":
            label = self.label_column if labelled else None
            remote = self._remote_parquet(path, label)
            return load_parquet_index(path, self.index_dir, self.image_column, label, remote)
        json_label = self.json_label if labelled else None
        intact = self.dataset_kwargs.get("on_corrupt") == "skip"  # a cut shard keeps its whole samples, warned
        return load_tar_index(path, self.index_dir, json_label, self._remote_tar(path, json_label, intact), intact)

    def _remote_tar(self, url: str, json_label: str | None, intact: bool) -> tuple[int, int, Any] | None:
        shard = self._remote.get(url)
        if shard is None:
            return None
        return shard.size, shard.version, lambda: self._storage(url).run_direct(index_remote_tar, shard, json_label,
                                                                                intact)  # fmt: skip

    def _remote_parquet(self, url: str, label_column: str | None) -> tuple[int, int, Any] | None:
        shard = self._remote.get(url)
        if shard is None:
            return None
        columns = (self.image_column, label_column)
        return shard.size, shard.version, lambda: self._storage(url).run_direct(index_remote_parquet, shard, *columns)

    def _dataset(
        self, paths: list[str], train: bool, indices: Any = None, labelled: bool = True, entropy: Any = None
    ) -> Dataset:
        kwargs = {**self.split_kwargs(train), "storage_options": self.storage_options, "labelled": labelled}
        kwargs["entropy_indexes"] = entropy
        if self.format == "parquet":
            files: Any = self._indexes(paths, labelled)
            buffer = self.shuffle_buffer if train else None
            dataset = ParquetShardDataset(files, self.data_classes, indices=indices, shuffle_buffer=buffer, **kwargs)
            if dataset.windows is not None and labelled:
                self._check_layout(dataset)
            return dataset
        blocks = {"block_bytes": self.block_bytes, "shuffle_buffer": self.shuffle_buffer if train else None}
        return TarShardDataset(self._indexes(paths, labelled), self.data_classes, indices=indices, **blocks, **kwargs)  # type: ignore[arg-type]

    def _check_layout(self, dataset: ParquetShardDataset) -> None:
        """Warn where the Parquet files' layout defeats the windowed order (row groups larger than a window; classes).

        Row groups larger than a window make each read a whole row group's (the files of pandas' defaults: 3.1x
        slower than groups of 100 on the same photos, measured in issue 69).

        webdataset and Mosaic assume shards written shuffled; files written in a listing's order (our own converter,
        most exports) hold a class or two per row group, so a window of them mixes far fewer classes per batch than a
        full shuffle would. Measured here from the labels the index already holds, on one epoch's order.
        """
        largest = max(int(f.group_rows.max()) if len(f.group_rows) else 0 for f in dataset.files)
        if self.shuffle_buffer is not None and largest > self.shuffle_buffer:
            rank_zero_warn(
                f"The Parquet files hold row groups of up to {largest} rows ({self.shard_paths[0]}, ...), more than "
                f"a window of the training order (shuffle_buffer={self.shuffle_buffer}): a row is read with its whole "
                "row group, so every worker reads and keeps whole row groups per window (pandas and pyarrow write "
                "one per file, or per million rows, by default). Rewrite them in row groups of about 100 rows "
                "(pyarrow's row_group_size=100, or `fastdata convert shards --format parquet`)."
            )
        windowed, full = window_mix(dataset.windows, dataset.targets, self.batch_size, self.seed)  # type: ignore[arg-type]
        if windowed < 0.8 * full:
            rank_zero_warn(
                f"The training order's windows of row groups (shuffle_buffer={self.shuffle_buffer}) draw "
                f"{windowed:.1f} classes per batch of {self.batch_size}, where a full shuffle would draw {full:.1f}: "
                f"the Parquet files were written class after class ({self.shard_paths[0]}, ...). Rewrite them "
                "shuffled (`fastdata convert shards --shuffle`), or give a larger shuffle_buffer, or "
                "shuffle_buffer=None (a full shuffle, slower)."
            )

    @override
    def prepare_data(self) -> None:
        """Index every shard once (one process per node); the ranks then load the kept indexes."""
        for paths in (self.shard_paths, self.val_shard_paths, self.test_shard_paths):
            if paths:
                self._indexes(paths)
        if self.predict_shard_paths:
            self._indexes(self.predict_shard_paths, labelled=False)
        if self.entropy_index:
            index, every = self._entropy_list()
            sources: Any = ShardSources(every)  # a Storage as the builder reads one
            if self.entropy_index is True:
                build_entropy_index(index, sources, self.entropy_dir)
            elif not self._remote:  # "auto": training does not wait for it; a bucket's is never built unasked
                start_background_build(index, sources, self.entropy_dir)

    def _entropy_list(self) -> tuple[Any, Dataset]:
        """The training shards' samples as the entropy index's file list, and a dataset that reads them all."""
        every: Any = self._dataset(self.shard_paths, False)  # the training indexes, kept: read no shard again
        shards = every.files if self.format == "parquet" else every.shards
        index = shard_file_index(
            [s.path for s in shards], [s.size for s in shards], [s.mtime_ns for s in shards], len(every)
        )
        return index, every

    def _entropy(self) -> Any:
        """The training shards' entropy indexes (or those built so far, with ``"auto"``), or ``None``."""
        if not self.entropy_index:
            return None
        index, _ = self._entropy_list()
        if self.entropy_index is True:  # None (warned, naming the folder and why): decoded without it, same pixels
            return load_entropy_index(self.entropy_dir, index)
        return PendingEntropyIndex(self.entropy_dir, index)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training samples and the validation ones (their shards, or a seeded share of the training ones)."""
        entropy = self._entropy()
        if self.val_shard_paths is not None:
            return self._dataset(self.shard_paths, True, entropy=entropy), self._dataset(self.val_shard_paths, False)
        train_rows, val_rows = self.split(int(sum(len(s) for s in self._indexes(self.shard_paths))))
        return (
            self._dataset(self.shard_paths, True, train_rows, entropy=entropy),
            None if val_rows is None else self._dataset(self.shard_paths, False, val_rows),
        )

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_root``'s samples with the validation transforms (``None`` without ``test_root``)."""
        if self.test_shard_paths is None:
            return None
        return self._dataset(self.test_shard_paths, False)

    @override
    def build_predict_dataset(self) -> Any:
        """``predict_root``'s shards' samples in order with the validation transforms (or its images)."""
        if self.predict_shard_paths is None:
            return super().build_predict_dataset()
        return self._dataset(self.predict_shard_paths, False, labelled=False)

    @override
    def predict_storage_options(self) -> dict[str, Any] | None:
        """A bucket ``predict_root`` is read with the module's ``storage_options``."""
        return self.storage_options

    @override
    def predict_path(self, index: int) -> str:
        """What prediction input ``index`` is: ``shard.tar:key`` or ``file.parquet:row N (row group G)``."""
        if self.predict_shard_paths is not None and self.predict_dataset is not None:
            return self.predict_dataset.describe(index)
        return super().predict_path(index)
