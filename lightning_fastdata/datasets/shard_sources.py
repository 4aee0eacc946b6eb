"""The samples of shards as a file list and a storage: what the entropy index's builder reads.

The entropy index (:mod:`~lightning_fastdata.loading.jpeg.entropy_index`) is built from a
:class:`~lightning_fastdata.loading.index.files.FileIndex` read through a
:class:`~lightning_fastdata.loading.storage.base.Storage`. For shards, :func:`shard_file_index` lists every sample
of the shards (tar members or Parquet rows, numbered shard after shard) under a root named by the shards and their
versions, so a shard rewritten since gives another list (the index is rebuilt, never misapplied), and
:class:`ShardSources` reads those samples' bytes through the shard dataset's own reads (local, or ranged requests in
a bucket). Each sample's entry is then keyed by its number: the dataset asks for the entry of its sample's number.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lightning_fastdata.errors import InvalidValueError
from lightning_fastdata.loading.index.files import FileIndex
from lightning_fastdata.loading.storage.base import is_url

__all__ = ["UNLABELLED", "ShardEntropy", "ShardSources", "shard_file_index", "shard_targets"]

#: A sample's label where its format says "no label" (the hubs' ``ClassLabel`` -1): never a class.
UNLABELLED = -(2**62)


def shard_file_index(paths: Sequence[str], sizes: Sequence[int], versions: Sequence[int], count: int) -> FileIndex:
    """Every sample of the shards ``paths`` (``count`` in all) as a file list: relative paths ``0, 1, ...``.

    Its root names the shards, their sizes and versions (never a folder we write to).
    """
    digest = hashlib.sha256("|".join(f"{p}:{s}:{v}" for p, s, v in zip(paths, sizes, versions)).encode()).hexdigest()
    first = paths[0]
    folder = first.rsplit("/", 1)[0] if is_url(first) else os.path.dirname(os.path.abspath(first))
    return FileIndex.of_paths(f"{folder}/.shards-{digest[:16]}", [str(k) for k in range(count)])


class ShardSources:
    """A storage over a shard dataset's samples, by number (:func:`shard_file_index`'s relative paths).

    Args:
        dataset: A :class:`~lightning_fastdata.datasets.shards.TarShardDataset` or
            :class:`~lightning_fastdata.datasets.parquet_shards.ParquetShardDataset` holding every sample (no split).
    """

    remote = False

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def read_many(self, relpaths: Sequence[str], *_: Any, **__: Any) -> Iterator[bytes | OSError]:
        """Each sample's encoded bytes (an ``OSError`` where a read fails), in order."""
        rows = np.array([int(r) for r in relpaths], dtype=np.int64)
        yield from self.dataset.read_sources(rows)

    def url(self, relpath: str) -> str:
        """What sample ``relpath`` is: ``shard.tar:key`` or ``file.parquet:row N``."""
        return str(self.dataset.describe(int(relpath)))


class ShardEntropy:
    """A shard dataset's entropy indexes: each sample's entry by its number among all the shards' samples.

    Attributes:
        entropy_indexes: The indexes of :func:`shard_file_index`'s list (an ``EntropyIndexes`` or a
            ``PendingEntropyIndex``), or ``None``.
    """

    entropy_indexes: Any = None
    _rows: np.ndarray

    def entropy_index_of(self, index: int) -> bytes | None:
        """Sample ``index``'s entropy index, if one was built."""
        return None if self.entropy_indexes is None else self.entropy_indexes.get(int(self._rows[index]))


def shard_targets(targets: np.ndarray, classes: Sequence[str], labelled: bool, describe: Any) -> np.ndarray:
    """A shard dataset's labels, each checked to be a position in ``classes``.

    With ``labelled=False`` (samples to predict on): each sample's position, which a prediction batch carries instead.

    Raises:
        ValueError: For a sample with no label (:data:`UNLABELLED`) or a label outside ``classes``, naming its sample
            (``describe(i)``); ``-1`` is a class name the list lacks.
    """
    targets = np.asarray(targets, dtype=np.int64)
    if not labelled:
        return np.arange(len(targets), dtype=np.int64)
    none = np.flatnonzero(targets == UNLABELLED)
    if none.size:
        raise InvalidValueError(
            f'{describe(int(none[0]))}: {none.size} rows have no label (-1, the hubs\' "no label", as their test '
            "splits ship); a split without labels cannot be trained or evaluated on: predict on it instead "
            "(predict_root=), or give its rows labels."
        )
    bad = np.flatnonzero((targets < 0) | (targets >= len(classes)))
    if bad.size:
        raise InvalidValueError(
            f"{describe(int(bad[0]))} has label {int(targets[bad[0]])}, outside the {len(classes)} classes "
            f"{list(classes)[:5]} (-1: a class name they lack); give every class a name (class_names=)."
        )
    return targets
