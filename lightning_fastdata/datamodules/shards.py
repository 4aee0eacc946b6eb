"""``ShardDataModule``: train from WebDataset tar shards on a local disk, at the folder module's speed, resumable."""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fastdata.datamodules.base import FastDataModule
from lightning_fastdata.datasets.shards import TarShardDataset
from lightning_fastdata.errors import InvalidValueError, PathNotFoundError
from lightning_fastdata.hparams import save_init_hparams
from lightning_fastdata.loading.index.tar_index import TarIndex, load_tar_index
from lightning_fastdata.loading.jpeg.entropy_index import default_index_dir
from lightning_fastdata.loading.storage.base import is_url

__all__ = ["ShardDataModule", "expand_shards"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def _braces(pattern: str) -> list[str]:
    """WebDataset's brace notation: ``{000..009}`` (zero-padded ranges) and ``{a,b}`` (lists), each expanded."""
    found = _RANGE.search(pattern)
    if found:
        lo, hi = found.groups()
        width = len(lo) if lo.startswith("0") else 0
        head, tail = pattern[: found.start()], pattern[found.end() :]
        return [x for k in range(int(lo), int(hi) + 1) for x in _braces(f"{head}{k:0{width}d}{tail}")]
    found = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if found:
        head, tail = pattern[: found.start()], pattern[found.end() :]
        return [x for option in found.group(1).split(",") for x in _braces(head + option + tail)]
    return [pattern]


def expand_shards(spec: str | list[str]) -> list[str]:
    """The shard files ``spec`` names, in order.

    ``spec``: a folder (its ``*.tar``, sorted), a glob, a brace pattern (``train-{000000..000099}.tar``), or a list of
    any of these.

    Raises:
        FileNotFoundError: If a named shard does not exist or nothing matches (naming the pattern).
        ValueError: For a bucket URL (reading shards from a bucket comes later: copy them to local disk).
    """
    out: list[str] = []
    for item in [spec] if isinstance(spec, str) else list(spec):
        if is_url(item):
            raise InvalidValueError(
                f"{item!r}: shards in a bucket are not read in place yet; copy them to a local folder and pass that."
            )
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(glob.escape(item), "*.tar")))
        else:
            found = []
            for path in _braces(item):
                found += sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
        missing = [p for p in found if not os.path.isfile(p)]
        if missing:
            raise PathNotFoundError(f"The shard {missing[0]!r} (of {item!r}) does not exist.")
        if not found:
            raise PathNotFoundError(f"{item!r} names no .tar shard (a folder of them, a glob or a brace pattern).")
        out += found
    return out


class ShardDataModule(FastDataModule):
    """Train, validate and test from WebDataset tar shards (``<key>.jpg`` + ``<key>.cls`` members), by random access.

    A per-shard index of its members is built once and kept in ``index_dir``; an epoch is a global shuffle of all the
    shards' samples, resumed exactly mid-epoch and on another world size, with sampling and mixes as every module;
    each image goes through the folder module's decode path (the crop decoded alone). Local shards for now.

    Args:
        shards: The training shards: a folder of ``.tar`` files, a glob, a brace pattern
            (``data/train-{000000..000146}.tar``), or a list of them (``expand_shards``).
        val_shards: Validation shards, or ``None`` (then ``val_fraction`` of the training samples, seeded).
        test_shards: Test shards for ``trainer.test``, or ``None``.
        index_dir: Where the shards' indexes are kept (a folder of ours, never the data's); ``None``: the user cache
            (``~/.cache/lightning-fastdata``).
        label_classes: The class names in label order; ``None``: ``classes.json`` beside the first shard (written by
            ``lightning_fastdata.datasets.shard_writer.write_tar_shards``), else the labels as numbers.
        json_label: The label's field in a sample's ``.json`` member (where it has no ``.cls``).
        **kwargs: Augmentation, split, sampling and loader arguments of :class:`FastDataModule`.

    Raises:
        FileNotFoundError: If a shard is missing.
        ValueError: On a shard that cannot be read (truncated, compressed, a sample without a label: named).
    """

    def __init__(
        self,
        shards: str | list[str],
        val_shards: str | list[str] | None = None,
        test_shards: str | list[str] | None = None,
        index_dir: str | None = None,
        label_classes: list[str] | None = None,
        json_label: str = "label",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        save_init_hparams(self)
        self.shard_paths = expand_shards(shards)
        self.val_shard_paths = None if val_shards is None else expand_shards(val_shards)
        self.test_shard_paths = None if test_shards is None else expand_shards(test_shards)
        self.index_dir = os.fspath(index_dir) if index_dir is not None else os.fspath(default_index_dir().parent)
        self.json_label = json_label
        beside = Path(self.shard_paths[0]).parent / "classes.json"
        if label_classes is not None:
            names = [str(c) for c in label_classes]
        elif beside.is_file():
            names = [str(c) for c in json.loads(beside.read_text())]
        else:  # numbers, up to the largest label of the first shard (the others are checked when read)
            first = load_tar_index(self.shard_paths[0], self.index_dir, json_label)  # kept: not indexed again
            names = [str(k) for k in range(int(first.labels.max()) + 1)]
        self.classes = tuple(names)

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.data_classes)

    def _indexes(self, paths: list[str]) -> list[TarIndex]:
        return [load_tar_index(p, self.index_dir, self.json_label) for p in paths]

    @override
    def prepare_data(self) -> None:
        """Index every shard once (one process per node); the ranks then load the kept indexes."""
        for paths in (self.shard_paths, self.val_shard_paths, self.test_shard_paths):
            if paths:
                self._indexes(paths)

    def build_datasets(self) -> tuple[Dataset, Dataset | None]:
        """The training samples and the validation ones (their shards, or a seeded share of the training ones)."""
        train = self._indexes(self.shard_paths)
        classes = self.data_classes
        if self.val_shard_paths is not None:
            val = self._indexes(self.val_shard_paths)
            return (
                TarShardDataset(train, classes, **self.split_kwargs(True)),
                TarShardDataset(val, classes, **self.split_kwargs(False)),
            )
        train_rows, val_rows = self.split(int(sum(len(s) for s in train)))
        return (
            TarShardDataset(train, classes, indices=train_rows, **self.split_kwargs(True)),
            None if val_rows is None else TarShardDataset(train, classes, indices=val_rows, **self.split_kwargs(False)),
        )

    test_argument = "test_shards"

    @override
    def build_test_dataset(self) -> Dataset | None:
        """``test_shards``' samples with the validation transforms (``None`` without ``test_shards``)."""
        if self.test_shard_paths is None:
            return None
        return TarShardDataset(self._indexes(self.test_shard_paths), self.data_classes, **self.split_kwargs(False))
